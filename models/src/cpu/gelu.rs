//! GeGLU on the CPU, f32: `gelu(gate) · up` per row of a gate/up product, one vectorised pass
//! per row, rows split over rayon's pool. candle's `gelu` and `gelu_erf` are scalar maps over
//! libm's `tanhf` and `erf` on one thread: 14 % of EmbeddingGemma's CPU forward (samples, while
//! the other cores waited) went to `tanhf`/`expm1f`.
//!
//! Both GELUs are written over the polynomial [`exp`]:
//! - the tanh approximation (transformers' `gelu_pytorch_tanh`, candle's `gelu`):
//!   `½x(1 + tanh z)`, `z = √(2/π)(x + 0.044715x³)`, computed as `x / (1 + e^{−2z})` (the same:
//!   `1 + tanh z = 2σ(2z)`), which never subtracts two near numbers: in the negative tail,
//!   `1 + tanh z` as written loses its digits to cancellation (f32's, PyTorch's included);
//! - the exact one (`gelu`, candle's `gelu_erf`): `½x(1 + erf(x/√2))`, with `1 + erf y` taken as
//!   `erfc |y|` for `y < 0` and `2 − erfc y` otherwise (no cancellation in the negative tail
//!   either), `erfc` by the Chebyshev fit of Press et al. (relative error under 1.2e-7).

use super::exp::exp;
use super::rows::map_rows;
use super::{fmadd, simd_kernel, Simd};

/// Which GELU a gated MLP applies to its gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gelu {
    /// The tanh approximation (`gelu_pytorch_tanh`, `gelu_new`).
    Tanh,
    /// The exact GELU, through erf (`gelu`).
    Erf,
}

/// `gelu(gate) · up` per row of `gate_up` (`rows × 2·inter`, gate then up): `rows × inter`.
pub fn geglu(gate_up: &[f32], inter: usize, gelu: Gelu) -> Vec<f32> {
    let simd = Simd::detect();
    map_rows(gate_up, 2 * inter, inter, |gu, o| match gelu {
        Gelu::Tanh => geglu_tanh_row(simd, gu, o),
        Gelu::Erf => geglu_erf_row(simd, gu, o),
    })
}

/// `gelu(h + bias)` per row of `h` (`rows × bias.len()`): BERT's intermediate step.
pub fn bias_gelu(h: &[f32], bias: &[f32], gelu: Gelu) -> Vec<f32> {
    let simd = Simd::detect();
    map_rows(h, bias.len(), bias.len(), |row, o| match gelu {
        Gelu::Tanh => bias_gelu_tanh_row(simd, row, bias, o),
        Gelu::Erf => bias_gelu_erf_row(simd, row, bias, o),
    })
}

simd_kernel! {
    fn bias_gelu_tanh_row<const FMA: bool>(row: &[f32], bias: &[f32], out: &mut [f32]) {
        for ((o, h), b) in out.iter_mut().zip(row).zip(bias) {
            *o = gelu_tanh::<FMA>(*h + *b);
        }
    }
}

simd_kernel! {
    fn bias_gelu_erf_row<const FMA: bool>(row: &[f32], bias: &[f32], out: &mut [f32]) {
        for ((o, h), b) in out.iter_mut().zip(row).zip(bias) {
            *o = gelu_erf::<FMA>(*h + *b);
        }
    }
}

/// √(2/π).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

simd_kernel! {
    fn geglu_tanh_row<const FMA: bool>(gate_up: &[f32], out: &mut [f32]) {
        let (gate, up) = gate_up.split_at(out.len());
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = gelu_tanh::<FMA>(*g) * *u;
        }
    }
}

simd_kernel! {
    fn geglu_erf_row<const FMA: bool>(gate_up: &[f32], out: &mut [f32]) {
        let (gate, up) = gate_up.split_at(out.len());
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = gelu_erf::<FMA>(*g) * *u;
        }
    }
}

/// `½x(1 + tanh(√(2/π)(x + 0.044715x³)))` as `x / (1 + e^{−2z})`.
#[inline(always)]
fn gelu_tanh<const FMA: bool>(x: f32) -> f32 {
    let z = SQRT_2_OVER_PI * fmadd::<FMA>(0.044_715 * x * x, x, x);
    x / (1.0 + exp::<FMA>(-2.0 * z))
}

/// `½x(1 + erf(x/√2))`.
#[inline(always)]
fn gelu_erf<const FMA: bool>(x: f32) -> f32 {
    let y = x * std::f32::consts::FRAC_1_SQRT_2;
    let tail = erfc_abs::<FMA>(y);
    let one_plus_erf = if y < 0.0 { tail } else { 2.0 - tail };
    0.5 * x * one_plus_erf
}

