//! The shapes cuDNN's fused attention is planned for, the buffers it reads, and how its
//! failures are typed: the decisions of `fused.rs` that need no GPU, kept apart so that the CPU
//! build tests them and `bench-gpu` reports them on any machine.
//!
//! A cuDNN plan is built per (sequences, longest length) key, 0.1–2 s each with run-time
//! compilation, so keys are bucketed coarsely: the sequence count to a power of two, the
//! longest length to a power of two of at least [`PLAN_LENGTH_FLOOR`]. The floor also keeps
//! a mini-batch of 1-token sequences off cuDNN's decode-only shape (s_q = s_kv = 1), which its
//! own tests skip as a known issue. The bound is not work: the kernel reads each sequence at
//! its ragged length. With `EF_SDPA_DYNAMIC=1` (cuDNN 9.4 on) the shim builds composite plans
//! with dynamic shapes and one kernel cache per handle, so the keys after the first reuse its
//! compiled kernel ([`plan_attempts`]); off by default, since such a plan faulted on an H200.

use std::collections::BTreeSet;

use crate::cpu::attention::Mask;

/// The least planned length: one plan serves every mini-batch whose longest sequence is at
/// most this long, and no plan is ever 1×1.
pub const PLAN_LENGTH_FLOOR: usize = 1024;

/// Packed buffers (q, k, v, the output) are allocated to a multiple of this many tokens, as
/// cuDNN's own packed tests do, so that no tile of the last sequence reads past an allocation.
pub const PACKED_TOKEN_ALIGN: usize = 64;

/// One plan's key: sequences (padded with empty ones) and the longest length it bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct PlanShape {
    pub batch: usize,
    pub max_seq: usize,
}

impl PlanShape {
    /// The plan for sequences of `lens` tokens.
    pub fn of(lens: &[usize]) -> PlanShape {
        let longest = lens.iter().copied().max().unwrap_or(1).max(1);
        PlanShape {
            batch: lens.len().max(1).next_power_of_two(),
            max_seq: longest.max(PLAN_LENGTH_FLOOR).next_power_of_two(),
        }
    }

    /// The token count a plan is built with: the shape's bound (a sequence of the longest
    /// length in every slot), cut to what int32 ragged offsets of `row_width` values a token
    /// (query heads × head dim) can address. The plan's key leaves the count out, so the cut
    /// changes no plan; without it a 16 × 32,768 key of the 4B model (2^31 values) was refused
    /// although no batch under a 524,287-token budget comes near it.
    pub fn plan_tokens(&self, row_width: usize) -> usize {
        let addressable = i32::MAX as usize / row_width.max(1);
        (self.batch * self.max_seq).min(addressable)
    }
}

/// The distinct plans of a run's mini-batches (each a list of sequence lengths): what a
/// warm-up prepares before anything is timed.
pub fn planned_shapes<'a>(batches: impl IntoIterator<Item = &'a [usize]>) -> BTreeSet<PlanShape> {
    batches.into_iter().map(PlanShape::of).collect()
}

/// Tokens the packed buffers of `total` real tokens are allocated for: `total` rounded up to
/// [`PACKED_TOKEN_ALIGN`] (at least one alignment unit).
pub fn padded_tokens(total: usize) -> usize {
    total.max(1).div_ceil(PACKED_TOKEN_ALIGN) * PACKED_TOKEN_ALIGN
}

/// The mask of a forward as the shim takes it (`cudnn_sdpa.h`): query `i` sees key `j` when
/// `i - left < j` (`left >= 1`; -1: no left bound) and `j <= i + right` (-1: no right bound).
/// cuDNN's frontend keeps a score when "column + window > row" (its left bound) and when
/// "row + right bound >= column", so a window of `w` keys either side is `(w + 1, w)`: the
/// query itself counts in cuDNN's window, not in ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MaskBounds {
    pub left: i32,
    pub right: i32,
}

impl MaskBounds {
    /// The bounds of `mask`; a window wider than int32 is no bound on that side (no sequence
    /// is that long).
    pub fn of(mask: Mask) -> MaskBounds {
        let side = |w: usize| i32::try_from(w).ok().filter(|&w| w < i32::MAX);
        match mask {
            Mask::Causal => MaskBounds { left: -1, right: 0 },
            Mask::Full => MaskBounds {
                left: -1,
                right: -1,
            },
            Mask::Window { left, right } => MaskBounds {
                left: side(left).map_or(-1, |w| w + 1),
                right: side(right).unwrap_or(-1),
            },
        }
    }

    /// Whether cuDNN, given these bounds, keeps the score of query `i` and key `j`: the
    /// frontend's two comparisons, written from its `sliding_window_mask`.
    pub fn keeps(self, i: i64, j: i64) -> bool {
        let left = self.left < 0 || j + i64::from(self.left) > i;
        let right = self.right < 0 || i + i64::from(self.right) >= j;
        left && right
    }
}

/// Which cuDNN attention preference (`EF_SDPA_IMPL`) a handle has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdpaPreference {
    Auto = 0,
    Composite = 1,
    Unified = 2,
}

