//! The Qwen3 family (Qwen3-Embedding 0.6B, 4B, 8B): everything that is Qwen3's, behind
//! [`Qwen3`], its [`ModelFamily`].
//!
//! - `config.rs`: `config.json` with the Hugging Face key names, checked at load.
//! - `model.rs`: the forward pass (the decoder stack of `Qwen3Model`, no LM head).
//! - `embedder.rs`: [`Qwen3Embedder`], a loaded directory behind the `Embedder` trait.
//! - `memory.rs`: the memory estimate of a forward and the token budget.
//! - `tiny.rs`, `vocab.rs`: the tiny random model and the byte-level BPE `tokenizer.json`s.
//!
//! Its text conventions: every input ends with `<|endoftext|>`, whose final hidden state is
//! the embedding (last-token pooling); a query reads `Instruct: {task}\nQuery:{text}`.

pub mod config;
pub mod embedder;
pub mod memory;
pub mod model;
pub mod tiny;
pub mod vocab;

use std::path::{Path, PathBuf};

pub use config::{Config, ConfigError};
pub use embedder::Qwen3Embedder;
pub use model::Qwen3Model;
pub use tiny::{random_weights, tiny_config, TINY_MERGES};

use crate::embedder::Embedder;
use crate::error::ModelResult;
use crate::family::{LoadOptions, ModelFamily, ModelShape, ModelSummary};
use crate::sentence::{LayoutDefaults, Pooling};
use crate::tiny::TinyModelOptions;
use crate::tokenizer::{QueryFormat, Specials, TextFormat};
use crate::verify::{check_model_dir, Expected};

/// The end-of-text token appended to every input.
pub const EOS_TOKEN: &str = "<|endoftext|>";

/// Qwen3-Embedding's query format: `Instruct: {task}\nQuery:{text}`.
pub fn format_query(instruction: &str, text: &str) -> String {
    format!("Instruct: {instruction}\nQuery:{text}")
}

/// Qwen3's text conventions.
pub const TEXT_FORMAT: TextFormat = TextFormat {
    family: "Qwen3",
    specials: Specials::Eos(EOS_TOKEN),
    query: QueryFormat::Instructed(format_query),
    legacy_strip: false,
    default_tokenizer_class: None,
};

/// The Qwen3 family, as the registry lists it.
#[derive(Debug, Clone, Copy)]
pub struct Qwen3;

impl Qwen3 {
    fn config(dir: &Path) -> ModelResult<Config> {
        Config::from_file(&dir.join("config.json"))
    }
}

impl ModelFamily for Qwen3 {
    fn model_type(&self) -> &'static str {
        "qwen3"
    }

    fn architectures(&self) -> &'static [&'static str] {
        &["Qwen3Model", "Qwen3ForCausalLM"]
    }

    fn name(&self) -> &'static str {
        "Qwen3"
    }

    fn text_format(&self) -> TextFormat {
        TEXT_FORMAT
    }

    /// Last-token pooling is the model's own (the final norm runs on the pooled rows only);
    /// a Qwen3-Embedding download's files say the same. Its query prompt is its instruction
    /// format, so the files' `query` prompt is not read as one.
    fn layout_defaults(&self) -> LayoutDefaults {
        LayoutDefaults {
            pooling: Pooling::LastToken,
            poolings: &[Pooling::LastToken],
            dense: false,
            query_prompt: "",
            document_prompt: "",
            say_when_used: false,
        }
    }

    /// The web-search task of Qwen3-Embedding's model card.
    fn default_instruction(&self) -> &'static str {
        "Given a web search query, retrieve relevant passages that answer the query"
    }

    fn example_checkpoint(&self) -> &'static str {
        "Qwen/Qwen3-Embedding-4B"
    }

    fn load(&self, dir: &Path, opts: &LoadOptions) -> ModelResult<Box<dyn Embedder>> {
        self.layout(dir)?;
        Ok(Box::new(Qwen3Embedder::load(dir, opts)?))
    }

    fn shape(&self, dir: &Path) -> ModelResult<ModelShape> {
        Ok(Self::config(dir)?.shape())
    }

    /// Checks the embedding table and the last layer's down projection against the config.
    fn verify(&self, dir: &Path) -> ModelResult<ModelSummary> {
        let config = Self::config(dir)?;
        self.layout(dir)?;
        let (hidden, layers) = (config.hidden_size, config.num_hidden_layers);
        let last = format!("layers.{}.mlp.down_proj.weight", layers.saturating_sub(1));
        check_model_dir(
            dir,
            Expected {
                model_type: self.model_type(),
                shape: config.shape(),
                tensors: vec![
                    (
                        "embed_tokens.weight".into(),
                        vec![config.vocab_size, hidden],
                    ),
                    (last, vec![hidden, config.intermediate_size]),
                ],
                text_format: TEXT_FORMAT,
            },
        )
    }

    fn write_tiny_model(&self, dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>> {
        tiny::write_tiny_model(dir, opts)
    }
}
