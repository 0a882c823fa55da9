//! The BERT family: `bert` (BGE v1.5, E5, SciNCL, SPECTER2's base, all-MiniLM), `roberta` and
//! `xlm-roberta` (BGE-M3, multilingual-E5), one encoder behind three registry lines, differing
//! in their position ids and defaults ([`Variant`]).
//!
//! - `config.rs`: `config.json`, checked at load.
//! - `model.rs`: the encoder's forward pass.
//! - `tiny.rs`: the tiny random models, one per variant, with a tokenizer of each kind.
//!
//! Pooling, prompts and normalisation come from the directory's sentence-transformers files
//! (`crate::sentence`); without them, CLS pooling and no prompt (BGE's convention; E5 and
//! all-MiniLM ship files that say mean).

pub mod config;
pub mod model;
pub mod tiny;

use std::path::{Path, PathBuf};

pub use config::{Config, Variant};
pub use model::BertModel;

use crate::embedder::Embedder;
use crate::encoder::{context, load_encoder, output_dims, Widths};
use crate::error::ModelResult;
use crate::family::{LoadOptions, ModelFamily, ModelShape, ModelSummary, OutputDims};
use crate::sentence::{LayoutDefaults, Pooling};
use crate::tiny::TinyModelOptions;
use crate::tokenizer::{QueryFormat, Specials, TextFormat};
use crate::verify::{check_model_dir, Expected};

/// One variant of the BERT family, as the registry lists it.
#[derive(Debug, Clone, Copy)]
pub struct Bert(pub Variant);

/// `model_type: bert`.
pub static BERT: Bert = Bert(Variant::Bert);
/// `model_type: roberta`.
pub static ROBERTA: Bert = Bert(Variant::Roberta);
/// `model_type: xlm-roberta`.
pub static XLM_ROBERTA: Bert = Bert(Variant::XlmRoberta);

impl Bert {
    fn config(&self, dir: &Path) -> ModelResult<Config> {
        Config::from_file(&dir.join("config.json"), self.0)
    }
}

impl ModelFamily for Bert {
    fn model_type(&self) -> &'static str {
        self.0.model_type()
    }

    fn architectures(&self) -> &'static [&'static str] {
        match self.0 {
            Variant::Bert => &["BertModel", "BertForMaskedLM", "BertForPreTraining"],
            Variant::Roberta => &["RobertaModel", "RobertaForMaskedLM"],
            Variant::XlmRoberta => &["XLMRobertaModel", "XLMRobertaForMaskedLM"],
        }
    }

    fn name(&self) -> &'static str {
        match self.0 {
            Variant::Bert => "BERT",
            Variant::Roberta => "RoBERTa",
            Variant::XlmRoberta => "XLM-RoBERTa",
        }
    }

    /// The special tokens its `tokenizer.json`'s post-processor adds; a query is its prompt
    /// and its text.
    fn text_format(&self) -> TextFormat {
        TextFormat {
            family: self.name(),
            specials: Specials::FromFile {
                ensure_end: None,
                otherwise: match self.0 {
                    Variant::Bert => ("[CLS]", "[SEP]"),
                    _ => ("<s>", "</s>"),
                },
            },
            query: QueryFormat::Prompt,
            legacy_strip: true,
            default_tokenizer_class: match self.0 {
                Variant::Bert => Some("BertTokenizer"),
                // transformers' RoBERTa and XLM-R classes rebuild theirs too, as every real
                // file already has them (docs/models.md, "How texts are read").
                _ => None,
            },
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
        match self.0 {
            Variant::Bert => "BAAI/bge-base-en-v1.5",
            Variant::Roberta => "sentence-transformers/all-distilroberta-v1",
            Variant::XlmRoberta => "BAAI/bge-m3",
        }
    }

    fn load(&self, dir: &Path, opts: &LoadOptions) -> ModelResult<Box<dyn Embedder>> {
        let cfg = self.config(dir)?;
        let layout = self.layout(dir)?;
        load_encoder(
            self.name(),
            dir,
            opts,
            (&layout, Widths::Only),
            |weights, kernel, tile| BertModel::new(&cfg, self.0, weights, kernel, tile),
        )
    }

    /// The shape, its context as the embedder reads it (the positions, or the model card's
    /// shorter `max_seq_length`).
    fn shape(&self, dir: &Path) -> ModelResult<ModelShape> {
        let mut shape = self.config(dir)?.shape(self.0);
        shape.max_position_embeddings = context(shape.max_position_embeddings, &self.layout(dir)?);
        Ok(shape)
    }

    fn output_dims(&self, dir: &Path) -> ModelResult<OutputDims> {
        let hidden = self.config(dir)?.hidden_size;
        Ok(output_dims(Widths::Only, &self.layout(dir)?, hidden))
    }

    /// Checks the word embeddings and the last layer's output projection against the config.
    fn verify(&self, dir: &Path) -> ModelResult<ModelSummary> {
        let cfg = self.config(dir)?;
        self.layout(dir)?;
        let (h, last) = (cfg.hidden_size, cfg.num_hidden_layers.saturating_sub(1));
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
                        format!("encoder.layer.{last}.output.dense.weight"),
                        vec![h, cfg.intermediate_size],
                    ),
                ],
                text_format: self.text_format(),
            },
        )
    }

    fn write_tiny_model(&self, dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>> {
        tiny::write_tiny_model(dir, self.0, opts)
    }
}
