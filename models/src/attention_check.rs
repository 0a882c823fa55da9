//! Which attention kernel a device runs. On a GPU, cuDNN's fused kernel runs once it agrees
//! with the blockwise one on the device (a start-up self-test, at load and in `doctor
//! --attention`); it is refused, saying why, when it cannot run or disagrees.
//! `EMBEDFLEET_ATTENTION=blockwise` keeps the blockwise kernel.
//!
//! This module sits above both kernels (`crate::attention` and `crate::fused`), so neither
//! needs the other's test.

use crate::device::DeviceSpec;
#[cfg(feature = "cuda")]
use crate::{
    attention::{AttentionKernel, AttnContext},
    error::{ModelError, ModelResult},
    family::LoadOptions,
    fused::FusedAttention,
    packed::SeqSpan,
};
#[cfg(feature = "cuda")]
use candle_core::{DType, Device, Tensor};

/// Largest difference the start-up self-test accepts between the fused and the blockwise
/// attention outputs (bf16 values of magnitude about 1; a layout or mask error gives
/// differences of that magnitude).
#[cfg(feature = "cuda")]
pub const FUSED_SELF_TEST_TOLERANCE: f32 = 0.05;

/// The self-test passes: its difference is within the tolerance (a NaN is not).
#[cfg(feature = "cuda")]
fn within_tolerance(diff: f32) -> bool {
    diff <= FUSED_SELF_TEST_TOLERANCE
}

/// The fused kernel for a model of `heads` (query heads, key/value heads, head dimension)
/// computing in `dtype` on `device`, once its self-test passes; `None` when
/// `EMBEDFLEET_ATTENTION=blockwise` keeps the blockwise kernel. The error says why the fused
/// kernel is refused.
#[cfg(feature = "cuda")]
pub fn fused_kernel(
    heads: (usize, usize, usize),
    dtype: DType,
    device: &Device,
    opts: &LoadOptions,
) -> ModelResult<Option<AttentionKernel>> {
    if std::env::var("EMBEDFLEET_ATTENTION").as_deref() == Ok("blockwise") {
        tracing::warn!(device = %opts.device, "EMBEDFLEET_ATTENTION=blockwise: the fused kernel is off");
        return Ok(None);
    }
    let refuse = |reason: String| ModelError::AttentionKernel {
        device: opts.device.to_string(),
        reason,
    };
    if dtype != DType::BF16 {
        return Err(refuse(format!(
            "it computes in bf16, this model in {dtype:?}"
        )));
    }
    let (n_heads, n_kv, head_dim) = heads;
    let fused = FusedAttention::new(n_heads, n_kv, head_dim).map_err(refuse)?;
    let version = fused.cudnn_version();
    let kernel = AttentionKernel::Fused(std::sync::Arc::new(fused));
    let tile = opts.attention_tile.max(1);
    let diff = self_test(&kernel, device, tile)
        .map_err(|e| refuse(format!("its start-up self-test failed: {e}")))?;
    if !within_tolerance(diff) {
        return Err(refuse(format!(
            "its start-up self-test differs from the blockwise kernel by {diff} \
             (tolerance {FUSED_SELF_TEST_TOLERANCE})"
        )));
    }
    tracing::info!(device = %opts.device, cudnn = version, self_test_max_diff = diff, "fused attention on");
    Ok(Some(kernel))
}

/// Runs the fused kernel and the blockwise path on the same random problem on `device` (a
/// few sequences of mixed lengths, one of them a single token, across several tiles, and an
/// empty padded slot) and returns the largest difference, or why the kernel cannot run.
#[cfg(feature = "cuda")]
pub fn self_test(kernel: &AttentionKernel, device: &Device, tile: usize) -> Result<f32, String> {
    let AttentionKernel::Fused(fused) = kernel else {
        return Err("not the fused kernel".into());
    };
    let (nh, nkv, hd) = fused.heads();
    let lens = [1usize, 37, 3 * tile.min(256) + 5];
    let mut spans = Vec::new();
    let mut start = 0;
    for len in lens {
        spans.push(SeqSpan { start, len });
        start += len;
    }
    let run = || -> candle_core::Result<f32> {
        let rand =
            |heads| Tensor::randn(0f32, 1.0, (start, heads, hd), device)?.to_dtype(DType::BF16);
        let (q, k, v) = (rand(nh)?, rand(nkv)?, rand(nkv)?);
        let scale = 1.0 / (hd as f64).sqrt();
        let fused_ctx = AttnContext::new(spans.clone(), tile, kernel.clone(), device)?;
        let got = kernel.attention(&q, &k, &v, &fused_ctx, scale)?;
        let block = AttentionKernel::Blockwise;
        let block_ctx = AttnContext::new(spans.clone(), tile, block.clone(), device)?;
        let want = block.attention(&q, &k, &v, &block_ctx, scale)?;
        let diff = (got.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        Ok(diff)
    };
    run().map_err(|e| e.to_string())
}

/// Checks, in a few seconds and before any model is loaded, whether cuDNN's fused attention
/// runs on `device`: the kernel for the 4B/8B head layout (32 query and 8 key/value heads of
/// 128) and its start-up self-test. `Ok` names the kernel the device will run; `Err` says why
/// the fused kernel is refused (`EMBEDFLEET_ATTENTION=blockwise` then runs the blockwise one).
pub fn probe_attention(device: &DeviceSpec) -> Result<String, String> {
    match device {
        DeviceSpec::Cpu => Ok("blockwise (the CPU has no fused kernel)".into()),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(_) => {
            let opened = device.open().map_err(|e| e.to_string())?;
            let fused = FusedAttention::new(32, 8, 128)?;
            let version = fused.cudnn_version();
            let kernel = AttentionKernel::Fused(std::sync::Arc::new(fused));
            let diff = self_test(&kernel, &opened, crate::DEFAULT_ATTENTION_TILE)?;
            if !within_tolerance(diff) {
                return Err(format!(
                    "its self-test differs from the blockwise kernel by {diff} (tolerance {FUSED_SELF_TEST_TOLERANCE})"
                ));
            }
            Ok(format!(
                "cudnn-fused (cuDNN {version}, self-test max difference {diff})"
            ))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => Err("this is a CPU build: no CUDA kernels".into()),
    }
}
