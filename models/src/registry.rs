//! Which family serves a model directory: its `config.json`'s `model_type`, looked up in
//! [`FAMILIES`] (as TEI's candle backend matches on the model type). An unknown `model_type`
//! is refused with the list of known ones.
//!
//! Callers never name a family: [`load_embedder`], [`load_tokenizer`], [`verify_model_dir`]
//! and [`family_of`] read the directory's `config.json` and go through its [`ModelFamily`].

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::embedder::Embedder;
use crate::error::{read_model_file, ModelError, ModelResult};
use crate::family::{LoadOptions, ModelFamily, ModelSummary};
use crate::tiny::TinyModelOptions;
use crate::tokenizer::Tokenizer;
use crate::{bert, gemma3, modernbert, nomic_bert, qwen3};

/// Every family this build implements, one line each. The first is the default: the family
/// whose tiny model `make-tiny-model`, `run` without `--model-dir` and the tests write.
pub static FAMILIES: &[&dyn ModelFamily] = &[
    &qwen3::Qwen3,
    &bert::BERT,
    &bert::ROBERTA,
    &bert::XLM_ROBERTA,
    &modernbert::ModernBert,
    &gemma3::Gemma3,
    &nomic_bert::NomicBert,
];

/// The `model_type`s of [`FAMILIES`], in order.
pub fn known_model_types() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.model_type()).collect()
}

/// The family of this `model_type`, if this build implements it.
pub fn family(model_type: &str) -> Option<&'static dyn ModelFamily> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.model_type() == model_type)
}

/// The families of this build as the help of `--model-dir` names them: each one's
/// `model_type` and a checkpoint of it (`qwen3, e.g. a download of Qwen/Qwen3-Embedding-4B`).
pub fn families_help() -> String {
    FAMILIES
        .iter()
        .map(|f| {
            format!(
                "{}, e.g. a download of {}",
                f.model_type(),
                f.example_checkpoint()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The first of [`FAMILIES`].
pub fn default_family() -> &'static dyn ModelFamily {
    FAMILIES[0]
}

/// The part of `config.json` that names the architecture.
#[derive(Debug, Deserialize)]
struct ConfigHead {
    #[serde(default)]
    model_type: Option<String>,
    #[serde(default)]
    architectures: Option<Vec<String>>,
}

/// The family of the model directory `dir`, from its `config.json`.
pub fn family_of(dir: &Path) -> ModelResult<&'static dyn ModelFamily> {
    // Said of the directory, not as its config.json missing: a mistyped path is the usual cause.
    let what = match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist"),
        Ok(meta) if !meta.is_dir() => Some("is a file, not a directory"),
        _ => None,
    };
    if let Some(what) = what {
        return Err(ModelError::NoModelDir {
            path: dir.to_path_buf(),
            what,
        });
    }
    let path = dir.join("config.json");
    let text = read_model_file(
        &path,
        "a Hugging Face model directory has config.json beside its weights",
    )?;
    let head: ConfigHead =
        serde_json::from_str(&text).map_err(|source| ModelError::ConfigParse {
            path: path.clone(),
            cause: source,
        })?;
    choose(&head).map_err(|reason| ModelError::UnsupportedConfig { path, reason })
}

/// The family `head` names, or why there is none.
fn choose(head: &ConfigHead) -> Result<&'static dyn ModelFamily, String> {
    let architectures = head.architectures.as_deref().unwrap_or_default();
    let known = known_model_types().join(", ");
    let todo = "use a model directory of one of those, or add the family (ARCHITECTURE.md, \
                \"How to add a model family\")";
    let Some(model_type) = &head.model_type else {
        // transformers always writes `model_type`; without it, say which family the
        // checkpoint classes point to.
        let hint = FAMILIES
            .iter()
            .find(|f| {
                architectures
                    .iter()
                    .any(|a| f.architectures().contains(&a.as_str()))
            })
            .map(|f| {
                format!(
                    "; its architectures ({}) are {}'s: add \"model_type\": \"{}\"",
                    architectures.join(", "),
                    f.name(),
                    f.model_type()
                )
            })
            .unwrap_or_else(|| format!("; known model types: {known}; {todo}"));
        return Err(format!("config.json has no model_type{hint}"));
    };
    if let Some(family) = family(model_type) {
        return Ok(family);
    }
    let classes = if architectures.is_empty() {
        String::new()
    } else {
        format!(" ({})", architectures.join(", "))
    };
    Err(format!(
        "model_type `{model_type}`{classes} is not a model family this build implements; \
         known model types: {known}; {todo}"
    ))
}

/// Loads the model directory `dir` on `opts.device` with its family's implementation.
pub fn load_embedder(dir: &Path, opts: &LoadOptions) -> ModelResult<Box<dyn Embedder>> {
    family_of(dir)?.load(dir, opts)
}

/// `dir`'s sentence-transformers layout (pooling, dense modules, prompts), else its family's
/// defaults.
pub fn model_layout(dir: &Path) -> ModelResult<crate::sentence::SentenceLayout> {
    family_of(dir)?.layout(dir)
}

