//! Tiny random BERT, RoBERTa and XLM-RoBERTa models in the Hugging Face and
//! sentence-transformers layout, each with a tokenizer of its kind (WordPiece, byte-level BPE,
//! Unigram): `config.json`, `model.safetensors` with transformers' names, `tokenizer.json`,
//! `modules.json` with a pooling (mean for BERT and XLM-R, CLS for RoBERTa) and `Normalize`,
//! and for XLM-R E5's `query: `/`passage: ` prompts.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::config::Variant;
use crate::error::{ModelError, ModelResult};
use crate::tiny::{
    heads_for, random_tensors, write_json, write_safetensors, write_st_files, Init,
    TinyModelOptions,
};
use crate::tiny_tokenizers::{byte_bpe_json, template, unigram_json, vocab_len, wordpiece_json};

/// Positions of the tiny models' contexts.
pub const TINY_CONTEXT: usize = 128;

/// Writes `variant`'s tiny model for `opts` into `dir`; returns the files written.
pub fn write_tiny_model(
    dir: &Path,
    variant: Variant,
    opts: &TinyModelOptions,
) -> ModelResult<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        cause: source,
    })?;
    let (tokenizer, pad) = match variant {
        Variant::Bert => (wordpiece_json(), 0),
        Variant::Roberta => {
            let (mut json, _) = byte_bpe_json(
                &["<s>", "<pad>", "</s>", "<unk>"],
                template(Some(("<s>", 0)), Some(("</s>", 2))),
            );
            // What transformers' RobertaTokenizer builds, whatever the file says (a real
            // RoBERTa file has it too): GPT-2's byte-level split, no normalizer.
            json["normalizer"] = serde_json::Value::Null;
            json["pre_tokenizer"] = json!({"type": "ByteLevel", "add_prefix_space": false,
                                           "trim_offsets": true, "use_regex": true});
            (json, 1)
        }
        Variant::XlmRoberta => (unigram_json(), 1),
    };
    let vocab = vocab_len(&tokenizer);
    let hidden = opts.hidden_size.unwrap_or(64);
    let heads = heads_for(hidden);
    let offset = if variant.offsets_positions() {
        pad + 1
    } else {
        0
    };
    let config = json!({
        "architectures": [match variant {
            Variant::Bert => "BertModel",
            Variant::Roberta => "RobertaModel",
            Variant::XlmRoberta => "XLMRobertaModel",
        }],
        "model_type": variant.model_type(),
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "intermediate_size": 2 * hidden,
        "hidden_act": "gelu",
        "max_position_embeddings": TINY_CONTEXT + offset,
        "type_vocab_size": if variant == Variant::Bert { 2 } else { 1 },
        "layer_norm_eps": if variant == Variant::Bert { 1e-12 } else { 1e-5 },
        "pad_token_id": pad,
        "bos_token_id": if variant == Variant::Bert { json!(null) } else { json!(0) },
        "eos_token_id": if variant == Variant::Bert { json!(null) } else { json!(2) },
        "position_embedding_type": "absolute",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "torch_dtype": "float32",
    });
    let mut written = vec![dir.join("config.json"), dir.join("tokenizer.json")];
    write_json(&written[0], &config)?;
    write_json(&written[1], &tokenizer)?;
    let pooling = if variant == Variant::Roberta {
        "cls"
    } else {
        "mean"
    };
    let prompts = if variant == Variant::XlmRoberta {
        json!({"query": "query: ", "passage": "passage: "})
    } else {
        json!({})
    };
    written.extend(write_st_files(dir, pooling, hidden, TINY_CONTEXT, prompts)?);
    let prefix = match (opts.model_prefix, variant) {
        (false, _) => "",
        (true, Variant::Bert) => "bert.",
        (true, _) => "roberta.",
    };
    let tensors = random_tensors(
        specs(vocab, hidden, TINY_CONTEXT + offset, variant),
        opts.seed,
    )?
    .into_iter()
    .map(|(k, v)| (format!("{prefix}{k}"), v))
    .collect();
    written.extend(write_safetensors(dir, tensors, opts.shards.max(1))?);
    Ok(written)
}

/// Every tensor of the encoder with its transformers name and initialisation.
fn specs(
    vocab: usize,
    h: usize,
    positions: usize,
    variant: Variant,
) -> Vec<(String, Vec<usize>, Init)> {
    let types = if variant == Variant::Bert { 2 } else { 1 };
    let mut specs = vec![
        (
            "embeddings.word_embeddings.weight".into(),
            vec![vocab, h],
            Init::Normal(1.0),
        ),
        (
            "embeddings.position_embeddings.weight".into(),
            vec![positions, h],
            Init::Normal(0.5),
        ),
        (
            "embeddings.token_type_embeddings.weight".into(),
            vec![types, h],
            Init::Normal(0.5),
        ),
        ("embeddings.LayerNorm.weight".into(), vec![h], Init::NearOne),
        (
            "embeddings.LayerNorm.bias".into(),
            vec![h],
            Init::Normal(0.1),
        ),
    ];
    for l in 0..2 {
        let p = format!("encoder.layer.{l}");
        let dense = |name: &str, o: usize, n: usize| {
            [
                (
                    format!("{p}.{name}.weight"),
                    vec![o, n],
                    Init::Normal(1.0 / (n as f32).sqrt()),
                ),
                (format!("{p}.{name}.bias"), vec![o], Init::Normal(0.1)),
            ]
        };
        let norm = |name: &str| {
            [
                (format!("{p}.{name}.weight"), vec![h], Init::NearOne),
                (format!("{p}.{name}.bias"), vec![h], Init::Normal(0.1)),
            ]
        };
        specs.extend(dense("attention.self.query", h, h));
        specs.extend(dense("attention.self.key", h, h));
        specs.extend(dense("attention.self.value", h, h));
        specs.extend(dense("attention.output.dense", h, h));
        specs.extend(norm("attention.output.LayerNorm"));
        specs.extend(dense("intermediate.dense", 2 * h, h));
        specs.extend(dense("output.dense", h, 2 * h));
        specs.extend(norm("output.LayerNorm"));
    }
    specs
}
