use super::*;

/// A small deterministic generator (no dependency): values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Naive softmax(scale·q·kᵀ + mask)·v per head and token, in f64.
fn reference(
    q: &Rows<'_>,
    k: &Rows<'_>,
    v: &Rows<'_>,
    spans: &[SeqSpan],
    heads: Heads,
    scale: f32,
    mask: Mask,
) -> Vec<f32> {
    let Heads {
        n_heads,
        n_kv,
        head_dim: hd,
    } = heads;
    let total: usize = spans.iter().map(|s| s.len).sum();
    let mut out = vec![0f32; total * n_heads * hd];
    for span in spans {
        for h in 0..n_heads {
            let kv = h / (n_heads / n_kv);
            for i in 0..span.len {
                let qi = q.head(span.start + i, h, hd);
                let seen: Vec<usize> = (0..span.len).filter(|&j| mask.sees(i, j)).collect();
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&j| {
                        let kj = k.head(span.start + j, kv, hd);
                        scale as f64
                            * qi.iter()
                                .zip(kj)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = w.iter().sum();
                let dst = &mut out[((span.start + i) * n_heads + h) * hd..][..hd];
                for (wj, &j) in w.iter().zip(&seen) {
                    let vj = v.head(span.start + j, kv, hd);
                    for (o, x) in dst.iter_mut().zip(vj) {
                        *o += (wj / z * *x as f64) as f32;
                    }
                }
            }
        }
    }
    out
}

fn simds() -> Vec<Simd> {
    let best = Simd::detect();
    let mut all = vec![Simd::Plain];
    if matches!(best, Simd::Avx2 | Simd::Avx512) {
        all.push(Simd::Avx2);
    }
    if best == Simd::Avx512 {
        all.push(Simd::Avx512);
    }
    all
}

#[test]
fn tiled_attention_matches_a_naive_softmax_for_every_mask_shape_and_instruction_set() {
    let lens = [1usize, 7, 33, 64, 65, 130];
    let total: usize = lens.iter().sum();
    let mut spans = Vec::new();
    let mut start = 0;
    for len in lens {
        spans.push(SeqSpan { start, len });
        start += len;
    }
    for (n_heads, n_kv, hd) in [(6, 2, 32), (4, 4, 64), (2, 1, 128), (3, 1, 48)] {
        let heads = Heads {
            n_heads,
            n_kv,
            head_dim: hd,
        };
        // q, k and v as the projections give them: one `[T, heads, hd]` buffer, token-major.
        let row = (n_heads + 2 * n_kv) * hd;
        let qkv = values(total * row, (n_heads * hd) as u64);
        let rows = |offset: usize| Rows {
            data: &qkv,
            offset,
            stride: row,
        };
        let (q, k, v) = (rows(0), rows(n_heads * hd), rows((n_heads + n_kv) * hd));
        let scale = 1.0 / (hd as f32).sqrt() * 3.0;
        for mask in [
            Mask::Causal,
            Mask::Full,
            Mask::Window { left: 5, right: 5 },
            Mask::Window { left: 40, right: 0 },
        ] {
            let want = reference(&q, &k, &v, &spans, heads, scale, mask);
            for simd in simds() {
                let mut got = vec![f32::NAN; want.len()];
                attention(simd, q, k, v, &spans, heads, scale, mask, &mut got);
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst < 2e-5,
                    "{heads:?} {mask:?} {}: max difference {worst}",
                    simd.name()
                );
            }
        }
    }
}
