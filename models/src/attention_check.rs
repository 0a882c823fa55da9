//! Which attention kernel a device runs. On a GPU, cuDNN's fused kernel runs once it agrees
//! with the blockwise one on the device (a start-up self-test, at load and in `doctor
//! --attention`); it is refused, saying why, when it cannot run or disagrees. On the CPU in
//! f32 the tiled kernel runs. `EMBEDFLEET_ATTENTION=blockwise` keeps the blockwise kernel on
//! either ([`blockwise_asked`]).
//!
//! This module sits above both kernels (`crate::attention` and `crate::fused`), so neither
//! needs the other's test.

use crate::device::DeviceSpec;
#[cfg(feature = "cuda")]
use crate::{
    attention::{AttentionKernel, AttnContext, Mask},
    error::{ModelError, ModelResult},
    family::LoadOptions,
    fused::FusedAttention,
    packed::SeqSpan,
};
#[cfg(feature = "cuda")]
use candle_core::{DType, Device, Tensor};

/// Largest relative difference the start-up self-test accepts between the fused and the
/// blockwise attention output of any token and head (`|got - want| / |want|`, L2 over the head
/// dimension). Both round to bf16 (2^-9 relative) and the blockwise kernel rounds its
/// probabilities too: correct kernels differ by under 1 %; a layout, mask or tile error by tens
/// of percent. Relative, because a long sequence's attention output is a mean over many random
/// values, of norm far below 1: the first GPU runs passed an absolute tolerance of 0.05 with a
/// 0.0156 difference while a 512-token forward lost fidelity (BENCHMARKS.md).
pub const FUSED_SELF_TEST_TOLERANCE: f32 = 0.05;

/// The self-test passes: its relative difference is within the tolerance (a NaN is not).
pub fn within_tolerance(relative_diff: f32) -> bool {
    relative_diff <= FUSED_SELF_TEST_TOLERANCE
}

/// The self-test's problems: (sequence lengths of one batch). A mixed batch (a single token,
/// a short sequence, one across several tiles, and an empty padded slot), then single long
/// sequences whose plan bound is above their length (1 × 1,024 and 1 × 2,048 keys: the shapes
/// of a one-paper forward).
pub fn self_test_batches(tile: usize) -> Vec<Vec<usize>> {
    vec![vec![1, 37, 3 * tile.min(256) + 5], vec![600], vec![1500]]
}

/// The largest relative L2 difference between rows of `got` and `want` (`[rows, width]`
/// each, f32 values): what [`FUSED_SELF_TEST_TOLERANCE`] bounds. A row of zeros in `want`
/// counts its difference as absolute.
pub fn max_relative_row_diff(got: &[f32], want: &[f32], width: usize) -> f32 {
    got.chunks(width.max(1))
        .zip(want.chunks(width.max(1)))
        .map(|(g, w)| {
            let diff: f32 = g.iter().zip(w).map(|(a, b)| (a - b) * (a - b)).sum::<f32>();
            let norm: f32 = w.iter().map(|b| b * b).sum::<f32>();
            if norm > 0.0 {
                (diff / norm).sqrt()
            } else {
                diff.sqrt()
            }
        })
        .fold(0.0f32, max_keeping_nan)
}

/// The larger of two differences, NaN if either is (`f32::max` would drop a NaN: a kernel
/// writing NaN would pass).
fn max_keeping_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// Whether `EMBEDFLEET_ATTENTION=blockwise` asks for the blockwise kernel (an A/B check, or a
/// device whose fused kernel is refused): no fused kernel on a GPU, no tiled one on the CPU.
pub fn blockwise_asked() -> bool {
    std::env::var("EMBEDFLEET_ATTENTION").as_deref() == Ok("blockwise")
}

