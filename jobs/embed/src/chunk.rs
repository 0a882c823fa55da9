//! Papers longer than the model's context are never cut: they are split into chunks that each
//! fit, each framed by the model's special tokens (`… <|endoftext|>`, `[CLS] … [SEP]`), so each
//! is pooled like a whole document, and the chunk vectors are combined by a mean weighted by
//! chunk length, then L2-normalised. A document prompt (`passage: `) is tokenised with the text
//! in the first chunk and opens every later one too (its own ids, `continuation`), so each chunk
//! is read as the model was trained to read a document.

use embedfleet_models::Framing;

/// Splits a paper's tokens (without special tokens) into framed sequences of at most `max_len`
/// tokens, the framing included; every chunk after the first opens with `continuation` (the
/// document prompt's ids; left out where it leaves no room). One sequence when it fits.
pub fn split(
    tokens: &[u32],
    framing: &Framing,
    max_len: usize,
    continuation: &[u32],
) -> Vec<Vec<u32>> {
    let first = max_len.saturating_sub(framing.overhead()).max(1);
    if tokens.len() <= first {
        return vec![framing.wrap(tokens)];
    }
    let continuation = if framing.overhead() + continuation.len() < max_len {
        continuation
    } else {
        &[]
    };
    let later = max_len - framing.overhead() - continuation.len();
    let mut chunks = vec![framing.wrap(&tokens[..first])];
    for piece in tokens[first..].chunks(later.max(1)) {
        chunks.push(framing.wrap(&[continuation, piece].concat()));
    }
    chunks
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

    fn eos(id: u32) -> Framing {
        Framing {
            prefix: vec![],
            suffix: vec![id],
        }
    }

    #[test]
    fn split_keeps_every_token_and_ends_each_chunk_with_eos() {
        let tokens: Vec<u32> = (1..=10).collect();
        let chunks = split(&tokens, &eos(0), 4, &[]);
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
            split(&tokens, &eos(0), 11, &[]),
            vec![[tokens.clone(), vec![0]].concat()]
        );
    }

    #[test]
    fn split_frames_each_chunk_with_the_models_specials_within_max_len() {
        let bert = Framing {
            prefix: vec![101],
            suffix: vec![102],
        };
        let tokens: Vec<u32> = (1..=5).collect();
        assert_eq!(
            split(&tokens, &bert, 4, &[]),
            vec![
                vec![101, 1, 2, 102],
                vec![101, 3, 4, 102],
                vec![101, 5, 102]
            ]
        );
        assert_eq!(split(&[], &bert, 4, &[]), vec![vec![101, 102]]);
    }

    #[test]
    fn a_document_prompt_opens_every_chunk_after_the_first() {
        let bert = Framing {
            prefix: vec![101],
            suffix: vec![102],
        };
        // The first chunk's tokens already begin with the prompt (7, 8), tokenised with the text.
        let tokens = [7, 8, 1, 2, 3, 4, 5];
        assert_eq!(
            split(&tokens, &bert, 6, &[7, 8]),
            vec![
                vec![101, 7, 8, 1, 2, 102],
                vec![101, 7, 8, 3, 4, 102],
                vec![101, 7, 8, 5, 102]
            ]
        );
        // No room for the prompt: later chunks go without it rather than over max_len.
        assert_eq!(
            split(&tokens, &bert, 4, &[7, 8]),
            vec![
                vec![101, 7, 8, 102],
                vec![101, 1, 2, 102],
                vec![101, 3, 4, 102],
                vec![101, 5, 102]
            ]
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
