//! FP8 projections (`--precision fp8`, opt-in): each projection's weight stored as E4M3 with a
//! scale per output channel, its input quantized per token at every call, and the product
//! taken by cuBLASLt's FP8 GEMM (Hopper's and Ada's tensor cores, twice bf16's rate), its
//! output scaled back to bf16. Attention, norms, rotary and the residual stream stay bf16.
//!
//! Per-channel and per-token scales are the two rank-1 factors of the product: `Y[t, n] =
//! sx[t] · sw[n] · Σ qx[t, k] · qw[n, k]`, so the GEMM runs on the codes alone (cuBLASLt's
//! per-tensor scales left at 1) and one small kernel multiplies its output by both.
//!
//! Only where a GPU has FP8 tensor cores (compute capability 8.9 and newer: L4/L40, H100,
//! H200): an A100 (8.0) is refused, not emulated. On the CPU the library emulates it (the same
//! quantization, f32 products), which is how the tests measure the scheme's fidelity; the embed
//! job refuses FP8 on the CPU, where it would give no speed.

pub mod e4m3;
#[cfg(feature = "cuda")]
pub(crate) mod gpu;
pub mod quantize;

pub use e4m3::{from_e4m3, to_e4m3, E4M3_MAX};
pub use quantize::{fp8_product, pseudo_random, quantize_rows, round_trip_rows, QuantizedRows};

/// The oldest compute capability with FP8 tensor cores (Ada, sm_89).
pub const FP8_MIN_CAPABILITY: (u32, u32) = (8, 9);

/// Why FP8 projections cannot run on a device of compute capability `capability` (`None`: the
/// CPU), in a user's words; `None` when they can.
pub fn refusal(capability: Option<(u32, u32)>) -> Option<String> {
    match capability {
        None => Some(
            "--precision fp8 runs on a GPU with FP8 tensor cores (compute capability 8.9 and \
             newer: L4, L40, H100, H200); on the CPU it would be slower than f32. Leave \
             --precision out (f32 on the CPU, bf16 on a GPU)"
                .into(),
        ),
        Some(cc) if cc < FP8_MIN_CAPABILITY => Some(format!(
            "--precision fp8 needs FP8 tensor cores (compute capability 8.9 and newer: L4, L40, \
             H100, H200); this GPU has compute capability {}.{}{}. Leave --precision out \
             (bf16), or submit to a queue of newer GPUs",
            cc.0,
            cc.1,
            if cc == (8, 0) { " (an A100)" } else { "" }
        )),
        Some(_) => None,
    }
}

/// Whether a model in `dtype` on `device` can take FP8 projections: a GPU without FP8 tensor
/// cores, or a dtype other than bf16 there, is refused; on a GPU, the kernels are checked
/// against the CPU's arithmetic first (a GEMM that loads but computes wrong must not write a
/// run's vectors). The CPU passes: the library's emulation.
pub fn check_device(
    device: &candle_core::Device,
    dtype: candle_core::DType,
) -> crate::ModelResult<()> {
    // This GPU's: another node may have FP8 tensor cores (exit 5, its queue set aside).
    let not_here = |reason: String| crate::ModelError::DeviceRefused { reason };
    if !device.is_cpu() {
        if let Some(reason) = refusal(capability(device)?) {
            return Err(not_here(reason));
        }
        if dtype != candle_core::DType::BF16 {
            return Err(crate::ModelError::PrecisionRefused {
                reason: format!(
                    "--precision fp8 computes its activations in bf16, not {dtype:?}; leave \
                     the dtype at its default"
                ),
            });
        }
        #[cfg(feature = "cuda")]
        gpu::self_check(device).map_err(|e| {
            not_here(format!(
                "--precision fp8: the FP8 projection failed its check on this GPU ({e}); leave \
                 --precision out (bf16)"
            ))
        })?;
    }
    Ok(())
}

/// The compute capability of `device` (`None` for the CPU).
pub fn capability(device: &candle_core::Device) -> candle_core::Result<Option<(u32, u32)>> {
    match device {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(d) => gpu::capability(d).map(Some),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_runs_on_ada_and_hopper_and_is_refused_on_an_a100_and_the_cpu() {
        assert_eq!(refusal(Some((8, 9))), None, "L4 / L40");
        assert_eq!(refusal(Some((9, 0))), None, "H100 / H200");
        assert_eq!(refusal(Some((10, 0))), None, "Blackwell");
        let a100 = refusal(Some((8, 0))).expect("an A100 is refused");
        assert!(
            a100.contains("8.0 (an A100)") && a100.contains("8.9"),
            "{a100}"
        );
        assert!(
            refusal(Some((8, 6))).is_some(),
            "an A10/RTX 30 (8.6) has no FP8 cores"
        );
        let cpu = refusal(None).expect("the CPU is refused");
        assert!(cpu.contains("--precision"), "{cpu}");
    }
}