/// The fused kernel for a model of `heads` (query heads, key/value heads, head dimension)
/// whose layers attend under `masks`, computing in `dtype` on `device`, once its self-test
/// passes under each mask; `None` when `EMBEDFLEET_ATTENTION=blockwise` keeps the blockwise
/// kernel. The error says why the fused kernel is refused.
#[cfg(feature = "cuda")]
pub fn fused_kernel(
    heads: (usize, usize, usize),
    masks: &[Mask],
    dtype: DType,
    device: &Device,
    opts: &LoadOptions,
) -> ModelResult<Option<AttentionKernel>> {
    if blockwise_asked() {
        tracing::warn!(device = %opts.device, "EMBEDFLEET_ATTENTION=blockwise: the fused kernel is off");
        return Ok(None);
    }
    let refuse = |reason: String| ModelError::AttentionKernel {
        device: opts.device.to_string(),
        reason,
    };
    if dtype != DType::BF16 {
        // The fused kernel computes in bf16 only; a model asked for in another dtype (`bench-gpu
        // --dtype f32`, to tell a drift of bf16 from a kernel's fault) runs blockwise.
        tracing::warn!(device = %opts.device, ?dtype, "the fused attention kernel is bf16 only: blockwise attention");
        return Ok(None);
    }
    let (n_heads, n_kv, head_dim) = heads;
    let fused = FusedAttention::new(n_heads, n_kv, head_dim).map_err(refuse)?;
    let version = fused.cudnn_version();
    let kernel = AttentionKernel::Fused(std::sync::Arc::new(fused));
    let tile = opts.attention_tile.max(1);
    let diff = self_test(&kernel, device, tile, masks)
        .map_err(|e| refuse(format!("its start-up self-test failed: {e}")))?;
    if !within_tolerance(diff) {
        return Err(refuse(format!(
            "its start-up self-test differs from the blockwise kernel by {diff} relative \
             (tolerance {FUSED_SELF_TEST_TOLERANCE})"
        )));
    }
    tracing::info!(device = %opts.device, cudnn = version, self_test_max_diff = diff, "fused attention on");
    Ok(Some(kernel))
}

