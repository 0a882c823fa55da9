//! The gated MLP's activation of the encoder families (GeGLU: ModernBERT's and Gemma 3's):
//! `gelu(gate) · up` of a `[rows, 2·inter]` gate/up product. On the CPU in f32, one vectorised
//! pass per row over the pool ([`crate::cpu::gelu`]); elsewhere (a GPU, bf16) candle's ops.

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};

pub use crate::cpu::gelu::Gelu;

/// `gelu(gate_up[:, ..inter]) · gate_up[:, inter..]`: `[rows, inter]`.
pub fn geglu(gate_up: &Tensor, inter: usize, gelu: Gelu) -> Result<Tensor> {
    let fused = gate_up.device().is_cpu()
        && gate_up.dtype() == DType::F32
        && gate_up.is_contiguous()
        && gate_up.dims() == [gate_up.dim(0)?, 2 * inter];
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

    /// The fused CPU pass gives candle's ops' product, for both GELUs, on a product that is a
    /// view (narrowed) as well as a contiguous one.
    #[test]
    fn the_cpu_pass_is_candles_product() {
        let (rows, inter) = (33, 40);
        let gate_up = Tensor::randn(0f32, 2.0, (rows + 2, 2 * inter), &Device::Cpu).unwrap();
        for gelu in [Gelu::Tanh, Gelu::Erf] {
            for t in [gate_up.clone(), gate_up.narrow(0, 1, rows).unwrap()] {
                let got: Vec<f32> = geglu(&t, inter, gelu)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let gate = t.narrow(1, 0, inter).unwrap();
                let gate = match gelu {
                    Gelu::Tanh => gate.gelu().unwrap(),
                    Gelu::Erf => gate.gelu_erf().unwrap(),
                };
                let want: Vec<f32> = (gate * t.narrow(1, inter, inter).unwrap())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                        "{gelu:?}: {g} against {w}"
                    );
                }
            }
        }
    }
}
