//! A model directory checked without loading its weights, as a login node can (no GPU, little
//! memory): `config.json` valid for Qwen3, every weight file's safetensors header readable, the
//! embedding table and the last layer present with the config's shapes, `tokenizer.json` usable.

use crate::config::Config;
use crate::error::{ModelError, ModelResult};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use candle_core::{DType, Device};
use std::path::{Path, PathBuf};

/// What a checked model directory holds.
#[derive(Debug, Clone)]
pub struct ModelSummary {
    pub config: Config,
    pub weight_files: Vec<PathBuf>,
    /// Bytes of the weight files.
    pub weight_bytes: u64,
    pub tensors: usize,
}

/// Checks `dir` (see the module docs); the first problem is the error, naming the file.
pub fn verify_model_dir(dir: &Path) -> ModelResult<ModelSummary> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(ModelError::MissingFile {
            path: config_path,
            hint: "a Hugging Face model directory has config.json beside its weights",
        });
    }
    let config = Config::from_file(&config_path)?;
    let weights = Weights::open(dir, DType::F32, &Device::Cpu)?;
    let (hidden, layers) = (config.hidden_size, config.num_hidden_layers);
    let expect = |name: &str, shape: Vec<usize>| -> ModelResult<()> {
        let actual = weights.shape_of(name)?;
        if actual == shape {
            return Ok(());
        }
        Err(ModelError::TensorShape {
            name: name.into(),
            path: dir.into(),
            expected: shape,
            actual,
        })
    };
    expect("embed_tokens.weight", vec![config.vocab_size, hidden])?;
    let last = format!("layers.{}.mlp.down_proj.weight", layers.saturating_sub(1));
    expect(&last, vec![hidden, config.intermediate_size])?;
    Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let (weight_files, tensors) = weights.files();
    let weight_bytes = weight_files
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    Ok(ModelSummary {
        config,
        weight_files,
        weight_bytes,
        tensors,
    })
}
