//! The forward's elementwise steps, each as one pass over memory: SwiGLU over the halves of the
//! gate/up product, a residual add together with the RMSNorm that reads its sum, and q's and
//! k's head norm together with the rotary, written into the attention's padded rows.
//!
//! candle's SwiGLU (`candle_nn::ops::swiglu`) is a silu then a multiply over strided halves:
//! two passes, per-element index arithmetic, and a copy of the strides to the device each; a
//! residual add then a norm read and write the hidden state twice; q and k are copied into the
//! padded rows, normed, then rotated: three passes. On a GPU these are our own
//! kernels (`cuda/elementwise.cu`, cubins for sm_80 and sm_90 built by `build.rs`, loaded from
//! bytes: no NVRTC). `EF_FUSED_ELEMENTWISE=1` (an A/B switch for the GPU check) turns them on,
//! on any device: the CPU runs the same arithmetic ([`cpu`]), which is what the tests check and
//! what a GPU's first use compares its kernels with before trusting them. Off (the default),
//! the forward is candle's ops, unchanged.
//!
//! Arithmetic (bf16 in and out, f32 inside, rounded where transformers rounds):
//! `act = bf16(silu(gate))`, `out = bf16(act · up)`; `sum = bf16(x + h)`,
//! `normed = bf16(sum · rsqrt(mean(sum²) + eps) · w)` with the mean over the rounded sum; q/k:
//! `n = bf16(x · rsqrt(mean(x²) + eps) · w)` per head, then `bf16(n₁·cos − n₂·sin)`,
//! `bf16(n₁·sin + n₂·cos)` in f32 (candle's rope rounds each product: we round once).

use candle_core::{DType, Result, Tensor};

use crate::ab_switch::AbSwitch;

/// Which ops run the forward's elementwise steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elementwise {
    /// candle's ops (the default).
    Candle,
    /// Our fused kernels, where they apply (bf16 on a GPU whose kernels passed their check, or
    /// the CPU); candle's ops elsewhere.
    Fused,
}

impl Elementwise {
    /// `Fused` under `EF_FUSED_ELEMENTWISE=1`, else `Candle`.
    pub fn from_env() -> Elementwise {
        if AbSwitch::FusedElementwise.on() {
            Elementwise::Fused
        } else {
            Elementwise::Candle
        }
    }

    /// `silu(gate) · up` of `gate_up` (`[T, 2I]`, gate then up): `[T, I]`.
    pub fn swiglu(self, gate_up: &Tensor) -> Result<Tensor> {
        if self.fuses(gate_up) {
            return gate_up.apply_op1_no_bwd(&Swiglu);
        }
        candle_nn::ops::swiglu(gate_up)
    }

    /// `x + h` (`[T, H]` each) and its RMSNorm with `weight`: `(sum, normed)`.
    pub fn add_rms_norm(
        self,
        x: &Tensor,
        h: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        if self.fuses(x) && x.dims() == h.dims() && x.dtype() == h.dtype() {
            let both = x.apply_op3_no_bwd(h, weight, &AddRmsNorm { eps })?;
            return Ok((both.get(0)?, both.get(1)?));
        }
        let sum = (x + h)?;
        let normed = candle_nn::ops::rms_norm(&sum, weight, eps)?;
        Ok((sum, normed))
    }

    /// Fused, and `t` a 2-D tensor of a dtype the kernels take, on a device whose kernels
    /// passed their first-use check.
    fn fuses(self, t: &Tensor) -> bool {
        t.rank() == 2 && self.fuses_any_rank(t)
    }

    /// Fused mode on a trusted device, or the CPU in f32 whatever the mode: the CPU forward's
    /// steps are its own kernels (`crate::cpu::rows`), candle's CPU ops being a pass and a
    /// temporary tensor each with a scalar `exp`.
    fn fuses_any_rank(self, t: &Tensor) -> bool {
        let cpu_f32 = t.device().is_cpu() && t.dtype() == DType::F32;
        cpu_f32
            || (self == Elementwise::Fused
                && matches!(t.dtype(), DType::BF16 | DType::F32)
                && trusted(t))
    }

    /// Per-head RMSNorm (weight `norm`, `[hd]`) then rotary (`cos`, `sin`: `[rows, hd / 2]`, a
    /// row per token's position) of the heads `first..first + heads` of `qkv`
    /// (`[T, row_heads, hd]`, contiguous), in `rows ≥ T` rows, zeros past `T`: `[rows, heads,
    /// hd]`. `None` where this mode does not fuse it (the caller runs candle's ops).
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope(
        self,
        qkv: &Tensor,
        first: usize,
        heads: usize,
        norm: &Tensor,
        eps: f32,
        cos: &Tensor,
        sin: &Tensor,
        rows: usize,
    ) -> Result<Option<Tensor>> {
        if !(self.fuses_any_rank(qkv) && qkv.rank() == 3 && qkv.is_contiguous()) {
            return Ok(None);
        }
        let op = QkNormRope {
            first,
            heads,
            rows: rows.max(qkv.dim(0)?),
            eps,
            sin: sin.clone(),
        };
        qkv.apply_op3_no_bwd(norm, cos, &op).map(Some)
    }
}

#[cfg(feature = "cuda")]
fn trusted(t: &Tensor) -> bool {
    match t.device() {
        candle_core::Device::Cuda(dev) => t.dtype() == DType::BF16 && gpu::trusted(dev),
        candle_core::Device::Cpu => true,
        _ => false,
    }
}

#[cfg(not(feature = "cuda"))]
fn trusted(t: &Tensor) -> bool {
    t.device().is_cpu()
}

struct Swiglu;

/// See [`Elementwise::qk_norm_rope`]; `sin` rides along (a custom op takes three tensors).
struct QkNormRope {
    first: usize,
    heads: usize,
    rows: usize,
    eps: f32,
    sin: Tensor,
}

struct AddRmsNorm {
    eps: f32,
}

mod check;
pub mod cpu;
#[cfg(feature = "cuda")]
mod gpu;
mod ops;

pub use check::self_check;

#[cfg(test)]
mod tests;
