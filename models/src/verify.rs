//! The checks of a model directory every family shares, made without loading its weights, as
//! a login node can (no GPU, little memory): every weight file's safetensors header readable,
//! the tensors the family names present with the shapes its config implies, `tokenizer.json`
//! usable. A family's `ModelFamily::verify` reads its config and calls [`check_model_dir`].

use std::path::Path;

use candle_core::{DType, Device};

use crate::error::{ModelError, ModelResult};
use crate::family::{ModelShape, ModelSummary};
use crate::tokenizer::{TextFormat, Tokenizer};
use crate::weights::Weights;

/// What a family expects of a directory whose `config.json` it has read and validated.
#[derive(Debug, Clone)]
pub struct Expected {
    pub model_type: &'static str,
    pub shape: ModelShape,
    /// Tensors to find in the weight headers, with their shapes (a few: the first and the
    /// last, so that a truncated download or a config of another size shows).
    pub tensors: Vec<(String, Vec<usize>)>,
    pub text_format: TextFormat,
}

/// Checks `dir` against `expected`; the first problem is the error, naming the file.
pub fn check_model_dir(dir: &Path, expected: Expected) -> ModelResult<ModelSummary> {
    let weights = Weights::open(dir, DType::F32, &Device::Cpu)?;
    for (name, shape) in expected.tensors {
        let actual = weights.shape_of(&name)?;
        if actual != shape {
            return Err(ModelError::TensorShape {
                name,
                path: dir.into(),
                expected: shape,
                actual,
            });
        }
    }
    Tokenizer::from_file(&dir.join("tokenizer.json"), expected.text_format)?;
    let (weight_files, tensors) = weights.files();
    let weight_bytes = weight_files
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    Ok(ModelSummary {
        model_type: expected.model_type,
        shape: expected.shape,
        weight_files,
        weight_bytes,
        tensors,
    })
}
