//! What ModernBERT's and Gemma 3's configs share: layers that attend to the whole sequence or
//! to a window around each token, and a rope theta per kind, in both of transformers' key sets
//! (transformers 5's `layer_types` and `rope_parameters`; the Hub's older keys, each family's
//! own, read by the caller's fallbacks). Also the error of a `config.json` text read here.

use std::path::Path;

use serde_json::Value;

use crate::attention::Mask;
use crate::error::ModelError;

/// What one layer attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Every token of the sequence.
    Global,
    /// Tokens within a window either side.
    Local,
}

impl LayerKind {
    /// The attention mask of this kind, `half_window` keys either side for a local layer.
    pub fn mask(self, half_window: usize) -> Mask {
        match self {
            LayerKind::Global => Mask::Full,
            LayerKind::Local => Mask::Window {
                left: half_window,
                right: half_window,
            },
        }
    }
}

/// The masks layers of `kinds` attend under, each once, in the order they first appear (what
/// the fused kernel is planned and self-tested for).
pub fn masks_of(kinds: &[LayerKind], half_window: usize) -> Vec<Mask> {
    let mut masks: Vec<Mask> = Vec::new();
    for kind in kinds {
        let mask = kind.mask(half_window);
        if !masks.contains(&mask) {
            masks.push(mask);
        }
    }
    masks
}

/// Why a `config.json` text is not a config of ours.
#[derive(Debug)]
pub enum ConfigError {
    Json(serde_json::Error),
    Unsupported(String),
}

impl ConfigError {
    /// The error of the file at `path`.
    pub fn at(self, path: &Path) -> ModelError {
        match self {
            ConfigError::Json(source) => ModelError::ConfigParse {
                path: path.to_path_buf(),
                cause: source,
            },
            ConfigError::Unsupported(reason) => ModelError::UnsupportedConfig {
                path: path.to_path_buf(),
                reason,
            },
        }
    }
}

/// Each of `layers` layers' kind: `layer_types` where the file has it, else `older(i)` (the
/// family's pattern from its older keys).
pub fn layer_kinds(
    value: &Value,
    layers: usize,
    older: impl Fn(usize) -> LayerKind,
) -> Result<Vec<LayerKind>, ConfigError> {
    let kinds: Vec<LayerKind> = match value.get("layer_types").and_then(Value::as_array) {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(LayerKind::Global),
                Some("sliding_attention") => Ok(LayerKind::Local),
                other => Err(ConfigError::Unsupported(format!(
                    "layer type {other:?} is not implemented (full_attention, \
                     sliding_attention are)"
                ))),
            })
            .collect::<Result<_, _>>()?,
        None => (0..layers).map(older).collect(),
    };
    if kinds.len() != layers {
        return Err(ConfigError::Unsupported(format!(
            "layer_types names {} layers, num_hidden_layers {layers}",
            kinds.len()
        )));
    }
    Ok(kinds)
}

/// The rope theta of layers of `kind` (`full_attention`, `sliding_attention`):
/// `rope_parameters[kind].rope_theta` where the file has it (default rope only), else the
/// older key `old`, else `default`.
pub fn rope_theta(value: &Value, kind: &str, old: &str, default: f64) -> Result<f64, ConfigError> {
    if let Some(params) = value.get("rope_parameters").and_then(|p| p.get(kind)) {
        match params.get("rope_type").and_then(Value::as_str) {
            None | Some("default") => {}
            Some(other) => {
                return Err(ConfigError::Unsupported(format!(
                    "rope_type `{other}` is not implemented (default is)"
                )))
            }
        }
        if let Some(theta) = params.get("rope_theta").and_then(Value::as_f64) {
            return Ok(theta);
        }
    }
    Ok(value.get(old).and_then(Value::as_f64).unwrap_or(default))
}
