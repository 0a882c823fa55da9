//! Rotary position embeddings for the encoders (ModernBERT, Gemma 3), as transformers' default
//! rope computes them: `inv_freq = 1 / theta^(2i/d)` and each angle `position × inv_freq` in
//! f32, rotate-half (NeoX) layout. A table per theta is kept on the device for every position
//! the model takes; a forward gathers its tokens' rows, positions restarting at 0 in each
//! sequence of the packed batch. (Qwen3 keeps its own table, fused with its q/k norm on a GPU.)

use candle_core::{DType, Device, Result, Tensor};

use crate::packed::SeqSpan;

/// cos and sin of every position's angles, `[positions, head_dim / 2]` each.
pub struct RopeTable {
    cos: Tensor,
    sin: Tensor,
}

/// The rows of one packed batch, `[T, head_dim / 2]` each.
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl RopeTable {
    pub fn new(
        theta: f64,
        head_dim: usize,
        positions: usize,
        dtype: DType,
        dev: &Device,
    ) -> Result<RopeTable> {
        let half = head_dim / 2;
        let theta = theta as f32;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let (mut cos, mut sin) = (
            Vec::with_capacity(positions * half),
            Vec::with_capacity(positions * half),
        );
        for pos in 0..positions {
            for f in &inv_freq {
                let angle = pos as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Ok(RopeTable {
            cos: Tensor::from_vec(cos, (positions, half), dev)?.to_dtype(dtype)?,
            sin: Tensor::from_vec(sin, (positions, half), dev)?.to_dtype(dtype)?,
        })
    }

    /// The rows of the tokens of `spans`, positions from 0 in each.
    pub fn gather(&self, spans: &[SeqSpan]) -> Result<Rope> {
        let positions: Vec<u32> = spans.iter().flat_map(|s| 0..s.len as u32).collect();
        let positions = Tensor::new(positions.as_slice(), self.cos.device())?;
        Ok(Rope {
            cos: self.cos.index_select(&positions, 0)?,
            sin: self.sin.index_select(&positions, 0)?,
        })
    }
}

impl Rope {
    /// `x` (`[T, heads, hd]`) rotated, token-major.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?.unsqueeze(0)?;
        candle_nn::rotary_emb::rope_thd(&x, &self.cos, &self.sin)?.squeeze(0)
    }
}
