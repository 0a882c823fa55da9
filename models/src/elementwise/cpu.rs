//! The arithmetic of the kernels, on the CPU: f32 inside, rounded to `T` where they round.

use candle_core::WithDType;

fn round<T: WithDType>(v: f32) -> f32 {
    T::from_f64(v as f64).to_f64() as f32
}

/// `gate_up` is `rows × 2·inter` row-major; returns `rows × inter`.
pub fn swiglu<T: WithDType>(gate_up: &[T], inter: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(gate_up.len() / 2);
    for row in gate_up.chunks_exact(2 * inter) {
        let (gate, up) = row.split_at(inter);
        for (g, u) in gate.iter().zip(up) {
            let g = g.to_f64() as f32;
            let act = round::<T>(g / (1.0 + (-g).exp()));
            out.push(T::from_f64((act * u.to_f64() as f32) as f64));
        }
    }
    out
}

/// `x`, `h`: `rows × hidden`, `w`: `hidden`; returns the sums then the normed rows.
pub fn add_rms_norm<T: WithDType>(x: &[T], h: &[T], w: &[T], eps: f32) -> Vec<T> {
    let hidden = w.len();
    let mut sums = Vec::with_capacity(x.len());
    let mut normed = Vec::with_capacity(x.len());
    for (xr, hr) in x.chunks_exact(hidden).zip(h.chunks_exact(hidden)) {
        let start = sums.len();
        let mut squares = 0f32;
        for (a, b) in xr.iter().zip(hr) {
            let s = round::<T>(a.to_f64() as f32 + b.to_f64() as f32);
            squares += s * s;
            sums.push(T::from_f64(s as f64));
        }
        let inv = 1.0 / (squares / hidden as f32 + eps).sqrt();
        for (s, wv) in sums[start..].iter().zip(w) {
            let v = s.to_f64() as f32 * inv * wv.to_f64() as f32;
            normed.push(T::from_f64(v as f64));
        }
    }
    sums.extend(normed);
    sums
}

/// `qkv`: `tokens × row_heads × hd`; `cos`, `sin`: `rows × hd/2` (at least `tokens` rows);
/// returns `rows × heads × hd`, heads `first..first + heads` normed and rotated, zeros past
/// `tokens`.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope<T: WithDType>(
    qkv: &[T],
    row_heads: usize,
    first: usize,
    heads: usize,
    w: &[T],
    eps: f32,
    cos: &[T],
    sin: &[T],
    rows: usize,
) -> Vec<T> {
    let hd = w.len();
    let half = hd / 2;
    let tokens = qkv.len() / (row_heads * hd);
    let mut out = vec![T::zero(); rows * heads * hd];
    for t in 0..tokens {
        for h in 0..heads {
            let src = &qkv[(t * row_heads + first + h) * hd..][..hd];
            let f = |v: &T| v.to_f64() as f32;
            let squares: f32 = src.iter().map(|v| f(v) * f(v)).sum();
            let inv = 1.0 / (squares / hd as f32 + eps).sqrt();
            let dst = &mut out[(t * heads + h) * hd..][..hd];
            for i in 0..half {
                let a = round::<T>(f(&src[i]) * inv * f(&w[i]));
                let b = round::<T>(f(&src[i + half]) * inv * f(&w[i + half]));
                let (c, s) = (f(&cos[t * half + i]), f(&sin[t * half + i]));
                dst[i] = T::from_f64((a * c - b * s) as f64);
                dst[i + half] = T::from_f64((a * s + b * c) as f64);
            }
        }
    }
    out
}
