//! Papers longer than the model's context are never cut: they are split into chunks that each
//! fit (each ending in `<|endoftext|>`, so each is pooled like a whole document), and the chunk
//! vectors are combined by a mean weighted by chunk length, then L2-normalised.

/// Splits a paper's tokens (without EOS) into sequences of at most `max_len` tokens, EOS
/// included. One sequence when it fits.
pub fn split(tokens: &[u32], eos: u32, max_len: usize) -> Vec<Vec<u32>> {
    let body = max_len.saturating_sub(1).max(1);
    if tokens.is_empty() {
        return vec![vec![eos]];
    }
    tokens
        .chunks(body)
        .map(|c| {
            let mut seq = Vec::with_capacity(c.len() + 1);
            seq.extend_from_slice(c);
            seq.push(eos);
            seq
        })
        .collect()
}

/// The length-weighted mean of chunk vectors, L2-normalised. `weights` are the chunks' token
/// counts.
pub fn combine(vectors: &[Vec<f32>], weights: &[usize]) -> Vec<f32> {
    assert_eq!(
        vectors.len(),
        weights.len(),
        "one weight per chunk. This is a bug."
    );
    if vectors.len() == 1 {
        return vectors[0].clone();
    }
    let dim = vectors[0].len();
    let mut sum = vec![0f64; dim];
    for (v, &w) in vectors.iter().zip(weights) {
        for (s, &x) in sum.iter_mut().zip(v) {
            *s += w as f64 * x as f64;
        }
    }
    let norm = sum.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
    sum.iter().map(|x| (x / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_every_token_and_ends_each_chunk_with_eos() {
        let tokens: Vec<u32> = (1..=10).collect();
        let chunks = split(&tokens, 0, 4);
        assert_eq!(
            chunks,
            vec![
                vec![1, 2, 3, 0],
                vec![4, 5, 6, 0],
                vec![7, 8, 9, 0],
                vec![10, 0]
            ]
        );
        assert_eq!(
            split(&tokens, 0, 11),
            vec![[tokens.clone(), vec![0]].concat()]
        );
    }

    #[test]
    fn combine_weights_by_length_and_normalises() {
        let v = combine(&[vec![1.0, 0.0], vec![0.0, 1.0]], &[3, 1]);
        let norm = (v[0] * v[0] + v[1] * v[1]).sqrt();
        assert!((norm - 1.0).abs() < 1e-6);
        assert!((v[0] / v[1] - 3.0).abs() < 1e-5, "{v:?}");
    }
}