/// `erfc |y|` by the Chebyshev fit of Press et al. (Numerical Recipes' `erfcc`): `t·e^{−a² +
/// P(t)}`, `t = 2/(2 + a)`, `a = |y|`, relative error under 1.2e-7 everywhere (both tails: the
/// GELU of a negative input is this value times `½x`).
#[inline(always)]
fn erfc_abs<const FMA: bool>(y: f32) -> f32 {
    const C: [f32; 10] = [
        -1.265_512_2,
        1.000_023_7,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_204,
        1.488_515_9,
        -0.822_152_23,
        0.170_872_77,
    ];
    let a = y.abs();
    let t = 2.0 / (2.0 + a);
    let mut poly = C[9];
    for c in C[..9].iter().rev() {
        poly = fmadd::<FMA>(poly, t, *c);
    }
    t * exp::<FMA>(fmadd::<FMA>(-a, a, poly))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        // -12 to 12, through 0, in uneven steps: both tails and the middle.
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) % 24_001) as f32 / 1000.0 - 12.0)
            .chain([0.0, -0.0, 1e-6, -1e-6, 60.0, -60.0])
            .collect()
    }

    /// The reference: candle's scalar formulas over libm (what the ops replaced compute).
    fn reference(x: f32, gelu: Gelu) -> f32 {
        let x = x as f64;
        let g = match gelu {
            Gelu::Tanh => {
                0.5 * x
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
            }
            Gelu::Erf => 0.5 * x * (1.0 + erf_f64(x / std::f64::consts::SQRT_2)),
        };
        g as f32
    }

    /// erf in f64 by its series and continued fraction (libm's accuracy, for the test only).
    fn erf_f64(x: f64) -> f64 {
        if x.abs() < 3.0 {
            // Maclaurin series: 2/√π Σ (−1)ⁿ x^{2n+1} / (n! (2n+1)).
            let (mut sum, mut term, mut n) = (0.0f64, x, 0.0f64);
            while term.abs() > 1e-17 * sum.abs().max(1e-300) || n < 3.0 {
                sum += term / (2.0 * n + 1.0);
                n += 1.0;
                term *= -x * x / n;
                if n > 200.0 {
                    break;
                }
            }
            2.0 / std::f64::consts::PI.sqrt() * sum
        } else {
            // erfc's continued fraction, 60 terms from the back.
            let a = x.abs();
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (a + f);
            }
            let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
            (1.0 - erfc).copysign(x)
        }
    }

    /// Each GELU, each instruction set, within 4e-7 of its size (plus 1e-7 of `|x|`: near the
    /// GELU's zero crossing its size says nothing) of the f64 formula, times the row of `up`.
    #[test]
    fn both_gelus_match_their_formulas_on_every_instruction_set() {
        let gate = values(4000);
        let inter = gate.len();
        let up: Vec<f32> = (0..inter).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let gate_up: Vec<f32> = gate.iter().chain(&up).copied().collect();
        for gelu in [Gelu::Tanh, Gelu::Erf] {
            for simd in [Simd::Plain, Simd::detect()] {
                let mut out = vec![0f32; inter];
                match gelu {
                    Gelu::Tanh => geglu_tanh_row(simd, &gate_up, &mut out),
                    Gelu::Erf => geglu_erf_row(simd, &gate_up, &mut out),
                }
                for ((o, g), u) in out.iter().zip(&gate).zip(&up) {
                    let want = reference(*g, gelu) * u;
                    assert!(
                        (o - want).abs() <= 4e-7 * want.abs() + 1e-7 * g.abs() * u,
                        "{gelu:?} {simd:?} at {g}: {o} against {want}"
                    );
                }
            }
        }
        // The rows of a batch are the rows one by one.
        let two: Vec<f32> = gate_up.iter().chain(&gate_up).copied().collect();
        let both = geglu(&two, inter, Gelu::Erf);
        assert_eq!(&both[..inter], &both[inter..]);
        // gelu(h + bias): the same GELU of the sum, per row.
        let bias: Vec<f32> = (0..inter).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        for gelu in [Gelu::Tanh, Gelu::Erf] {
            let out = bias_gelu(&[gate.clone(), gate.clone()].concat(), &bias, gelu);
            for (i, o) in out.iter().enumerate() {
                let x = gate[i % inter] + bias[i % inter];
                let want = reference(x, gelu);
                assert!(
                    (o - want).abs() <= 4e-7 * want.abs() + 1e-7 * x.abs(),
                    "{gelu:?} bias at {x}: {o} against {want}"
                );
            }
        }
    }
}