/// One plan build the shim tries for a new key: the SDPA node, and whether the graph has
/// dynamic shapes (so that it shares the handle's kernel cache with the other keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanAttempt {
    pub unified: bool,
    pub dynamic_shapes: bool,
}

mod policy_ffi {
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    pub struct Attempt {
        pub node: i32,
        pub dynamic_shapes: i32,
    }

    extern "C" {
        pub fn ef_sdpa_plan_attempts(
            preference: i32,
            cudnn_version: i64,
            dynamic_wanted: i32,
            dynamic_failed: i32,
            out: *mut Attempt,
            cap: i32,
        ) -> i32;
    }
}

/// The plan builds the shim tries, in order, for a new key: the shim's own decision
/// (`models/cuda/plan_policy.cpp`, compiled into every build), so that a CPU test checks what
/// the GPU runs. `dynamic_failed`: a dynamic-shape build already failed on this handle.
pub fn plan_attempts(
    preference: SdpaPreference,
    cudnn_version: i64,
    dynamic_wanted: bool,
    dynamic_failed: bool,
) -> Vec<PlanAttempt> {
    let mut out = [policy_ffi::Attempt::default(); 4];
    // SAFETY: a pure function writing at most `cap` (4) attempts into `out`.
    let n = unsafe {
        policy_ffi::ef_sdpa_plan_attempts(
            preference as i32,
            cudnn_version,
            i32::from(dynamic_wanted),
            i32::from(dynamic_failed),
            out.as_mut_ptr(),
            out.len() as i32,
        )
    };
    out[..n.clamp(0, 4) as usize]
        .iter()
        .map(|a| PlanAttempt {
            unified: a.node == 2,
            dynamic_shapes: a.dynamic_shapes != 0,
        })
        .collect()
}

/// What a failure of the fused kernel's C++ shim is: its errors cross the C ABI as text
/// (cuDNN statuses, the frontend's codes, CUDA runtime errors), and here, once, they become a
/// typed out-of-memory (so the embed job halves the mini-batch, as for any allocation
/// failure) or an error that is reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimFailure {
    OutOfMemory(String),
    Other(String),
}

/// Marks of an allocation failure in the shim's messages: cuDNN's status, the CUDA runtime's
/// and driver's codes and texts, and a C++ allocation failure caught at the boundary.
const ALLOCATION_FAILURES: [&str; 7] = [
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "cudaErrorMemoryAllocation",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "out of memory",
    "std::bad_alloc",
    "bad_alloc",
];

