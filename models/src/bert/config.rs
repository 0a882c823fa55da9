//! `config.json` of a BERT, RoBERTa or XLM-RoBERTa model, with the Hugging Face key names.
//! What differs between the three is in [`Variant`]: RoBERTa and XLM-R count positions from
//! `pad_token_id + 1`, so their context is two shorter than their position table (514 → 512).

use std::path::Path;

use serde::Deserialize;

use crate::error::{read_model_file, ModelError, ModelResult};
use crate::family::ModelShape;

/// Which of the three `model_type`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Bert,
    Roberta,
    XlmRoberta,
}

impl Variant {
    pub fn model_type(self) -> &'static str {
        match self {
            Variant::Bert => "bert",
            Variant::Roberta => "roberta",
            Variant::XlmRoberta => "xlm-roberta",
        }
    }

    /// Whether positions count from `pad_token_id + 1` (RoBERTa's embeddings).
    pub fn offsets_positions(self) -> bool {
        self != Variant::Bert
    }
}

/// The fields of the config the forward pass uses.
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
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub pad_token_id: Option<usize>,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
}

fn gelu() -> String {
    "gelu".into()
}
fn two() -> usize {
    2
}
fn eps() -> f64 {
    1e-12
}

/// The activations of the feed-forward block transformers' BERT takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `gelu`: the exact, erf form.
    GeluErf,
    /// `gelu_new`, `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
    Relu,
}

impl Config {
    /// Reads and checks `config.json` as `variant`'s.
    pub fn from_file(path: &Path, variant: Variant) -> ModelResult<Config> {
        let text = read_model_file(
            path,
            "a Hugging Face model directory has config.json next to the weights",
        )?;
        let cfg: Config =
            serde_json::from_str(&text).map_err(|source| ModelError::ConfigParse {
                path: path.to_path_buf(),
                cause: source,
            })?;
        cfg.validate(variant)
            .map_err(|reason| ModelError::UnsupportedConfig {
                path: path.to_path_buf(),
                reason,
            })?;
        Ok(cfg)
    }

    fn validate(&self, variant: Variant) -> Result<(), String> {
        if self.model_type.as_deref() != Some(variant.model_type()) {
            return Err(format!(
                "model_type {:?} is not `{}`",
                self.model_type,
                variant.model_type()
            ));
        }
        if let Some(kind) = self.position_embedding_type.as_deref() {
            if kind != "absolute" {
                return Err(format!(
                    "position_embedding_type `{kind}` is not implemented (absolute is)"
                ));
            }
        }
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.type_vocab_size == 0 {
            return Err("type_vocab_size is 0: the embeddings need token type 0".into());
        }
        self.activation()?;
        if variant.offsets_positions() && self.position_offset() >= self.max_position_embeddings {
            return Err(format!(
                "pad_token_id {:?} leaves no position of {}",
                self.pad_token_id, self.max_position_embeddings
            ));
        }
        Ok(())
    }

    /// The feed-forward activation `hidden_act` names.
    pub fn activation(&self) -> Result<Activation, String> {
        match self.hidden_act.as_str() {
            "gelu" => Ok(Activation::GeluErf),
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            "relu" => Ok(Activation::Relu),
            other => Err(format!(
                "hidden_act `{other}` is not implemented (gelu, gelu_new, gelu_pytorch_tanh, relu are)"
            )),
        }
    }

    /// Where RoBERTa's positions start: `pad_token_id + 1` (2 for the usual pad id 1).
    pub fn position_offset(&self) -> usize {
        self.pad_token_id.unwrap_or(1) + 1
    }

    /// The longest sequence the position table takes.
    pub fn context(&self, variant: Variant) -> usize {
        if variant.offsets_positions() {
            self.max_position_embeddings - self.position_offset()
        } else {
            self.max_position_embeddings
        }
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Parameters of the encoder (no pooler).
    pub fn num_parameters(&self) -> u64 {
        let (h, i) = (self.hidden_size as u64, self.intermediate_size as u64);
        let embeddings =
            (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) as u64 * h
                + 2 * h;
        let layer = 4 * (h * h + h) + 2 * h * i + i + h + 4 * h;
        embeddings + self.num_hidden_layers as u64 * layer
    }

    pub fn shape(&self, variant: Variant) -> ModelShape {
        ModelShape {
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            head_dim: self.head_dim(),
            vocab_size: self.vocab_size,
            max_position_embeddings: self.context(variant),
            parameters: self.num_parameters(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, variant: Variant) -> Result<Config, String> {
        let cfg: Config = serde_json::from_str(text).map_err(|e| e.to_string())?;
        cfg.validate(variant).map(|()| cfg)
    }

    const MINILM: &str = r#"{"model_type":"bert","vocab_size":30522,"hidden_size":384,
        "num_hidden_layers":6,"num_attention_heads":12,"intermediate_size":1536,
        "hidden_act":"gelu","max_position_embeddings":512,"type_vocab_size":2,
        "layer_norm_eps":1e-12,"pad_token_id":0,"position_embedding_type":"absolute"}"#;

    #[test]
    fn a_hub_bert_config_reads_and_roberta_counts_its_positions_from_the_pad() {
        let cfg = parse(MINILM, Variant::Bert).unwrap();
        assert_eq!(cfg.context(Variant::Bert), 512);
        assert_eq!(cfg.activation(), Ok(Activation::GeluErf));
        let m3 = r#"{"model_type":"xlm-roberta","vocab_size":250002,"hidden_size":1024,
            "num_hidden_layers":24,"num_attention_heads":16,"intermediate_size":4096,
            "hidden_act":"gelu","max_position_embeddings":8194,"type_vocab_size":1,
            "layer_norm_eps":1e-05,"pad_token_id":1}"#;
        let cfg = parse(m3, Variant::XlmRoberta).unwrap();
        assert_eq!(cfg.context(Variant::XlmRoberta), 8192);
        assert_eq!(cfg.shape(Variant::XlmRoberta).max_position_embeddings, 8192);
    }

    #[test]
    fn what_we_do_not_compute_is_refused_with_the_reason() {
        let relative = MINILM.replace("\"absolute\"", "\"relative_key\"");
        assert!(parse(&relative, Variant::Bert)
            .unwrap_err()
            .contains("position_embedding_type `relative_key`"));
        let silu = MINILM.replace("\"hidden_act\":\"gelu\"", "\"hidden_act\":\"silu\"");
        assert!(parse(&silu, Variant::Bert)
            .unwrap_err()
            .contains("hidden_act `silu`"));
        assert!(parse(MINILM, Variant::Roberta)
            .unwrap_err()
            .contains("is not `roberta`"));
    }
}
