//! `config.json` of a Qwen3 model, with the Hugging Face key names.
//!
//! Only what the embedding forward pass needs is read; the rest of the file is ignored. A
//! config that describes something this crate does not implement (another `model_type`,
//! sliding-window attention, rope scaling, attention bias) is rejected at load time by
//! [`Config::validate`], never discovered mid-run.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{read_model_file, ModelError, ModelResult};
use crate::family::ModelShape;

/// The fields of a Qwen3 `config.json` that the embedding model uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Must be `"qwen3"`.
    #[serde(default)]
    pub model_type: Option<String>,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Qwen3 sets it explicitly (128 for all sizes); older configs derive it.
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    /// Irrelevant for embeddings (there is no LM head), kept so the file round-trips.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub use_sliding_window: bool,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
}

/// Why a `config.json` text is not a config of ours.
#[derive(Debug)]
pub enum ConfigError {
    Json(serde_json::Error),
    Unsupported(String),
}

fn default_act() -> String {
    "silu".to_string()
}

impl Config {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> ModelResult<Config> {
        let text = read_model_file(
            path,
            "a Hugging Face model directory has config.json next to the weights",
        )?;
        let cfg = Config::from_json(&text).map_err(|e| match e {
            ConfigError::Json(source) => ModelError::ConfigParse {
                path: path.to_path_buf(),
                cause: source,
            },
            ConfigError::Unsupported(reason) => ModelError::UnsupportedConfig {
                path: path.to_path_buf(),
                reason,
            },
        })?;
        cfg.validate()
            .map_err(|reason| ModelError::UnsupportedConfig {
                path: path.to_path_buf(),
                reason,
            })?;
        Ok(cfg)
    }

