//! `config.json` of a NomicBERT model (`model_type: nomic_bert`), as nomic's own code
//! (`NomicBertConfig`, loaded by the model card's remote code: transformers has no class for
//! it) writes it: GPT-2's key names (`n_embd`, `n_layer`, `n_head`, `n_inner`, `n_positions`)
//! and the rotary ones. What this build does not implement is refused by name.

use std::path::Path;

use serde::Deserialize;

use crate::error::{read_model_file, ModelResult};
use crate::family::ModelShape;
use crate::layer_kinds::ConfigError;

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub model_type: Option<String>,
    pub vocab_size: usize,
    /// Hidden size.
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// The feed-forward width (`None`: 4 × `n_embd`, nomic's default).
    #[serde(default)]
    pub n_inner: Option<usize>,
    /// Positions the model takes.
    #[serde(default = "positions")]
    pub n_positions: usize,
    #[serde(default = "type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "one")]
    pub rotary_emb_fraction: f64,
    #[serde(default = "base")]
    pub rotary_emb_base: f64,
    #[serde(default)]
    pub rotary_emb_interleaved: bool,
    #[serde(default)]
    pub rotary_scaling_factor: Option<f64>,
    #[serde(default = "yes")]
    pub qkv_proj_bias: bool,
    #[serde(default = "yes")]
    pub mlp_fc1_bias: bool,
    #[serde(default = "yes")]
    pub mlp_fc2_bias: bool,
    #[serde(default = "swiglu")]
    pub activation_function: String,
    #[serde(default)]
    pub prenorm: bool,
    #[serde(default)]
    pub causal: bool,
    #[serde(default)]
    pub use_rms_norm: Option<bool>,
    #[serde(default = "yes")]
    pub scale_attn_weights: bool,
}

fn positions() -> usize {
    2048
}
fn type_vocab() -> usize {
    2
}
fn eps() -> f64 {
    1e-12
}
fn one() -> f64 {
    1.0
}
fn base() -> f64 {
    10_000.0
}
fn yes() -> bool {
    true
}
fn swiglu() -> String {
    "swiglu".into()
}

impl Config {
    pub fn from_file(path: &Path) -> ModelResult<Config> {
        let text = read_model_file(
            path,
            "a Hugging Face model directory has config.json next to the weights",
        )?;
        Config::from_json(&text).map_err(|e| e.at(path))
    }

    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = serde_json::from_str(text).map_err(ConfigError::Json)?;
        let refuse = |why: String| Err(ConfigError::Unsupported(why));
        if cfg.model_type.as_deref() != Some("nomic_bert") {
            return refuse(format!(
                "model_type {:?} is not `nomic_bert`",
                cfg.model_type
            ));
        }
        if cfg.n_head == 0 || !cfg.n_embd.is_multiple_of(cfg.n_head) {
            return refuse(format!(
                "n_embd {} is not a multiple of n_head {}",
                cfg.n_embd, cfg.n_head
            ));
        }
        // Each of these is a variant of nomic's code that no published embedder uses; refused
        // rather than computed some other way.
        if cfg.activation_function != "swiglu" {
            return refuse(format!(
                "activation_function `{}` is not implemented (nomic-embed-text's `swiglu` is)",
                cfg.activation_function
            ));
        }
        if cfg.rotary_emb_fraction != 1.0 || cfg.rotary_emb_interleaved {
            return refuse(
                "rotary over part of each head, or interleaved, is not implemented (nomic-embed-text \
                 rotates whole heads in halves: rotary_emb_fraction 1.0, not interleaved)"
                    .into(),
            );
        }
        if let Some(factor) = cfg.rotary_scaling_factor {
            return refuse(format!(
                "rotary_scaling_factor {factor} (dynamic NTK scaling past the trained positions) \
                 is not implemented; nomic-embed-text-v1.5 has none"
            ));
        }
        if cfg.prenorm || cfg.causal || cfg.use_rms_norm == Some(true) || !cfg.scale_attn_weights {
            return refuse(
                "prenorm, causal, use_rms_norm or an unscaled attention is not implemented \
                 (nomic-embed-text: post-norm LayerNorm, bidirectional, scaled)"
                    .into(),
            );
        }
        Ok(cfg)
    }

    pub fn hidden_size(&self) -> usize {
        self.n_embd
    }

    pub fn intermediate_size(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }

    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    pub fn num_parameters(&self) -> u64 {
        let (h, i, v, t) = (
            self.n_embd as u64,
            self.intermediate_size() as u64,
            self.vocab_size as u64,
            self.type_vocab_size as u64,
        );
        let bias = |on: bool, n: u64| if on { n } else { 0 };
        let attention = 4 * h * h + bias(self.qkv_proj_bias, 4 * h);
        let mlp = 3 * i * h + bias(self.mlp_fc1_bias, 2 * i) + bias(self.mlp_fc2_bias, h);
        (v + t) * h + 2 * h + self.n_layer as u64 * (attention + mlp + 4 * h)
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape {
            hidden_size: self.n_embd,
            num_hidden_layers: self.n_layer,
            num_attention_heads: self.n_head,
            head_dim: self.head_dim(),
            vocab_size: self.vocab_size,
            max_position_embeddings: self.n_positions,
            parameters: self.num_parameters(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nomic-ai/nomic-embed-text-v1.5's config.json, its keys that matter.
    const V15: &str = r#"{"model_type":"nomic_bert","architectures":["NomicBertModel"],
        "vocab_size":30528,"n_embd":768,"n_layer":12,"n_head":12,"n_inner":3072,
        "n_positions":8192,"type_vocab_size":2,"layer_norm_epsilon":1e-12,
        "rotary_emb_fraction":1.0,"rotary_emb_base":1000,"rotary_emb_interleaved":false,
        "rotary_scaling_factor":null,"qkv_proj_bias":false,"mlp_fc1_bias":false,
        "mlp_fc2_bias":false,"activation_function":"swiglu","prenorm":false,"causal":false,
        "scale_attn_weights":true,"max_trained_positions":2048}"#;

    #[test]
    fn nomic_embed_text_v1_5_reads_as_137_million_parameters_and_8192_tokens() {
        let cfg = Config::from_json(V15).unwrap();
        assert_eq!((cfg.head_dim(), cfg.intermediate_size()), (64, 3072));
        let shape = cfg.shape();
        assert_eq!(shape.max_position_embeddings, 8192);
        // The model card's 137 M.
        assert_eq!(shape.parameters / 1_000_000, 136, "{}", shape.parameters);
    }

    #[test]
    fn what_is_not_implemented_is_refused_by_name() {
        for (change, named) in [
            (
                "\"activation_function\":\"gelu\"",
                "activation_function `gelu`",
            ),
            ("\"rotary_scaling_factor\":2.0", "rotary_scaling_factor 2"),
            ("\"rotary_emb_fraction\":0.5", "rotary over part"),
            ("\"prenorm\":true", "prenorm"),
        ] {
            let key = change.split(':').next().unwrap();
            let start = V15.find(key).unwrap();
            let end = start + V15[start..].find([',', '}']).unwrap();
            let text = format!("{}{change}{}", &V15[..start], &V15[end..]);
            let Err(ConfigError::Unsupported(why)) = Config::from_json(&text) else {
                panic!("{change} accepted")
            };
            assert!(why.contains(named), "{change}: {why}");
        }
    }
}
