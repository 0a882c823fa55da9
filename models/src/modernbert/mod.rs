//! The ModernBERT family (`modernbert`): Alibaba-NLP/gte-modernbert-base, nomic-ai's
//! modernbert-embed-base, answerdotai's ModernBERT; 8,192 tokens.
//!
//! - `config.rs`: `config.json` in both transformers' key sets.
//! - `model.rs`: the forward pass (alternating global and local attention).
//! - `tiny.rs`: the tiny random model.
//!
//! Without sentence-transformers files: CLS pooling (gte-modernbert's), no prompt.

pub mod config;
pub mod model;
pub mod tiny;

use std::path::{Path, PathBuf};

pub use config::Config;
pub use model::ModernBertModel;

use crate::embedder::Embedder;
use crate::encoder::{context, load_encoder, output_dims, Widths};
use crate::error::ModelResult;
use crate::family::{LoadOptions, ModelFamily, ModelShape, ModelSummary, OutputDims};
use crate::sentence::{LayoutDefaults, Pooling};
use crate::tiny::TinyModelOptions;
use crate::tokenizer::{QueryFormat, Specials, TextFormat};
use crate::verify::{check_model_dir, Expected};

/// The ModernBERT family, as the registry lists it.
#[derive(Debug, Clone, Copy)]
pub struct ModernBert;

impl ModelFamily for ModernBert {
    fn model_type(&self) -> &'static str {
        "modernbert"
    }

    fn architectures(&self) -> &'static [&'static str] {
        &["ModernBertModel", "ModernBertForMaskedLM"]
    }

    fn name(&self) -> &'static str {
        "ModernBERT"
    }

    fn text_format(&self) -> TextFormat {
        TextFormat {
            family: self.name(),
            specials: Specials::FromFile {
                ensure_end: None,
                otherwise: ("[CLS]", "[SEP]"),
            },
            query: QueryFormat::Prompt,
            legacy_strip: true,
            default_tokenizer_class: None,
        }
    }

    fn layout_defaults(&self) -> LayoutDefaults {
        LayoutDefaults {
            pooling: Pooling::Cls,
            poolings: &[Pooling::Cls, Pooling::Mean, Pooling::LastToken],
            dense: true,
            query_prompt: "",
            document_prompt: "",
            say_when_used: true,
        }
    }

    fn default_instruction(&self) -> &'static str {
        ""
    }

    fn example_checkpoint(&self) -> &'static str {
        "Alibaba-NLP/gte-modernbert-base"
    }

    fn load(&self, dir: &Path, opts: &LoadOptions) -> ModelResult<Box<dyn Embedder>> {
        let cfg = Config::from_file(&dir.join("config.json"))?;
        let layout = self.layout(dir)?;
        load_encoder(
            self.name(),
            dir,
            opts,
            (&layout, Widths::Only),
            |weights, kernel, tile| ModernBertModel::new(&cfg, weights, kernel, tile),
        )
    }

    /// The shape, its context as the embedder reads it.
    fn shape(&self, dir: &Path) -> ModelResult<ModelShape> {
        let mut shape = Config::from_file(&dir.join("config.json"))?.shape();
        shape.max_position_embeddings = context(shape.max_position_embeddings, &self.layout(dir)?);
        Ok(shape)
    }

    fn output_dims(&self, dir: &Path) -> ModelResult<OutputDims> {
        let hidden = Config::from_file(&dir.join("config.json"))?.hidden_size;
        Ok(output_dims(Widths::Only, &self.layout(dir)?, hidden))
    }

    fn verify(&self, dir: &Path) -> ModelResult<ModelSummary> {
        let cfg = Config::from_file(&dir.join("config.json"))?;
        self.layout(dir)?;
        let (h, last) = (cfg.hidden_size, cfg.num_hidden_layers.saturating_sub(1));
        check_model_dir(
            dir,
            Expected {
                model_type: self.model_type(),
                shape: self.shape(dir)?,
                tensors: vec![
                    (
                        "embeddings.tok_embeddings.weight".into(),
                        vec![cfg.vocab_size, h],
                    ),
                    (
                        format!("layers.{last}.mlp.Wo.weight"),
                        vec![h, cfg.intermediate_size],
                    ),
                ],
                text_format: self.text_format(),
            },
        )
    }

    fn write_tiny_model(&self, dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>> {
        tiny::write_tiny_model(dir, opts)
    }
}