    /// Parses a `config.json` text, as transformers 4 writes it (`rope_theta` at the top) or
    /// as transformers 5 does (`rope_parameters: {rope_theta, rope_type}`).
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        let mut value: serde_json::Value = serde_json::from_str(text).map_err(ConfigError::Json)?;
        if let Some(obj) = value.as_object_mut() {
            if !obj.contains_key("rope_theta") {
                if let Some(params) = obj.get("rope_parameters").and_then(|p| p.as_object()) {
                    match params.get("rope_type").and_then(|t| t.as_str()) {
                        None | Some("default") => {}
                        Some(other) => {
                            return Err(ConfigError::Unsupported(format!(
                                "rope_parameters.rope_type `{other}` is not supported (only default RoPE)"
                            )))
                        }
                    }
                    if let Some(theta) = params.get("rope_theta").cloned() {
                        obj.insert("rope_theta".into(), theta);
                    }
                }
            }
        }
        serde_json::from_value(value).map_err(ConfigError::Json)
    }

    /// Per-head dimension: `head_dim`, or `hidden_size / num_attention_heads` when absent.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Query heads per key/value head (grouped-query attention).
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads.max(1)
    }

    /// Checks that this crate implements what the config describes; the error says what not.
    pub fn validate(&self) -> Result<(), String> {
        match self.model_type.as_deref() {
            Some("qwen3") => {}
            Some(other) => return Err(format!("model_type `{other}` is not qwen3")),
            None => return Err("model_type is missing (expected \"qwen3\")".into()),
        }
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("head_dim", self.head_dim()),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "head_dim {} must be even for RoPE",
                self.head_dim()
            ));
        }
        if self.hidden_act != "silu" {
            return Err(format!("hidden_act `{}` is not silu", self.hidden_act));
        }
        if self.attention_bias {
            return Err("attention_bias = true is not supported".into());
        }
        if self.use_sliding_window {
            return Err("sliding-window attention is not supported".into());
        }
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err("rope_scaling is not supported".into());
        }
        if !(self.rms_norm_eps > 0.0 && self.rope_theta > 0.0) {
            return Err("rms_norm_eps and rope_theta must be positive".into());
        }
        Ok(())
    }

    /// Number of parameters (embedding table, layers, final norm; no LM head).
    pub fn num_parameters(&self) -> u64 {
        let h = self.hidden_size as u64;
        let hd = self.head_dim() as u64;
        let q = self.num_attention_heads as u64 * hd;
        let kv = self.num_key_value_heads as u64 * hd;
        let i = self.intermediate_size as u64;
        let attn = h * q + 2 * h * kv + q * h + 2 * hd;
        let mlp = 3 * h * i;
        let layer = attn + mlp + 2 * h;
        self.vocab_size as u64 * h + self.num_hidden_layers as u64 * layer + h
    }

    /// The dimensions in the words every family shares.
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

    /// The Qwen3-Embedding-0.6B shape (used by benchmarks with random weights).
    pub fn qwen3_0_6b() -> Config {
        Config {
            model_type: Some("qwen3".into()),
            hidden_size: 1024,
            num_hidden_layers: 28,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            head_dim: Some(128),
            intermediate_size: 3072,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            vocab_size: 151_669,
            max_position_embeddings: 32_768,
            tie_word_embeddings: true,
            hidden_act: "silu".into(),
            attention_bias: false,
            use_sliding_window: false,
            rope_scaling: None,
        }
    }

    /// The Qwen3-Embedding-4B shape (the study's model; `bench-gpu` and the PyTorch peer).
    pub fn qwen3_4b() -> Config {
        Config {
            hidden_size: 2560,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            intermediate_size: 9728,
            vocab_size: 151_665,
            max_position_embeddings: 40_960,
            ..Config::qwen3_0_6b()
        }
    }

    /// The Qwen3-Embedding-8B shape.
    pub fn qwen3_8b() -> Config {
        Config {
            hidden_size: 4096,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            intermediate_size: 12_288,
            vocab_size: 151_665,
            max_position_embeddings: 40_960,
            ..Config::qwen3_0_6b()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_qwen3_config_parses() {
        let text = r#"{"architectures":["Qwen3ForCausalLM"],"attention_bias":false,
          "attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151643,"head_dim":128,
          "hidden_act":"silu","hidden_size":1024,"initializer_range":0.02,
          "intermediate_size":3072,"max_position_embeddings":32768,"max_window_layers":28,
          "model_type":"qwen3","num_attention_heads":16,"num_hidden_layers":28,
          "num_key_value_heads":8,"rms_norm_eps":1e-06,"rope_scaling":null,
          "rope_theta":1000000,"sliding_window":null,"tie_word_embeddings":true,
          "torch_dtype":"bfloat16","transformers_version":"4.51.3","use_cache":true,
          "use_sliding_window":false,"vocab_size":151669}"#;
        let cfg: Config = serde_json::from_str(text).unwrap();
        assert_eq!(cfg.validate(), Ok(()));
        assert_eq!(cfg, Config::qwen3_0_6b());
        // Qwen3-Embedding-0.6B has 595,776,512 parameters without the LM head.
        assert_eq!(cfg.num_parameters(), 595_776_512);
    }

    #[test]
    fn transformers_5_rope_parameters_read_as_rope_theta() {
        let v4 = serde_json::to_string(&Config::qwen3_0_6b()).unwrap();
        let mut v5: serde_json::Value = serde_json::from_str(&v4).unwrap();
        let obj = v5.as_object_mut().unwrap();
        obj.remove("rope_theta");
        obj.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_theta": 1000000.0, "rope_type": "default"}),
        );
        let text = v5.to_string();
        assert_eq!(Config::from_json(&text).unwrap(), Config::qwen3_0_6b());
        let yarn = text.replace("\"default\"", "\"yarn\"");
        match Config::from_json(&yarn) {
            Err(ConfigError::Unsupported(why)) => assert!(why.contains("yarn"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_other_models() {
        let mut cfg = Config::qwen3_0_6b();
        cfg.model_type = Some("llama".into());
        assert!(cfg.validate().unwrap_err().contains("llama"));
        let mut cfg = Config::qwen3_0_6b();
        cfg.num_key_value_heads = 3;
        assert!(cfg.validate().unwrap_err().contains("multiple"));
    }
}
