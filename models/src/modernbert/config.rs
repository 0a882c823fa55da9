//! `config.json` of a ModernBERT model, as transformers 4 wrote it (`global_rope_theta`,
//! `local_rope_theta`, `global_attn_every_n_layers`) and as transformers 5 writes it
//! (`layer_types`, `rope_parameters` per layer type): both are read.

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
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "gelu")]
    pub hidden_activation: String,
    #[serde(default = "positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "eps")]
    pub norm_eps: f64,
    #[serde(default)]
    pub norm_bias: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "window")]
    pub local_attention: usize,
    /// Each layer's kind, resolved from either key set (see [`Config::from_json`]).
    #[serde(skip)]
    pub layers: Vec<LayerKind>,
    #[serde(skip)]
    pub global_rope_theta: f64,
    #[serde(skip)]
    pub local_rope_theta: f64,
}

fn gelu() -> String {
    "gelu".into()
}
fn positions() -> usize {
    8192
}
fn eps() -> f64 {
    1e-5
}
fn window() -> usize {
    128
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
        if cfg.model_type.as_deref() != Some("modernbert") {
            return Err(ConfigError::Unsupported(format!(
                "model_type {:?} is not `modernbert`",
                cfg.model_type
            )));
        }
        let every = value
            .get("global_attn_every_n_layers")
            .and_then(Value::as_u64)
            .unwrap_or(3)
            .max(1) as usize;
        cfg.layers = layer_kinds(&value, cfg.num_hidden_layers, |i| {
            if i % every == 0 {
                LayerKind::Global
            } else {
                LayerKind::Local
            }
        })?;
        cfg.global_rope_theta =
            rope_theta(&value, "full_attention", "global_rope_theta", 160_000.0)?;
        cfg.local_rope_theta =
            rope_theta(&value, "sliding_attention", "local_rope_theta", 10_000.0)?;
        if cfg.num_attention_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads)
        {
            return Err(ConfigError::Unsupported(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                cfg.hidden_size, cfg.num_attention_heads
            )));
        }
        if !matches!(
            cfg.hidden_activation.as_str(),
            "gelu" | "gelu_new" | "gelu_pytorch_tanh"
        ) {
            return Err(ConfigError::Unsupported(format!(
                "hidden_activation `{}` is not implemented (gelu, gelu_new, gelu_pytorch_tanh are)",
                cfg.hidden_activation
            )));
        }
        Ok(cfg)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Keys either side a local layer's query sees: transformers' `sliding_window`.
    pub fn half_window(&self) -> usize {
        self.local_attention / 2
    }

    /// Whether the feed-forward GELU is the exact (erf) one.
    pub fn exact_gelu(&self) -> bool {
        self.hidden_activation == "gelu"
    }

    pub fn num_parameters(&self) -> u64 {
        let (h, i, v) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.vocab_size as u64,
        );
        let layer = 3 * h * h + h * h + 2 * i * h + i * h + 2 * h;
        v * h + h + self.num_hidden_layers as u64 * layer + h
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape {
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            head_dim: self.head_dim(),
            vocab_size: self.vocab_size,
            max_position_embeddings: self.max_position_embeddings,
            parameters: self.num_parameters(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Alibaba-NLP/gte-modernbert-base's keys (transformers 4).
    const HUB: &str = r#"{"model_type":"modernbert","vocab_size":50368,"hidden_size":768,
        "num_hidden_layers":22,"num_attention_heads":12,"intermediate_size":1152,
        "hidden_activation":"gelu","max_position_embeddings":8192,"norm_eps":1e-05,
        "norm_bias":false,"global_rope_theta":160000.0,"local_rope_theta":10000.0,
        "global_attn_every_n_layers":3,"local_attention":128}"#;

    #[test]
    fn both_key_sets_give_the_same_layers_and_thetas() {
        let old = Config::from_json(HUB).unwrap();
        assert_eq!(
            old.layers[..4],
            [
                LayerKind::Global,
                LayerKind::Local,
                LayerKind::Local,
                LayerKind::Global
            ]
        );
        assert_eq!(
            (old.global_rope_theta, old.local_rope_theta),
            (160_000.0, 10_000.0)
        );
        assert_eq!(old.half_window(), 64);
        let mut new: Value = serde_json::from_str(HUB).unwrap();
        let obj = new.as_object_mut().unwrap();
        for key in [
            "global_rope_theta",
            "local_rope_theta",
            "global_attn_every_n_layers",
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
            serde_json::json!({"full_attention": {"rope_theta": 160000.0, "rope_type": "default"},
                               "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}),
        );
        let new = Config::from_json(&new.to_string()).unwrap();
        assert_eq!(new, old);
    }

    #[test]
    fn scaled_rope_is_refused() {
        let text = HUB.replace(
            "\"local_attention\":128",
            "\"local_attention\":128,\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"yarn\",\"rope_theta\":1.0}}",
        );
        let Err(ConfigError::Unsupported(why)) = Config::from_json(&text) else {
            panic!("accepted")
        };
        assert!(why.contains("rope_type `yarn`"), "{why}");
    }
}
