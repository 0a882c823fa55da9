//! The NomicBERT family (`nomic_bert`): nomic-ai/nomic-embed-text-v1.5 and v1, Ollama's most
//! pulled embedder (`nomic-embed-text`); BERT with rotary positions and SwiGLU, 8,192 tokens.
//!
//! - `config.rs`: `config.json` in nomic's keys; what is not implemented refused by name.
//! - `model.rs`: the forward pass.
//! - `tiny.rs`: the tiny random model.
//!
//! transformers has no class for it (the model card loads nomic's remote code), so its
//! fidelity test's reference is an implementation of the published architecture in numpy
//! (`benches/nomic_bert_numpy.py`), written apart from this one.
//!
//! Without sentence-transformers files: mean pooling and nomic's task prefixes
//! (`search_document: `, `search_query: `), as its model card says to use it.

pub mod config;
pub mod model;
pub mod tiny;

use std::path::{Path, PathBuf};

pub use config::Config;
pub use model::NomicBertModel;

use crate::embedder::Embedder;
use crate::encoder::{context, load_encoder, output_dims, Widths};
use crate::error::ModelResult;
use crate::family::{LoadOptions, ModelFamily, ModelShape, ModelSummary, OutputDims};
use crate::sentence::{LayoutDefaults, Pooling};
use crate::tiny::TinyModelOptions;
use crate::tokenizer::{QueryFormat, Specials, TextFormat};
use crate::verify::{check_model_dir, Expected};

/// The NomicBERT family, as the registry lists it.
#[derive(Debug, Clone, Copy)]
pub struct NomicBert;

/// nomic-embed-text-v1.5's Matryoshka widths (its model card's); other widths have one.
fn widths(hidden: usize) -> Widths {
    match hidden {
        768 => Widths::Matryoshka(&[768, 512, 256, 128, 64]),
        _ => Widths::Only,
    }
}

impl NomicBert {
    fn config(&self, dir: &Path) -> ModelResult<Config> {
        Config::from_file(&dir.join("config.json"))
    }
}

impl ModelFamily for NomicBert {
    fn model_type(&self) -> &'static str {
        "nomic_bert"
    }

    fn architectures(&self) -> &'static [&'static str] {
        &["NomicBertModel", "NomicBertForPreTraining"]
    }

    fn name(&self) -> &'static str {
        "NomicBERT"
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
            pooling: Pooling::Mean,
            poolings: &[Pooling::Cls, Pooling::Mean, Pooling::LastToken],
            dense: true,
            query_prompt: "search_query: ",
            document_prompt: "search_document: ",
            say_when_used: true,
        }
    }

    fn default_instruction(&self) -> &'static str {
        "search_query: "
    }

    fn example_checkpoint(&self) -> &'static str {
        "nomic-ai/nomic-embed-text-v1.5"
    }

    fn load(&self, dir: &Path, opts: &LoadOptions) -> ModelResult<Box<dyn Embedder>> {
        let cfg = self.config(dir)?;
        let layout = self.layout(dir)?;
        load_encoder(
            self.name(),
            dir,
            opts,
            (&layout, widths(cfg.hidden_size())),
            |weights, kernel, tile| NomicBertModel::new(&cfg, weights, kernel, tile),
        )
    }

    /// The shape, its context as the embedder reads it.
    fn shape(&self, dir: &Path) -> ModelResult<ModelShape> {
        let mut shape = self.config(dir)?.shape();
        shape.max_position_embeddings = context(shape.max_position_embeddings, &self.layout(dir)?);
        Ok(shape)
    }

    fn output_dims(&self, dir: &Path) -> ModelResult<OutputDims> {
        let hidden = self.config(dir)?.hidden_size();
        Ok(output_dims(widths(hidden), &self.layout(dir)?, hidden))
    }

    fn verify(&self, dir: &Path) -> ModelResult<ModelSummary> {
        let cfg = self.config(dir)?;
        self.layout(dir)?;
        let (h, last) = (cfg.hidden_size(), cfg.n_layer.saturating_sub(1));
        check_model_dir(
            dir,
            Expected {
                model_type: self.model_type(),
                shape: self.shape(dir)?,
                tensors: vec![
                    (
                        "embeddings.word_embeddings.weight".into(),
                        vec![cfg.vocab_size, h],
                    ),
                    (
                        format!("encoder.layers.{last}.mlp.fc2.weight"),
                        vec![h, cfg.intermediate_size()],
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
