//! Qwen3's memory model: the estimate of a mini-batch's forward, used by the embed job to size
//! batches before it runs them, and by the optional memory cap that makes `embed` fail with
//! `OutOfMemory` early; and the token budget planned from a device's free memory.
//!
//! The estimate is an upper bound of the peak, deliberately simple: weights, plus the
//! activations that are alive together inside one layer for all `T` packed tokens, plus the
//! attention workspace of one tile (tiles run one after another, so it does not grow with
//! the number of tiles or sequences).

use super::config::Config;
use crate::memory::{most_tokens_that_fit, MemoryEstimate, FREE_MEMORY_SHARE};

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

/// The most tokens one forward may hold, whatever the memory: the largest tensor of a layer
/// (the gate/up product, `T × 2I`, or q/k/v, `T × (heads + 2 kv heads) × head_dim`) must stay
/// under candle's u32 element counts.
pub fn max_tokens_per_forward(cfg: &Config) -> u64 {
    let hd = cfg.head_dim() as u64;
    let widest = (2 * cfg.intermediate_size as u64)
        .max((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) as u64 * hd)
        .max(cfg.hidden_size as u64);
    u32::MAX as u64 / widest
}

/// `Err` (saying why) when one forward of `tokens` tokens would exceed
/// [`max_tokens_per_forward`].
pub fn check_tokens_per_forward(cfg: &Config, tokens: u64) -> Result<(), String> {
    let most = max_tokens_per_forward(cfg);
    if tokens > most {
        return Err(format!(
            "{tokens} tokens in one forward, more than the {most} whose largest tensor candle's \
             u32 element counts can index"
        ));
    }
    Ok(())
}

/// The token budget of a mini-batch on a device with `free` bytes left after loading: the
/// most tokens whose activations and attention workspace (the estimate less the weights,
/// which are already in place) fit in [`FREE_MEMORY_SHARE`] of it, capped by
/// [`max_tokens_per_forward`]. At least one token.
pub fn token_budget(cfg: &Config, dtype_bytes: u64, tile: usize, free: u64) -> u64 {
    let usable = (free as f64 * FREE_MEMORY_SHARE) as u64;
    let cap = max_tokens_per_forward(cfg);
    // The estimate is monotone in T: search the largest T that fits.
    let fits = |t: u64| {
        let e = estimate_memory(cfg, dtype_bytes, &[t as usize], tile);
        e.activations + e.attention <= usable
    };
    most_tokens_that_fit(cap, fits)
}

#[cfg(test)]
mod budget_tests {
    use super::*;
    use crate::memory::share_of_free;

    #[test]
    fn the_budget_is_the_most_tokens_that_fit_in_the_free_memory() {
        let cfg = Config::qwen3_4b();
        let gib = 1u64 << 30;
        // A 40 GB A100 after the 4B model's ~8 GB of bf16 weights, and an H200's 141 GB.
        for free in [32 * gib, 133 * gib, 2 * gib] {
            let t = token_budget(&cfg, 2, 512, free);
            let usable = (free as f64 * FREE_MEMORY_SHARE) as u64;
            let at = |t: u64| {
                let e = estimate_memory(&cfg, 2, &[t as usize], 512);
                e.activations + e.attention
            };
            assert!(at(t) <= usable, "{t} tokens fit in {free}");
            assert!(
                t == max_tokens_per_forward(&cfg) || at(t + 1) > usable,
                "{t} is the most"
            );
        }
        // More memory, more tokens, up to the element-count cap.
        assert!(token_budget(&cfg, 2, 512, 32 * gib) > token_budget(&cfg, 2, 512, 2 * gib));
        assert_eq!(
            token_budget(&cfg, 2, 512, 1 << 50),
            max_tokens_per_forward(&cfg)
        );
        // The gate/up product of the 4B shape is 2 × 9,728 wide: ~220k tokens at most.
        assert_eq!(max_tokens_per_forward(&cfg), u32::MAX as u64 / (2 * 9728));
        assert_eq!(token_budget(&cfg, 2, 512, 0), 1);
        let most = max_tokens_per_forward(&cfg);
        assert!(check_tokens_per_forward(&cfg, most).is_ok());
        let err = check_tokens_per_forward(&cfg, most + 1).unwrap_err();
        assert!(err.contains("u32"), "{err}");
    }

    #[test]
    fn workers_sharing_a_device_plan_budgets_that_fit_together() {
        let cfg = Config::qwen3_4b();
        let gib = 1u64 << 30;
        // A 40 GB A100 after the weights: alone, a worker's budget is most of the free memory,
        // so two workers planning with all of it would need nearly twice what is there.
        let free = 31 * gib;
        let at = |t: u64| {
            let e = estimate_memory(&cfg, 2, &[t as usize], 512);
            e.activations + e.attention
        };
        let alone = token_budget(&cfg, 2, 512, share_of_free(free, 1));
        assert!(2 * at(alone) > free, "two full budgets do not fit");
        for workers in [2usize, 3, 4] {
            let each = token_budget(&cfg, 2, 512, share_of_free(free, workers));
            assert!(each < alone);
            assert!(
                workers as u64 * at(each) <= free,
                "{workers} workers' forwards fit together"
            );
        }
        assert_eq!(share_of_free(free, 0), free);
    }
}
