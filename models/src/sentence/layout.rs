//! Reading a model directory's sentence-transformers files: which modules follow the
//! transformer (`modules.json`), how a vector is pooled (`1_Pooling/config.json`), the dense
//! projections (`2_Dense/`, EmbeddingGemma's two), normalisation, the prompts
//! (`config_sentence_transformers.json`) and the length the model is used at
//! (`sentence_bert_config.json`). Both key sets are read: the legacy ones the Hub's files carry
//! and the ones sentence-transformers 5+ writes.
//!
//! Where a directory has none of these files, the family's defaults hold ([`LayoutDefaults`]),
//! and [`SentenceLayout::from_files`] says so. A module we do not implement (custom code, a
//! `Router`, `WeightedLayerPooling`, ...) is refused by name here, before any job is submitted.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::error::{ModelError, ModelResult};

/// How one vector is read from a sequence's hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's (`[CLS]`, `<s>`).
    Cls,
    /// The mean over every token of the sequence, special tokens included (as
    /// sentence-transformers: its attention mask covers them).
    Mean,
    /// The last token's (Qwen3's appended `<|endoftext|>`).
    LastToken,
}

impl Pooling {
    /// The name shard metadata and the run's output settings record (`cls`, `mean`,
    /// `last_token`).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Mean => "mean",
            Pooling::LastToken => "last_token",
        }
    }
}

/// A dense projection after pooling (`N_Dense/`): `activation(x · Wᵀ + b)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenseSpec {
    /// Its folder (`…/2_Dense`), holding `model.safetensors` with `linear.weight`.
    pub dir: PathBuf,
    pub in_features: usize,
    pub out_features: usize,
    pub bias: bool,
    pub activation: DenseActivation,
}

/// The activations a dense module may name (sentence-transformers' default is `Tanh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseActivation {
    Identity,
    Tanh,
}

/// A family's answers for a directory that has no sentence-transformers files.
#[derive(Debug, Clone, Copy)]
pub struct LayoutDefaults {
    pub pooling: Pooling,
    /// The poolings the family's model computes; any other is refused.
    pub poolings: &'static [Pooling],
    /// Whether the family's embedder applies dense modules after pooling.
    pub dense: bool,
    /// The prompt written before a query, when the directory names none (E5's `query: `).
    pub query_prompt: &'static str,
    /// The prompt written before a document, when the directory names none.
    pub document_prompt: &'static str,
    /// Whether a directory without the files is worth a word to the user: its vectors follow
    /// the family's defaults, which may not be its model card's (false for Qwen3, whose
    /// pooling is its architecture's).
    pub say_when_used: bool,
}

/// What a model directory's sentence-transformers files say, or the family's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentenceLayout {
    pub pooling: Pooling,
    pub dense: Vec<DenseSpec>,
    /// Whether `modules.json` ends in `Normalize`. Vectors are L2-normalised either way (a
    /// vector database compares them by cosine); this records what the model card asked.
    pub normalize: bool,
    /// Written before every query's text (`query: `); empty for none.
    pub query_prompt: String,
    /// Written before every document's text (`passage: `, `title: none | text: `).
    pub document_prompt: String,
    /// The length the model is used at, as sentence-transformers reads it: a
    /// `model_max_length` among `sentence_bert_config.json`'s tokenizer arguments
    /// (`processor_kwargs`, legacy `tokenizer_args`), else its `max_seq_length`, else
    /// `tokenizer_config.json`'s `model_max_length` (where sentence-transformers ≥ 5.4 saves it,
    /// and only there). Capped at the positions by [`crate::encoder::context`].
    pub max_seq_length: Option<usize>,
    /// `sentence_bert_config.json`'s `do_lower_case`: texts lowercased before tokenising.
    pub lowercase: bool,
    /// True when `modules.json` was read; false when the family's defaults hold.
    pub from_files: bool,
}

const MODULES: &str = "modules.json";

impl SentenceLayout {
    /// The layout of `dir`, or `defaults` where it has no sentence-transformers files.
    pub fn read(dir: &Path, defaults: &LayoutDefaults) -> ModelResult<SentenceLayout> {
        let mut layout = SentenceLayout {
            pooling: defaults.pooling,
            dense: Vec::new(),
            normalize: false,
            query_prompt: defaults.query_prompt.into(),
            document_prompt: defaults.document_prompt.into(),
            max_seq_length: None,
            lowercase: false,
            from_files: false,
        };
        if let Some(modules) = read_json::<Vec<ModuleEntry>>(&dir.join(MODULES))? {
            layout.from_files = true;
            read_modules(dir, &modules, defaults, &mut layout)?;
        }
        if let Some(prompts) = read_json::<PromptsFile>(&dir.join(PROMPTS))? {
            prompts.apply(&mut layout);
        }
        if let Some(sbert) = read_json::<SbertConfig>(&dir.join("sentence_bert_config.json"))? {
            layout.max_seq_length = sbert.kwargs_max_length().or(sbert.max_seq_length);
            layout.lowercase = sbert.do_lower_case;
        }
        if layout.max_seq_length.is_none() {
            let tokenizer = read_json::<Value>(&dir.join("tokenizer_config.json"))?;
            layout.max_seq_length = tokenizer
                .as_ref()
                .and_then(|t| length(&t["model_max_length"]));
        }
        Ok(layout)
    }

