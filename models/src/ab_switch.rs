//! Switches of the forward for the GPU check (`benches/gpu-diagnose.sh`): the A/B ones put back
//! the way before a change, in one build, so that one device run compares both; one turns the
//! stage profile on. Off unless the variable is `1`; read once per process, not per layer.

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy)]
// The fused kernel's switches are read in the CUDA build only.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum AbSwitch {
    /// `EF_FUSED_QK_COPY`: q and k made in rows of their own and copied into the fused
    /// kernel's padded buffers.
    FusedQkCopy,
    /// `EF_FUSED_ZERO_ALL`: the fused kernel's whole output buffer zeroed, not its tail.
    FusedZeroAll,
    /// `EF_LAST_LAYER_ALL_ROWS`: the last layer on every row, its pooled rows taken after.
    LastLayerAllRows,
    /// `EF_NO_EVENT_TRACKING`: the device's tensors record no CUDA event per use.
    NoEventTracking,
    /// `EF_GEMM_LT`: bf16 projections through cuBLASLt instead of candle's cuBLAS call.
    GemmLt,
    /// `EF_POOL_RELEASE`: the GPU's memory pool keeps CUDA's default (freed memory handed
    /// back at every synchronization).
    PoolRelease,
    /// `EF_PROFILE_STAGES`: each stage of the forward timed between two synchronizations.
    ProfileStages,
    /// `EF_FUSED_ELEMENTWISE`: SwiGLU, each residual add with the RMSNorm after it, and q/k's
    /// head norm with the rotary, one kernel each (`elementwise.rs`) instead of candle's ops.
    FusedElementwise,
    /// `EF_CUBLAS_WORKSPACE`: candle's cuBLAS handle given a 32 MiB workspace.
    CublasWorkspace,
    /// `EF_MEMORY_SAMPLER`: a benchmark's peak memory polled from a second thread every
    /// millisecond while the forwards run, not read from the pool's high-water mark.
    MemorySampler,
    /// `EF_FP8_FAST_ACCUM`: the FP8 GEMM accumulates with Hopper's fast (less precise)
    /// accumulation, as PyTorch's `_scaled_mm(use_fast_accum=True)`.
    Fp8FastAccum,
}

const NAMES: [&str; 11] = [
    "EF_FUSED_QK_COPY",
    "EF_FUSED_ZERO_ALL",
    "EF_LAST_LAYER_ALL_ROWS",
    "EF_NO_EVENT_TRACKING",
    "EF_GEMM_LT",
    "EF_POOL_RELEASE",
    "EF_PROFILE_STAGES",
    "EF_FUSED_ELEMENTWISE",
    "EF_CUBLAS_WORKSPACE",
    "EF_MEMORY_SAMPLER",
    "EF_FP8_FAST_ACCUM",
];

impl AbSwitch {
    pub(crate) fn on(self) -> bool {
        static ON: OnceLock<[bool; NAMES.len()]> = OnceLock::new();
        ON.get_or_init(|| NAMES.map(|name| std::env::var(name).as_deref() == Ok("1")))
            [self as usize]
    }
}