/// How `dir`'s vectors are made, in a line (`BERT family, pooling mean, document prompt none, as
/// its sentence-transformers files say`): what `doctor` prints.
pub fn describe_vectors(dir: &Path) -> ModelResult<String> {
    let family = family_of(dir)?;
    let layout = family.layout(dir)?;
    let prompt = match layout.document_prompt.as_str() {
        "" => "none".to_string(),
        p => format!("{p:?}"),
    };
    Ok(format!(
        "{} family, pooling {}, document prompt {prompt}, {}",
        family.name(),
        layout.pooling.name(),
        if layout.from_files {
            "as its sentence-transformers files say"
        } else {
            "the family's defaults (the directory has no modules.json)"
        }
    ))
}

/// The widths `dir`'s vectors can have (see [`ModelFamily::output_dims`]).
pub fn output_dims(dir: &Path) -> ModelResult<crate::family::OutputDims> {
    family_of(dir)?.output_dims(dir)
}

/// The instruction `dir`'s queries are embedded with when none is given (see
/// [`ModelFamily::query_instruction`]).
pub fn query_instruction(dir: &Path) -> ModelResult<String> {
    family_of(dir)?.query_instruction(dir)
}

/// `dir`'s `tokenizer.json`, with its family's special tokens and query format and the
/// directory's document prompt, texts prepared by `rule` ([`crate::TextRule`]; `None`: a run
/// pinned before the rule was recorded).
pub fn load_tokenizer(dir: &Path, rule: Option<crate::TextRule>) -> ModelResult<Tokenizer> {
    family_of(dir)?.tokenizer(dir, rule)
}

/// Checks `dir` without loading its weights (see [`ModelFamily::verify`]).
pub fn verify_model_dir(dir: &Path) -> ModelResult<ModelSummary> {
    family_of(dir)?.verify(dir)
}

/// Writes the [`default_family`]'s tiny model for `seed` into `dir`.
pub fn write_tiny_model(dir: &Path, seed: u64) -> ModelResult<Vec<PathBuf>> {
    write_tiny_model_with(
        dir,
        &TinyModelOptions {
            seed,
            ..Default::default()
        },
    )
}

/// Writes the [`default_family`]'s tiny model with loader variations.
pub fn write_tiny_model_with(dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>> {
    default_family().write_tiny_model(dir, opts)
}

/// Writes the tiny model of the family of `model_type` (`None`: the [`default_family`]'s);
/// returns the family and the files written. An unknown type is refused with the known ones.
pub fn write_tiny_model_of(
    model_type: Option<&str>,
    dir: &Path,
    opts: &TinyModelOptions,
) -> ModelResult<(&'static dyn ModelFamily, Vec<PathBuf>)> {
    let family = match model_type {
        None => default_family(),
        Some(name) => family(name).ok_or_else(|| ModelError::UnknownFamily {
            model_type: name.to_string(),
            known: known_model_types().join(", "),
        })?,
    };
    Ok((family, family.write_tiny_model(dir, opts)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> ConfigHead {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn the_model_type_picks_the_family() {
        let family = choose(&head(r#"{"model_type": "qwen3"}"#)).unwrap();
        assert_eq!(family.model_type(), "qwen3");
        assert_eq!(
            known_model_types(),
            vec![
                "qwen3",
                "bert",
                "roberta",
                "xlm-roberta",
                "modernbert",
                "gemma3_text",
                "nomic_bert"
            ]
        );
        assert_eq!(default_family().model_type(), "qwen3");
    }

    #[test]
    fn the_family_answers_what_callers_once_took_from_qwen3() {
        let qwen3 = family("qwen3").unwrap();
        assert_eq!(qwen3.layout_defaults().pooling.name(), "last_token");
        assert_eq!(
            qwen3.query_example(),
            "Instruct: <query instruction>\nQuery:<query>"
        );
        assert!(qwen3
            .default_instruction()
            .starts_with("Given a web search query"));
        assert!(families_help()
            .starts_with("qwen3, e.g. a download of Qwen/Qwen3-Embedding-4B; bert, e.g. a download of BAAI/bge-base-en-v1.5"));
    }

    #[test]
    fn an_unknown_model_type_is_refused_with_the_known_ones() {
        let why = choose(&head(
            r#"{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}"#,
        ))
        .err()
        .unwrap();
        assert!(why.contains("`llama` (LlamaForCausalLM)"), "{why}");
        assert!(
            why.contains(
                "known model types: qwen3, bert, roberta, xlm-roberta, modernbert, gemma3_text"
            ),
            "{why}"
        );
        assert!(why.contains("How to add a model family"), "{why}");
    }

    #[test]
    fn a_config_without_model_type_is_pointed_to_its_family() {
        let why = choose(&head(r#"{"architectures": ["Qwen3ForCausalLM"]}"#))
            .err()
            .unwrap();
        assert!(why.contains("add \"model_type\": \"qwen3\""), "{why}");
        let why = choose(&head(r#"{"architectures": null}"#)).err().unwrap();
        assert!(why.contains("known model types: qwen3"), "{why}");
    }
}
