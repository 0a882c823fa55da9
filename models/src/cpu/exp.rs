//! `exp` for the softmax and SiLU, branch-free so that a loop over a row vectorises (libm's
//! `expf` is a call per element: a third of the CPU forward's time at long lengths went there).
//!
//! `exp(x) = 2^n · e^r` with `n = round(x·log2 e)` and `r = x − n·ln 2` in [−½ ln 2, ½ ln 2]
//! (Cody and Waite's reduction: `ln 2` in two parts, the first exact in few bits, so that
//! `n·ln 2` loses nothing); `e^r` by its Taylor polynomial to degree 6 (relative error under
//! 2e-7 there, about one f32 ulp); `2^n` by building the float's exponent bits. Below −87.3
//! the result is 0 (a masked score's `−inf` included), above 88 it saturates at `exp(88)`
//! (1.65e38: a softmax's scores are at most 0 once its max is taken off, and SiLU's
//! `1 + exp(−x)` is then as good as infinite).

/// log2(e).
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 as a part exact in 16 bits and the rest (Cephes' split).
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// Below this, exp underflows f32's normal range: 0.
const LOWEST: f32 = -87.33;
/// Above this (where `n` would reach 128, past the exponent's range) it saturates.
const HIGHEST: f32 = 88.0;

/// `e^x` (see the module docs).
#[inline(always)]
pub(crate) fn exp<const FMA: bool>(x: f32) -> f32 {
    use super::fmadd;
    let clamped = x.clamp(LOWEST, HIGHEST);
    let n = (clamped * LOG2E).round_ties_even();
    let r = fmadd::<FMA>(n, -LN2_HI, clamped);
    let r = fmadd::<FMA>(n, -LN2_LO, r);
    // 1 + r + r²/2! + ... + r⁶/6!, by Horner.
    let mut p = 1.0 / 720.0;
    p = fmadd::<FMA>(p, r, 1.0 / 120.0);
    p = fmadd::<FMA>(p, r, 1.0 / 24.0);
    p = fmadd::<FMA>(p, r, 1.0 / 6.0);
    p = fmadd::<FMA>(p, r, 0.5);
    p = fmadd::<FMA>(p, r, 1.0);
    p = fmadd::<FMA>(p, r, 1.0);
    // 2^n: n in [-126, 127] here.
    let scale = f32::from_bits(((n as i32 + 127).clamp(1, 254) as u32) << 23);
    let e = p * scale;
    if x < LOWEST {
        0.0
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulps_of_libm_and_zero_below_its_range() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            for fma in [false, true] {
                let got = if fma { exp::<true>(x) } else { exp::<false>(x) };
                let want = x.exp();
                let rel = ((got - want) / want).abs();
                worst = worst.max(rel);
            }
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp::<true>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp::<false>(-100.0), 0.0);
        assert_eq!(exp::<true>(0.0), 1.0);
        assert!(exp::<true>(1000.0).is_finite());
    }
}