    /// The width of the vectors: the last dense module's output, else the hidden size.
    pub fn output_width(&self, hidden: usize) -> usize {
        self.dense.last().map_or(hidden, |d| d.out_features)
    }
}

/// One entry of `modules.json`.
#[derive(Debug, Deserialize)]
struct ModuleEntry {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// The module kinds we implement, by the last segment of a `sentence_transformers.` type
/// (legacy `sentence_transformers.models.Pooling`, and 5+'s
/// `sentence_transformers.sentence_transformer.modules.pooling.Pooling`).
fn module_kind(kind: &str) -> Option<&str> {
    let name = kind.rsplit('.').next()?;
    (kind.starts_with("sentence_transformers.")
        && matches!(name, "Transformer" | "Pooling" | "Dense" | "Normalize"))
    .then_some(name)
}

fn read_modules(
    dir: &Path,
    modules: &[ModuleEntry],
    defaults: &LayoutDefaults,
    layout: &mut SentenceLayout,
) -> ModelResult<()> {
    let refuse = |reason: String| ModelError::UnsupportedConfig {
        path: dir.join(MODULES),
        reason,
    };
    for (i, module) in modules.iter().enumerate() {
        let Some(kind) = module_kind(&module.kind) else {
            return Err(refuse(format!(
                "module {i} (`{}` in `{}`) is not one embedfleet implements (Transformer, \
                 Pooling, Dense, Normalize): a custom module runs only in sentence-transformers",
                module.kind, module.path
            )));
        };
        let folder = dir.join(&module.path);
        match kind {
            "Transformer" if !module.path.is_empty() => {
                return Err(refuse(format!(
                    "the transformer is saved in `{}`, not beside modules.json: point \
                     --model-dir at a directory whose transformer is at its root",
                    module.path
                )))
            }
            "Transformer" => {}
            "Pooling" => layout.pooling = read_pooling(&folder, defaults)?,
            "Dense" if !defaults.dense => {
                return Err(refuse(format!(
                    "module {i} is a Dense projection (`{}`), which this model family does not \
                     apply after pooling",
                    module.path
                )))
            }
            "Dense" => layout.dense.push(read_dense(&folder)?),
            _ => layout.normalize = true,
        }
    }
    Ok(())
}

/// `1_Pooling/config.json`, legacy boolean keys or 5+'s `pooling_mode`.
fn read_pooling(folder: &Path, defaults: &LayoutDefaults) -> ModelResult<Pooling> {
    let path = folder.join("config.json");
    let config: Value = read_json(&path)?.ok_or_else(|| ModelError::MissingFile {
        path: path.clone(),
        hint: "modules.json lists a Pooling module; its folder needs the config.json \
               shipped with the model",
    })?;
    let refuse = |reason: String| ModelError::UnsupportedConfig {
        path: path.clone(),
        reason,
    };
    let mut modes: Vec<String> = match config.get("pooling_mode") {
        Some(Value::String(mode)) => vec![mode.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|m| m.as_str().map(str::to_string))
            .collect(),
        _ => LEGACY_MODES
            .iter()
            .filter(|(key, _)| config.get(*key).and_then(Value::as_bool) == Some(true))
            .map(|(_, mode)| mode.to_string())
            .collect(),
    };
    if config.get("include_prompt").and_then(Value::as_bool) == Some(false) {
        return Err(refuse(
            "`include_prompt: false` (pooling that leaves the prompt's tokens out) is not \
             implemented"
                .into(),
        ));
    }
    let pooling = match (modes.pop().as_deref(), modes.is_empty()) {
        (Some("cls"), true) => Pooling::Cls,
        (Some("mean"), true) => Pooling::Mean,
        (Some("lasttoken"), true) => Pooling::LastToken,
        (None, _) => return Err(refuse("it names no pooling mode".into())),
        (Some(mode), true) => {
            return Err(refuse(format!(
                "pooling `{mode}` is not implemented (cls, mean and lasttoken are)"
            )))
        }
        (Some(_), false) => {
            return Err(refuse(
                "several pooling modes concatenated are not implemented (one of cls, mean, \
                 lasttoken is)"
                    .into(),
            ))
        }
    };
    if !defaults.poolings.contains(&pooling) {
        let known: Vec<_> = defaults.poolings.iter().map(|p| p.name()).collect();
        return Err(refuse(format!(
            "pooling `{}` is not one this model family computes ({})",
            pooling.name(),
            known.join(", ")
        )));
    }
    Ok(pooling)
}

/// The legacy boolean keys, in sentence-transformers' order, and the mode each means.
const LEGACY_MODES: &[(&str, &str)] = &[
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
];

#[derive(Debug, Deserialize)]
struct DenseConfig {
    in_features: usize,
    out_features: usize,
    #[serde(default = "yes")]
    bias: bool,
    #[serde(default)]
    activation_function: Option<String>,
    #[serde(default)]
    use_residual: bool,
}

fn yes() -> bool {
    true
}

/// `N_Dense/config.json` and its weight file.
fn read_dense(folder: &Path) -> ModelResult<DenseSpec> {
    let path = folder.join("config.json");
    let config: DenseConfig = read_json(&path)?.ok_or_else(|| ModelError::MissingFile {
        path: path.clone(),
        hint: "modules.json lists a Dense module; its folder needs the config.json shipped \
               with the model",
    })?;
    let refuse = |reason: String| ModelError::UnsupportedConfig {
        path: path.clone(),
        reason,
    };
    let activation = match config.activation_function.as_deref() {
        // sentence-transformers' own default.
        None => DenseActivation::Tanh,
        Some(name) if name.ends_with(".Identity") => DenseActivation::Identity,
        Some(name) if name.ends_with(".Tanh") => DenseActivation::Tanh,
        Some(name) => {
            return Err(refuse(format!(
                "activation `{name}` is not implemented (Identity and Tanh are)"
            )))
        }
    };
    if config.use_residual {
        return Err(refuse("`use_residual: true` is not implemented".into()));
    }
    let weights = folder.join("model.safetensors");
    if !weights.is_file() {
        let pickle = folder.join("pytorch_model.bin");
        return Err(if pickle.is_file() {
            refuse(format!(
                "its weights are a PyTorch pickle ({}), which embedfleet does not read: save the \
                 model again with sentence-transformers ≥ 2.3, which writes model.safetensors",
                pickle.display()
            ))
        } else {
            ModelError::MissingFile {
                path: weights,
                hint: "a Dense module's folder needs its model.safetensors",
            }
        });
    }
    Ok(DenseSpec {
        dir: folder.to_path_buf(),
        in_features: config.in_features,
        out_features: config.out_features,
        bias: config.bias,
        activation,
    })
}

const PROMPTS: &str = "config_sentence_transformers.json";

#[derive(Debug, Default, Deserialize)]
struct PromptsFile {
    #[serde(default, deserialize_with = "null_as_empty")]
    prompts: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    default_prompt_name: Option<String>,
}

/// `"prompts": null` read as no prompts.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    Ok(Option::deserialize(d)?.unwrap_or_default())
}

