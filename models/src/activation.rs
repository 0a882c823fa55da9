//! The encoder families' GELU activations: GeGLU, `gelu(gate) · up` of a `[rows, 2·inter]`
//! gate/up product (ModernBERT's and Gemma 3's gated MLPs), and BERT's `gelu(h + bias)` after
//! its intermediate projection. On the CPU in f32, one vectorised pass per row over the pool
//! ([`crate::cpu::gelu`]); elsewhere (a GPU, bf16) candle's ops. (SwiGLU, Qwen3's and
//! NomicBERT's, is `crate::elementwise`'s, which runs its CPU f32 row kernel in any mode.)

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};

pub use crate::cpu::gelu::Gelu;

/// `gelu(gate_up[:, ..inter]) · gate_up[:, inter..]`: `[rows, inter]`.
pub fn geglu(gate_up: &Tensor, inter: usize, gelu: Gelu) -> Result<Tensor> {
    let fused = cpu_f32(gate_up) && gate_up.dims() == [gate_up.dim(0)?, 2 * inter];
    if fused {
        return gate_up.apply_op1_no_bwd(&Geglu { inter, gelu });
    }
    let gate = gate_up.narrow(1, 0, inter)?;
    let gate = match gelu {
        Gelu::Tanh => gate.gelu()?,
        Gelu::Erf => gate.gelu_erf()?,
    };
    gate * gate_up.narrow(1, inter, inter)?
}

/// A contiguous f32 tensor on the CPU: what the row kernels take.
fn cpu_f32(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous()
}

/// `gelu(h + bias)` (`h`: `[rows, cols]`, `bias`: `[cols]`).
pub fn bias_gelu(h: &Tensor, bias: &Tensor, gelu: Gelu) -> Result<Tensor> {
    let fused = cpu_f32(h) && cpu_f32(bias) && h.rank() == 2 && bias.dims() == [h.dim(1)?];
    if fused {
        return h.apply_op2_no_bwd(bias, &BiasGelu { gelu });
    }
    let sum = h.broadcast_add(bias)?;
    match gelu {
        Gelu::Tanh => sum.gelu(),
        Gelu::Erf => sum.gelu_erf(),
    }
}

struct BiasGelu {
    gelu: Gelu,
}

impl candle_core::CustomOp2 for BiasGelu {
    fn name(&self) -> &'static str {
        "cpu-bias-gelu"
    }

    fn cpu_fwd(
        &self,
        h: &CpuStorage,
        h_l: &Layout,
        b: &CpuStorage,
        b_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (Some((h0, h1)), Some((b0, b1))) = (h_l.contiguous_offsets(), b_l.contiguous_offsets())
        else {
            candle_core::bail!("bias_gelu takes contiguous tensors");
        };
        let (h, b) = (&h.as_slice::<f32>()?[h0..h1], &b.as_slice::<f32>()?[b0..b1]);
        let out = crate::cpu::gelu::bias_gelu(h, b, self.gelu);
        Ok((CpuStorage::F32(out), h_l.shape().clone()))
    }
}

struct Geglu {
    inter: usize,
    gelu: Gelu,
}

impl candle_core::CustomOp1 for Geglu {
    fn name(&self) -> &'static str {
        "cpu-geglu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("geglu takes a contiguous gate/up product");
        };
        let values = &s.as_slice::<f32>()?[start..end];
        let rows = l.shape().dims2()?.0;
        let out = crate::cpu::gelu::geglu(values, self.inter, self.gelu);
        Ok((CpuStorage::F32(out), Shape::from((rows, self.inter))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// The fused CPU pass gives candle's ops' product, for both GELUs, on a product that is a
    /// view (narrowed) as well as a contiguous one: within 1e-6 of its size, plus 1e-7 of
    /// `|gate · up|` (candle's `1 + tanh` and `1 + erf` cancel in the negative tail, where
    /// ours does not: there candle is the less exact one).
    #[test]
    fn the_cpu_pass_is_candles_product() {
        let (rows, inter) = (33, 40);
        let gate_up = Tensor::randn(0f32, 2.0, (rows + 2, 2 * inter), &Device::Cpu).unwrap();
        for gelu in [Gelu::Tanh, Gelu::Erf] {
            for t in [gate_up.clone(), gate_up.narrow(0, 1, rows).unwrap()] {
                let got = values(&geglu(&t, inter, gelu).unwrap());
                let (gate, up) = (
                    t.narrow(1, 0, inter).unwrap(),
                    t.narrow(1, inter, inter).unwrap(),
                );
                let activated = match gelu {
                    Gelu::Tanh => gate.gelu().unwrap(),
                    Gelu::Erf => gate.gelu_erf().unwrap(),
                };
                let want = values(&(activated * &up).unwrap());
                let scale = values(&(gate * up).unwrap().abs().unwrap());
                assert_eq!(got.len(), want.len());
                for ((g, w), s) in got.iter().zip(&want).zip(&scale) {
                    assert!(
                        (g - w).abs() <= 1e-6 * w.abs() + 1e-7 * s,
                        "{gelu:?}: {g} against {w}"
                    );
                }
            }
        }
    }
}
