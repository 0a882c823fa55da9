//! What follows the transformer, computed: pooling the packed hidden states into one row per
//! sequence, then the dense projections, as the directory's [`SentenceLayout`] says.
//! Normalisation is the embedder's last step (with a Matryoshka cut, `crate::matryoshka`).

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::Linear;

use super::layout::{DenseActivation, Pooling, SentenceLayout};
use crate::error::ModelResult;
use crate::packed::SeqSpan;
use crate::weights::Weights;

/// A loaded pooling and dense stack.
pub struct SentenceHead {
    pooling: Pooling,
    dense: Vec<(Linear, DenseActivation)>,
}

impl SentenceHead {
    /// Loads the dense modules of `layout` (each checked against its `config.json`'s widths,
    /// the first against the model's `hidden`) on `device` in `dtype`.
    pub fn load(
        layout: &SentenceLayout,
        hidden: usize,
        dtype: DType,
        device: &Device,
    ) -> ModelResult<SentenceHead> {
        let mut width = hidden;
        let mut dense = Vec::with_capacity(layout.dense.len());
        for spec in &layout.dense {
            let w = Weights::open(&spec.dir, dtype, device)?;
            let weight = w.get("linear.weight", &[spec.out_features, width])?;
            let bias = if spec.bias {
                Some(w.get("linear.bias", &[spec.out_features])?)
            } else {
                None
            };
            dense.push((Linear::new(weight, bias), spec.activation));
            width = spec.out_features;
        }
        Ok(SentenceHead {
            pooling: layout.pooling,
            dense,
        })
    }

    /// One row per span of `hidden` (`[T, H]`, packed), through the dense modules: `[n, out]`
    /// in f32.
    pub fn apply(&self, hidden: &Tensor, spans: &[SeqSpan]) -> Result<Tensor> {
        let mut x = pool(hidden, spans, self.pooling)?;
        for (linear, activation) in &self.dense {
            x = linear.forward(&x)?;
            if *activation == DenseActivation::Tanh {
                x = x.tanh()?;
            }
        }
        x.to_dtype(DType::F32)
    }
}

/// One row per span: its first token's, its last token's, or the mean of its tokens
/// (accumulated in f32 whatever the model's dtype, as sentence-transformers does for half types).
pub fn pool(hidden: &Tensor, spans: &[SeqSpan], pooling: Pooling) -> Result<Tensor> {
    let pick = |rows: Vec<u32>| -> Result<Tensor> {
        let rows = Tensor::new(rows.as_slice(), hidden.device())?;
        hidden.index_select(&rows, 0)
    };
    match pooling {
        Pooling::Cls => pick(spans.iter().map(|s| s.start as u32).collect()),
        Pooling::LastToken => pick(spans.iter().map(|s| (s.start + s.len - 1) as u32).collect()),
        Pooling::Mean => {
            let means = spans
                .iter()
                .map(|s| {
                    hidden
                        .narrow(0, s.start, s.len)?
                        .to_dtype(DType::F32)?
                        .mean_keepdim(0)
                })
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&means, 0)?.to_dtype(hidden.dtype())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pooling_reads_its_rows_of_each_span() {
        let hidden = Tensor::new(
            &[[1f32, 0.], [3., 2.], [5., 4.], [7., 6.], [9., 8.]],
            &Device::Cpu,
        )
        .unwrap();
        let spans = [SeqSpan { start: 0, len: 2 }, SeqSpan { start: 2, len: 3 }];
        let rows = |p| pool(&hidden, &spans, p).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(rows(Pooling::Cls), vec![vec![1., 0.], vec![5., 4.]]);
        assert_eq!(rows(Pooling::LastToken), vec![vec![3., 2.], vec![9., 8.]]);
        assert_eq!(rows(Pooling::Mean), vec![vec![2., 1.], vec![7., 6.]]);
    }
}