impl PromptsFile {
    /// A query takes the `query` prompt, a document the first of `document`, `passage`,
    /// `corpus` (as `encode_query` and `encode_document` choose them), each else the default
    /// prompt. A name the file does not list keeps the family's default.
    fn apply(self, layout: &mut SentenceLayout) {
        let default = self
            .default_prompt_name
            .as_deref()
            .and_then(|name| self.prompts.get(name));
        if let Some(query) = self.prompts.get("query").or(default) {
            layout.query_prompt = query.clone();
        }
        let document = ["document", "passage", "corpus"]
            .into_iter()
            .chain(self.default_prompt_name.as_deref())
            .find_map(|name| self.prompts.get(name));
        if let Some(document) = document {
            layout.document_prompt = document.clone();
        }
    }
}

#[derive(Debug, Deserialize)]
struct SbertConfig {
    #[serde(default)]
    max_seq_length: Option<usize>,
    #[serde(default)]
    do_lower_case: bool,
    /// The tokenizer's arguments (sentence-transformers 5+'s name; `tokenizer_args` before).
    #[serde(default, alias = "tokenizer_args")]
    processor_kwargs: Value,
}

impl SbertConfig {
    /// A `model_max_length` among the tokenizer's arguments, which sentence-transformers takes
    /// over `max_seq_length`.
    fn kwargs_max_length(&self) -> Option<usize> {
        length(&self.processor_kwargs["model_max_length"])
    }
}

/// A length a JSON file gives: a whole number, or none for transformers' "no limit", which
/// `tokenizer_config.json` writes as 1e30 (`1000000000000000019884624838656`).
fn length(value: &Value) -> Option<usize> {
    let n = value.as_f64()?;
    (1.0..1e15).contains(&n).then_some(n as usize)
}

/// The most a sentence-transformers JSON file is read (they are a few hundred bytes).
const MAX_JSON_BYTES: u64 = 1 << 20;

/// `path` parsed, or `None` when it does not exist. A FIFO, a device or a file over a MiB is
/// refused before it is opened: a read of it would block or grow without bound (a download
/// cache's symbolic links are followed, as Hugging Face's cache is made of them).
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> ModelResult<Option<T>> {
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() || meta.len() > MAX_JSON_BYTES {
            return Err(ModelError::UnsupportedConfig {
                path: path.to_path_buf(),
                reason: format!(
                    "not a regular JSON file of at most {MAX_JSON_BYTES} bytes: replace it with \
                     the file shipped with the model"
                ),
            });
        }
    }
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ModelError::Io {
                path: path.to_path_buf(),
                cause: source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| ModelError::ConfigParse {
            path: path.to_path_buf(),
            cause: source,
        })
}

#[cfg(test)]
mod tests;