impl ShimFailure {
    /// Types the shim's message.
    pub fn classify(message: &str) -> ShimFailure {
        let lower = message.to_ascii_lowercase();
        if ALLOCATION_FAILURES
            .iter()
            .any(|mark| lower.contains(&mark.to_ascii_lowercase()))
        {
            ShimFailure::OutOfMemory(message.to_owned())
        } else {
            ShimFailure::Other(message.to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bounds handed to cuDNN keep exactly the scores our kernels keep, for every mask the
    /// families use: causal (Qwen3), the whole sequence (BERT's kin), ModernBERT's and Gemma's
    /// windows (64 and 256 keys either side), a causal window and a one-sided one.
    #[test]
    fn cudnn_bounds_keep_the_scores_each_mask_sees() {
        let masks = [
            Mask::Causal,
            Mask::Full,
            Mask::Window {
                left: 64,
                right: 64,
            },
            Mask::Window {
                left: 256,
                right: 256,
            },
            Mask::Window { left: 40, right: 0 },
            Mask::Window { left: 3, right: 9 },
            Mask::Window { left: 0, right: 0 },
        ];
        for mask in masks {
            let bounds = MaskBounds::of(mask);
            assert!(
                bounds.left == -1 || bounds.left >= 1,
                "{mask:?}: {bounds:?}"
            );
            assert!(bounds.right >= -1, "{mask:?}: {bounds:?}");
            for i in 0..300usize {
                for j in 0..300usize {
                    assert_eq!(
                        bounds.keeps(i as i64, j as i64),
                        mask.sees(i, j),
                        "{mask:?} as {bounds:?} at query {i}, key {j}"
                    );
                }
            }
        }
        assert_eq!(
            MaskBounds::of(Mask::Window {
                left: usize::MAX,
                right: usize::MAX
            }),
            MaskBounds {
                left: -1,
                right: -1
            }
        );
    }

    #[test]
    fn a_batch_of_one_token_sequences_is_never_planned_as_decode() {
        let decode = PlanShape::of(&[1; 8]);
        assert_eq!(
            decode,
            PlanShape {
                batch: 8,
                max_seq: PLAN_LENGTH_FLOOR
            }
        );
        assert!(decode.max_seq > 1);
        assert_eq!(PlanShape::of(&[1]).max_seq, PLAN_LENGTH_FLOOR);
        assert_eq!(PlanShape::of(&[]).max_seq, PLAN_LENGTH_FLOOR);
    }

    #[test]
    fn lengths_and_counts_are_bucketed_so_a_mix_has_few_plans() {
        assert_eq!(
            PlanShape::of(&[300, 17, 1000]),
            PlanShape {
                batch: 4,
                max_seq: 1024
            }
        );
        assert_eq!(PlanShape::of(&[1025]).max_seq, 2048);
        assert_eq!(PlanShape::of(&[32_768]).max_seq, 32_768);
        assert_eq!(PlanShape::of(&[5; 33]).batch, 64);
        // A paper mix's mini-batches: many lengths, few plans.
        let batches: Vec<Vec<usize>> = (1..=200)
            .map(|i| vec![i * 37 % 3000 + 1; i % 7 + 1])
            .collect();
        let shapes = planned_shapes(batches.iter().map(Vec::as_slice));
        assert!(shapes.len() <= 12, "{shapes:?}");
        for b in &batches {
            assert!(shapes.contains(&PlanShape::of(b)));
        }
    }

    const COMPOSITE_DYNAMIC: PlanAttempt = PlanAttempt {
        unified: false,
        dynamic_shapes: true,
    };
    const COMPOSITE: PlanAttempt = PlanAttempt {
        unified: false,
        dynamic_shapes: false,
    };
    const UNIFIED: PlanAttempt = PlanAttempt {
        unified: true,
        dynamic_shapes: false,
    };

    #[test]
    fn composite_plans_share_the_kernel_cache_from_cudnn_9_4() {
        use SdpaPreference::*;
        // Auto: the unified node (static: it refuses dynamic shapes), then composite with
        // dynamic shapes, then composite static as the last resort.
        assert_eq!(
            plan_attempts(Auto, 91801, true, false),
            [UNIFIED, COMPOSITE_DYNAMIC, COMPOSITE]
        );
        assert_eq!(
            plan_attempts(Composite, 90400, true, false),
            [COMPOSITE_DYNAMIC, COMPOSITE]
        );
        // The unified node is never built with dynamic shapes.
        assert_eq!(plan_attempts(Unified, 92801, true, false), [UNIFIED]);
        // Before cuDNN 9.4 there is no kernel cache: every key compiles its own kernel.
        assert_eq!(plan_attempts(Composite, 90301, true, false), [COMPOSITE]);
        // EF_SDPA_DYNAMIC unset (the default) or 0.
        assert_eq!(
            plan_attempts(Auto, 92801, false, false),
            [UNIFIED, COMPOSITE]
        );
    }

    #[test]
    fn a_refused_dynamic_build_is_not_retried_for_every_key() {
        // Once a dynamic build failed where the static one then succeeded, later keys of the
        // handle go straight to the static build: one failed build per handle, not per key.
        assert_eq!(
            plan_attempts(SdpaPreference::Composite, 91801, true, true),
            [COMPOSITE]
        );
        assert_eq!(
            plan_attempts(SdpaPreference::Auto, 91801, true, true),
            [UNIFIED, COMPOSITE]
        );
    }

    #[test]
    fn packed_buffers_have_a_padded_tail() {
        assert_eq!(padded_tokens(1), 64);
        assert_eq!(padded_tokens(64), 64);
        assert_eq!(padded_tokens(65), 128);
        assert_eq!(padded_tokens(0), 64);
        for total in [1usize, 63, 1000, 32_769] {
            let padded = padded_tokens(total);
            assert!(padded >= total && padded.is_multiple_of(PACKED_TOKEN_ALIGN));
            assert!(padded - total < PACKED_TOKEN_ALIGN);
        }
    }

    #[test]
    fn allocation_failures_of_the_shim_are_typed_out_of_memory() {
        for message in [
            "ef_sdpa_prepare: build_plans: GRAPH_EXECUTION_PLAN_CREATION_FAILED: CUDNN_STATUS_ALLOC_FAILED",
            "ef_sdpa_run: CUDA_API_FAILED: cudaMalloc failed: cudaErrorMemoryAllocation",
            "ef_sdpa_prepare: exception: std::bad_alloc",
            "workspace: CUDA_ERROR_OUT_OF_MEMORY (CUresult 2)",
            "nvrtc: out of memory",
        ] {
            assert_eq!(
                ShimFailure::classify(message),
                ShimFailure::OutOfMemory(message.into()),
                "{message}"
            );
        }
        let other = "ef_sdpa_prepare: GRAPH_NOT_SUPPORTED: no engine for this shape";
        assert_eq!(
            ShimFailure::classify(other),
            ShimFailure::Other(other.into())
        );
    }
    #[test]
    fn plan_tokens_stay_addressable_by_int32_offsets() {
        let key = PlanShape {
            batch: 16,
            max_seq: 32768,
        };
        // The 4B model: 32 heads of 128. The bound, 2^19 tokens, is 2^31 values: one too many.
        assert_eq!(key.plan_tokens(4096), (i32::MAX as usize) / 4096);
        assert!(key.plan_tokens(4096) * 4096 <= i32::MAX as usize);
        let small = PlanShape {
            batch: 4,
            max_seq: 1024,
        };
        assert_eq!(small.plan_tokens(4096), 4096);
    }
}
