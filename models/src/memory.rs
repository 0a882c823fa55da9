//! What every family's memory model shares: the parts of an estimate, the share of a device's
//! free memory a mini-batch may plan with, and the search for the most tokens that fit.
//!
//! A family's own estimate of a forward (Qwen3's: `qwen3/memory.rs`) sizes mini-batches before
//! they run, and drives the optional memory cap that makes `embed` fail with `OutOfMemory`
//! early.

use crate::error::{ModelError, ModelResult};

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

/// The memory cap's verdict on a forward over sequences of `lens` (`u64::MAX`: no cap):
/// [`ModelError::OutOfMemory`] when its estimate `needed` is over `limit`, so the caller halves
/// the batch as it would for a real one. The estimate is made only under a cap.
pub fn check_cap(
    limit: u64,
    lens: &[usize],
    needed: impl FnOnce(&[usize]) -> u64,
) -> ModelResult<()> {
    if limit == u64::MAX {
        return Ok(());
    }
    let needed = needed(lens);
    if needed > limit {
        return Err(ModelError::OutOfMemory {
            needed: Some(needed),
            limit: Some(limit),
            detail: format!(
                "{} sequences, {} tokens need about {needed} bytes, over the {limit}-byte cap",
                lens.len(),
                lens.iter().sum::<usize>()
            ),
        });
    }
    Ok(())
}

/// Share of the device's free memory (after the weights are loaded) a mini-batch may plan to
/// use: the rest is headroom for the allocator's fragmentation, cuBLAS workspaces and the
/// fused kernel's.
pub const FREE_MEMORY_SHARE: f64 = 0.85;

/// The part of a device's `free` bytes one of the `workers` that share it may plan with: each
/// runs its forwards while the others run theirs, so each plans with its share, and together
/// they fit in what is free.
pub fn share_of_free(free: u64, workers: usize) -> u64 {
    free / workers.max(1) as u64
}

/// The most tokens in `1..=cap` for which `fits` holds, `fits` being monotone (true up to
/// some count, false after); 1 when not even one token fits.
pub fn most_tokens_that_fit(cap: u64, fits: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi) = (1u64, cap.max(1));
    if !fits(lo) {
        return 1;
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}