/// Runs the fused kernel and the blockwise path on the same random problems on `device`
/// ([`self_test_batches`]) under each of `masks` and returns the largest relative difference
/// of any token's head ([`max_relative_row_diff`]), or why the kernel cannot run.
#[cfg(feature = "cuda")]
pub fn self_test(
    kernel: &AttentionKernel,
    device: &Device,
    tile: usize,
    masks: &[Mask],
) -> Result<f32, String> {
    let AttentionKernel::Fused(fused) = kernel else {
        return Err("not the fused kernel".into());
    };
    let (nh, nkv, hd) = fused.heads();
    let one = |lens: &[usize], mask: Mask| -> candle_core::Result<f32> {
        let mut spans = Vec::new();
        let mut start = 0;
        for &len in lens {
            spans.push(SeqSpan { start, len });
            start += len;
        }
        let rand =
            |heads| Tensor::randn(0f32, 1.0, (start, heads, hd), device)?.to_dtype(DType::BF16);
        let (q, k, v) = (rand(nh)?, rand(nkv)?, rand(nkv)?);
        let scale = 1.0 / (hd as f64).sqrt();
        let fused_ctx = AttnContext::new(spans.clone(), tile, kernel.clone(), device)?;
        let got = kernel.attention(&q, &k, &v, &fused_ctx, scale, mask)?;
        let block = AttentionKernel::Blockwise;
        let block_ctx = AttnContext::new(spans.clone(), tile, block.clone(), device)?;
        let want = block.attention(&q, &k, &v, &block_ctx, scale, mask)?;
        let values = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
        Ok(max_relative_row_diff(&values(&got)?, &values(&want)?, hd))
    };
    let mut worst = 0.0f32;
    for &mask in masks {
        for lens in self_test_batches(tile) {
            let diff = one(&lens, mask)
                .map_err(|e| format!("{e} (sequences of {lens:?} tokens, {mask:?})"))?;
            worst = max_keeping_nan(worst, diff);
        }
    }
    Ok(worst)
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
            let diff = self_test(
                &kernel,
                &opened,
                crate::family::DEFAULT_ATTENTION_TILE,
                &[Mask::Causal],
            )?;
            if !within_tolerance(diff) {
                return Err(format!(
                    "its self-test differs from the blockwise kernel by {diff} relative (tolerance {FUSED_SELF_TEST_TOLERANCE})"
                ));
            }
            Ok(format!(
                "cudnn-fused (cuDNN {version}, self-test max relative difference {diff:.4})"
            ))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => Err("this is a CPU build: no CUDA kernels".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{AttentionKernel, AttnContext, Mask};
    use crate::packed::SeqSpan;
    use crate::tiny::{random_tensors, Init};
    use candle_core::{DType, Device, Tensor};

    /// The blockwise kernel's output for one sequence of q, k and v (`[T, heads, 128]`).
    fn blockwise(q: &Tensor, k: &Tensor, v: &Tensor, tile: usize) -> Vec<f32> {
        let t = q.dim(0).unwrap();
        let spans = vec![SeqSpan { start: 0, len: t }];
        let ctx = AttnContext::new(spans, tile, AttentionKernel::Blockwise, &Device::Cpu).unwrap();
        let out = AttentionKernel::Blockwise
            .attention(q, k, v, &ctx, 1.0 / (128f64).sqrt(), Mask::Causal)
            .unwrap();
        out.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// The tolerance tells two correct bf16 computations (0.005 apart) from a kernel that
    /// loses the keys of its last tiles (0.85), on the 4B head layout at a one-paper length.
    #[test]
    fn the_relative_tolerance_separates_lost_keys_from_bf16_rounding() {
        let (t, dev) = (600, Device::Cpu);
        let spec =
            |name: &str, heads: usize| (name.to_string(), vec![t, heads, 128], Init::Normal(1.0));
        let mut qkv = random_tensors(vec![spec("q", 32), spec("k", 8), spec("v", 8)], 1).unwrap();
        let mut take = |name: &str| qkv.remove(name).unwrap().to_dtype(DType::BF16).unwrap();
        let (q, k, v) = (take("q"), take("k"), take("v"));
        let reference = blockwise(&q, &k, &v, 512);
        let other_tiles = blockwise(&q, &k, &v, 64);
        let correct = max_relative_row_diff(&other_tiles, &reference, 128);
        assert!(
            within_tolerance(correct),
            "two correct computations differ by {correct}"
        );
        // Keys and values past the first 512 tokens lost (zero), as a kernel that stops a tile
        // early would.
        let keep = Tensor::cat(
            &[
                Tensor::ones((512, 8, 128), DType::BF16, &dev).unwrap(),
                Tensor::zeros((t - 512, 8, 128), DType::BF16, &dev).unwrap(),
            ],
            0,
        )
        .unwrap();
        let lost = blockwise(&q, &(&k * &keep).unwrap(), &(&v * &keep).unwrap(), 512);
        let broken = max_relative_row_diff(&lost, &reference, 128);
        assert!(
            !within_tolerance(broken),
            "lost keys differ by only {broken}"
        );
        let absolute = lost
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("correct {correct}, lost keys {broken} relative, {absolute} absolute");
    }

    #[test]
    fn a_nan_or_a_zero_row_is_not_hidden() {
        assert!(!within_tolerance(max_relative_row_diff(
            &[f32::NAN, 0.0],
            &[1.0, 0.0],
            2
        )));
        // A zero reference row counts its difference as absolute.
        assert_eq!(max_relative_row_diff(&[0.0, 3.0], &[0.0, 0.0], 2), 3.0);
        assert_eq!(max_relative_row_diff(&[1.0, 0.0], &[1.0, 0.0], 2), 0.0);
    }
}
