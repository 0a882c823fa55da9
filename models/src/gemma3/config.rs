//! `config.json` of a Gemma 3 text model as EmbeddingGemma uses it (`gemma3_text` with
//! `use_bidirectional_attention`), as transformers 4 wrote it (`rope_theta`,
//! `rope_local_base_freq`, `sliding_window_pattern`) and as transformers 5 writes it
//! (`layer_types`, `rope_parameters` per layer type): both are read. `sliding_window` is the
//! file's value; a local layer's query sees `sliding_window / 2` keys either side (transformers'
//! bidirectional sliding mask).

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{read_model_file, ModelResult};
use crate::family::ModelShape;
pub use crate::layer_kinds::LayerKind;
use crate::layer_kinds::{layer_kinds, rope_theta, ConfigError};

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub model_type: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    #[serde(default = "act")]
    pub hidden_activation: String,
    pub max_position_embeddings: usize,
    #[serde(default = "eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "scalar")]
    pub query_pre_attn_scalar: f64,
    pub sliding_window: usize,
    #[serde(default)]
    pub use_bidirectional_attention: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(skip)]
    pub layers: Vec<LayerKind>,
    #[serde(skip)]
    pub global_rope_theta: f64,
    #[serde(skip)]
    pub local_rope_theta: f64,
}

fn act() -> String {
    "gelu_pytorch_tanh".into()
}
fn eps() -> f64 {
    1e-6
}
fn scalar() -> f64 {
    256.0
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
        let value: Value = serde_json::from_str(text).map_err(ConfigError::Json)?;
        let mut cfg: Config = serde_json::from_value(value.clone()).map_err(ConfigError::Json)?;
        let no = |reason: String| Err(ConfigError::Unsupported(reason));
        if cfg.model_type.as_deref() != Some("gemma3_text") {
            return no(format!(
                "model_type {:?} is not `gemma3_text`",
                cfg.model_type
            ));
        }
        if !cfg.use_bidirectional_attention {
            return no(
                "use_bidirectional_attention is false: this is a Gemma 3 language model \
                       (causal), not an embedding model such as EmbeddingGemma"
                    .into(),
            );
        }
        if cfg.attention_bias {
            return no("attention_bias is true; Gemma 3's projections have no bias".into());
        }
        if cfg.attn_logit_softcapping.is_some() {
            return no(
                "attn_logit_softcapping is set; Gemma 3 has none and it is not implemented".into(),
            );
        }
        if cfg.hidden_activation != "gelu_pytorch_tanh" {
            return no(format!(
                "hidden_activation `{}` is not implemented (gelu_pytorch_tanh is)",
                cfg.hidden_activation
            ));
        }
        if cfg.num_key_value_heads == 0
            || !cfg
                .num_attention_heads
                .is_multiple_of(cfg.num_key_value_heads)
        {
            return no(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                cfg.num_attention_heads, cfg.num_key_value_heads
            ));
        }
        let pattern = ["sliding_window_pattern", "_sliding_window_pattern"]
            .iter()
            .find_map(|k| value.get(*k).and_then(Value::as_u64))
            .unwrap_or(6)
            .max(1) as usize;
        cfg.layers = layer_kinds(&value, cfg.num_hidden_layers, |i| {
            if (i + 1) % pattern == 0 {
                LayerKind::Global
            } else {
                LayerKind::Local
            }
        })?;
        if value.get("rope_scaling").is_some_and(|s| !s.is_null())
            && value
                .pointer("/rope_parameters/full_attention/rope_theta")
                .is_none()
        {
            return no("rope_scaling is set; scaled rope is not implemented".into());
        }
        cfg.global_rope_theta = rope_theta(&value, "full_attention", "rope_theta", 1_000_000.0)?;
        cfg.local_rope_theta = rope_theta(
            &value,
            "sliding_attention",
            "rope_local_base_freq",
            10_000.0,
        )?;
        Ok(cfg)
    }

    /// Keys either side a local layer's query sees.
    pub fn half_window(&self) -> usize {
        self.sliding_window / 2
    }

    /// The embeddings' scale, `sqrt(hidden)`, rounded to f32 as transformers' buffer is.
    pub fn embed_scale(&self) -> f32 {
        (self.hidden_size as f64).sqrt() as f32
    }

    pub fn num_parameters(&self) -> u64 {
        let (h, i, hd) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.head_dim as u64,
        );
        let (q, kv) = (
            self.num_attention_heads as u64 * hd,
            self.num_key_value_heads as u64 * hd,
        );
        let layer = h * q + 2 * h * kv + q * h + 3 * h * i + 4 * h + 2 * hd;
        self.vocab_size as u64 * h + self.num_hidden_layers as u64 * layer + h
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape {
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            head_dim: self.head_dim,
            vocab_size: self.vocab_size,
            max_position_embeddings: self.max_position_embeddings,
            parameters: self.num_parameters(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// google/embeddinggemma-300m's keys, as transformers 4 wrote them.
    const HUB: &str = r#"{"model_type":"gemma3_text","vocab_size":262144,"hidden_size":768,
        "intermediate_size":1152,"num_hidden_layers":24,"num_attention_heads":3,
        "num_key_value_heads":1,"head_dim":256,"hidden_activation":"gelu_pytorch_tanh",
        "max_position_embeddings":2048,"rms_norm_eps":1e-06,"query_pre_attn_scalar":256,
        "sliding_window":512,"_sliding_window_pattern":6,"rope_theta":1000000.0,
        "rope_local_base_freq":10000.0,"use_bidirectional_attention":true,
        "attn_logit_softcapping":null,"final_logit_softcapping":null}"#;

    #[test]
    fn embeddinggemmas_config_reads_in_both_key_sets() {
        let old = Config::from_json(HUB).unwrap();
        let globals: Vec<usize> = (0..24)
            .filter(|&i| old.layers[i] == LayerKind::Global)
            .collect();
        assert_eq!(globals, [5, 11, 17, 23]);
        assert_eq!(old.half_window(), 256);
        // The masks the fused kernel is self-tested and planned for, each once: the local
        // layers' band (cuDNN's left bound 257, right bound 256), then the global layers'.
        assert_eq!(
            crate::layer_kinds::masks_of(&old.layers, old.half_window()),
            [
                crate::attention::Mask::Window {
                    left: 256,
                    right: 256
                },
                crate::attention::Mask::Full
            ]
        );
        assert_eq!((old.global_rope_theta, old.local_rope_theta), (1e6, 1e4));
        let mut new: Value = serde_json::from_str(HUB).unwrap();
        let obj = new.as_object_mut().unwrap();
        for key in [
            "rope_theta",
            "rope_local_base_freq",
            "_sliding_window_pattern",
        ] {
            obj.remove(key);
        }
        let types: Vec<&str> = old
            .layers
            .iter()
            .map(|k| match k {
                LayerKind::Global => "full_attention",
                LayerKind::Local => "sliding_attention",
            })
            .collect();
        obj.insert("layer_types".into(), serde_json::json!(types));
        obj.insert(
            "rope_parameters".into(),
            serde_json::json!({"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                               "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}),
        );
        assert_eq!(Config::from_json(&new.to_string()).unwrap(), old);
    }

    #[test]
    fn a_causal_gemma_is_refused() {
        let causal = HUB.replace(
            "\"use_bidirectional_attention\":true",
            "\"use_bidirectional_attention\":false",
        );
        let Err(ConfigError::Unsupported(why)) = Config::from_json(&causal) else {
            panic!("accepted")
        };
        assert!(why.contains("not an embedding model"), "{why}");
    }
}
