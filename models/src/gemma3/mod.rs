//! The Gemma 3 family as embedding models use it (`gemma3_text` with bidirectional attention):
//! google/embeddinggemma-300m; 2,048 tokens; Matryoshka widths 768, 512, 256 and 128.
//!
//! - `config.rs`: `config.json` in both transformers' key sets.
//! - `model.rs`: the forward pass.
//! - `tiny.rs`: the tiny random model, with EmbeddingGemma's modules and prompts.
//!
//! Gemma 3's own `tokenizer.json` frames a text `<bos> $A`; EmbeddingGemma reads `<eos>` after
//! it too, appended where the file does not. Without sentence-transformers files: mean pooling
//! and EmbeddingGemma's retrieval prompts.

pub mod config;
pub mod model;
pub mod tiny;

use std::path::{Path, PathBuf};

pub use config::Config;
pub use model::Gemma3Model;

use crate::embedder::Embedder;
use crate::encoder::{context, load_encoder, output_dims, Widths};
use crate::error::ModelResult;
use crate::family::{LoadOptions, ModelFamily, ModelShape, ModelSummary, OutputDims};
use crate::sentence::{LayoutDefaults, Pooling};
use crate::tiny::TinyModelOptions;
use crate::tokenizer::{QueryFormat, Specials, TextFormat};
use crate::verify::{check_model_dir, Expected};

/// The Gemma 3 family, as the registry lists it.
#[derive(Debug, Clone, Copy)]
pub struct Gemma3;

/// The Matryoshka widths EmbeddingGemma was trained at, as fractions of its full width (768:
/// 768, 512, 256, 128); the model card declares them, no file does.
/// (The tiny model's 96 has the same fractions.)
fn widths(width: usize) -> Widths {
    match width {
        768 => Widths::Matryoshka(&[768, 512, 256, 128]),
        96 => Widths::Matryoshka(&[96, 64, 32, 16]),
        _ => Widths::Only,
    }
}

impl ModelFamily for Gemma3 {
    fn model_type(&self) -> &'static str {
        "gemma3_text"
    }

    fn architectures(&self) -> &'static [&'static str] {
        &["Gemma3TextModel"]
    }

    fn name(&self) -> &'static str {
        "EmbeddingGemma"
    }

    fn text_format(&self) -> TextFormat {
        TextFormat {
            family: self.name(),
            specials: Specials::FromFile {
                ensure_end: Some("<eos>"),
                otherwise: ("<bos>", "<eos>"),
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
            query_prompt: tiny::QUERY_PROMPT,
            document_prompt: tiny::DOCUMENT_PROMPT,
            say_when_used: true,
        }
    }

    fn default_instruction(&self) -> &'static str {
        tiny::QUERY_PROMPT
    }

    fn example_checkpoint(&self) -> &'static str {
        "google/embeddinggemma-300m"
    }

    fn load(&self, dir: &Path, opts: &LoadOptions) -> ModelResult<Box<dyn Embedder>> {
        let cfg = Config::from_file(&dir.join("config.json"))?;
        let layout = self.layout(dir)?;
        // f16 is only ever asked for (the default is f32 on a CPU, bf16 on a GPU).
        if opts.dtype == Some(candle_core::DType::F16) {
            // Its model card: "EmbeddingGemma activations do not support float16".
            return Err(crate::error::ModelError::InvalidDevice {
                spec: opts.device.to_string(),
                reason: "EmbeddingGemma's activations overflow float16; use bf16 or f32".into(),
            });
        }
        let widths = widths(layout.output_width(cfg.hidden_size));
        load_encoder(
            self.name(),
            dir,
            opts,
            (&layout, widths),
            |weights, kernel, tile| Gemma3Model::new(&cfg, weights, kernel, tile),
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
        let layout = self.layout(dir)?;
        Ok(output_dims(
            widths(layout.output_width(hidden)),
            &layout,
            hidden,
        ))
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
                    ("embed_tokens.weight".into(), vec![cfg.vocab_size, h]),
                    (
                        format!("layers.{last}.mlp.down_proj.weight"),
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
