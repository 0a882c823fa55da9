//! Memory estimates for a mini-batch, used by the embed job to size batches before it runs
//! them, and by the optional memory cap that makes `embed` fail with `OutOfMemory` early.
//!
//! The estimate is an upper bound of the peak, deliberately simple: weights, plus the
//! activations that are alive together inside one layer for all `T` packed tokens, plus the
//! attention workspace of one tile (tiles run one after another, so it does not grow with
//! the number of tiles or sequences).

use crate::config::Config;

/// Bytes needed by one forward pass, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryEstimate {
    /// The parameters in the model dtype.
    pub weights: u64,
    /// Hidden states, projections and MLP intermediates of all tokens inside one layer.
    pub activations: u64,
    /// Scores, probabilities and accumulators of one attention tile.
    pub attention: u64,
}

impl MemoryEstimate {
    /// Everything together.
    pub fn total(&self) -> u64 {
        self.weights + self.activations + self.attention
    }
}

/// Estimates the peak memory of embedding sequences of lengths `seq_lens` at once.
///
/// `dtype_bytes` is 4 for f32 (CPU) and 2 for bf16 (CUDA); `tile` is the attention tile.
pub fn estimate_memory(
    cfg: &Config,
    dtype_bytes: u64,
    seq_lens: &[usize],
    tile: usize,
) -> MemoryEstimate {
    let b = dtype_bytes;
    let t: u64 = seq_lens.iter().map(|&l| l as u64).sum();
    let longest = seq_lens.iter().copied().max().unwrap_or(0);
    let h = cfg.hidden_size as u64;
    let hd = cfg.head_dim() as u64;
    let q = cfg.num_attention_heads as u64 * hd;
    let kv = cfg.num_key_value_heads as u64 * hd;
    let i = cfg.intermediate_size as u64;
    // Residual, normed input and layer output (3H); q projected (in the one q/k/v product),
    // normed, rotated and the attention output (4q); k and v projected, normed, rotated, v
    // made contiguous, and the head-major copies of the blockwise path (6kv); the MLP's
    // gate/up product (2I), activated gate and product (4I in all). Plus the gathered rotary
    // rows (hd per token).
    let per_token = 3 * h + 4 * q + 6 * kv + 4 * i + hd;
    let activations = t * per_token * b;
    let tile = tile.min(longest).max(1) as u64;
    let heads = cfg.num_attention_heads as u64;
    // Per tile, in f32: scores, exp'd scores, their dtype copy (≤ 3 score-sized buffers),
    // the mask, and the accumulator, its update and the output (3 × heads × tile × hd).
    let attention = if t == 0 {
        0
    } else {
        (3 * heads * tile * tile + tile * tile + 3 * heads * tile * hd) * 4
    };
    // The rotary table kept on the device: cos and sin, head_dim / 2 each, per position.
    let rotary_table = cfg.max_position_embeddings as u64 * hd * b;
    MemoryEstimate {
        weights: cfg.num_parameters() * b + rotary_table,
        activations,
        attention,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_workspace_is_bounded_by_the_tile() {
        let cfg = Config::qwen3_0_6b();
        let short = estimate_memory(&cfg, 2, &[4096], 1024);
        let long = estimate_memory(&cfg, 2, &[32_768], 1024);
        assert_eq!(short.attention, long.attention);
        assert_eq!(long.activations, 8 * short.activations);
        // A 32k-token paper needs far less than one full L×L f32 score matrix per head.
        assert!(long.attention < 32_768u64 * 32_768 * 4);
        assert_eq!(estimate_memory(&cfg, 2, &[], 1024).activations, 0);
    }
}
