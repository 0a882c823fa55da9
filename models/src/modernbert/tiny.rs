//! A tiny random ModernBERT in the Hugging Face and sentence-transformers layout, as nomic's
//! modernbert-embed ships one: byte-level BPE with `[CLS] $A [SEP]`, three layers (global,
//! local, local) with a window of 8 tokens (4 either side) well below the test lengths, mean
//! pooling, `search_query: `/`search_document: ` prompts, a `tokenizer_config.json` naming its
//! special tokens. The config uses the Hub's
//! transformers-4 keys; transformers 5 saves the other set, and both are read.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::error::{ModelError, ModelResult};
use crate::tiny::{
    heads_for, random_tensors, write_json, write_safetensors, write_st_files, Init,
    TinyModelOptions,
};
use crate::tiny_tokenizers::{byte_bpe_json, template};

/// Positions of the tiny model.
pub const TINY_CONTEXT: usize = 128;

pub fn write_tiny_model(dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        cause: source,
    })?;
    let (tokenizer, vocab) = byte_bpe_json(
        &["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"],
        template(Some(("[CLS]", 0)), Some(("[SEP]", 2))),
    );
    let (h, i, layers) = (opts.hidden_size.unwrap_or(64), 96, 3);
    let config = json!({
        "architectures": ["ModernBertModel"],
        "model_type": "modernbert",
        "vocab_size": vocab,
        "hidden_size": h,
        "num_hidden_layers": layers,
        "num_attention_heads": heads_for(h),
        "intermediate_size": i,
        "hidden_activation": "gelu",
        "max_position_embeddings": TINY_CONTEXT,
        "norm_eps": 1e-5,
        "norm_bias": false,
        "attention_bias": false,
        "mlp_bias": false,
        "global_rope_theta": 160000.0,
        "local_rope_theta": 10000.0,
        "global_attn_every_n_layers": 3,
        "local_attention": 8,
        "pad_token_id": 1,
        "cls_token_id": 0,
        "sep_token_id": 2,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    });
    // As ModernBERT's own: transformers loads it as the file says, and a padded batch needs
    // the pad token named.
    let tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "cls_token": "[CLS]", "pad_token": "[PAD]", "sep_token": "[SEP]", "unk_token": "[UNK]",
        "mask_token": "[MASK]", "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": TINY_CONTEXT,
    });
    let mut written = vec![
        dir.join("config.json"),
        dir.join("tokenizer.json"),
        dir.join("tokenizer_config.json"),
    ];
    write_json(&written[0], &config)?;
    write_json(&written[1], &tokenizer)?;
    write_json(&written[2], &tokenizer_config)?;
    written.extend(write_st_files(
        dir,
        "mean",
        h,
        TINY_CONTEXT,
        json!({"query": "search_query: ", "document": "search_document: "}),
    )?);
    let mut specs = vec![
        (
            "embeddings.tok_embeddings.weight".to_string(),
            vec![vocab, h],
            Init::Normal(1.0),
        ),
        ("embeddings.norm.weight".into(), vec![h], Init::NearOne),
        ("final_norm.weight".into(), vec![h], Init::NearOne),
    ];
    for l in 0..layers {
        let p = format!("layers.{l}");
        let lin = |name: &str, o: usize, n: usize| {
            (
                format!("{p}.{name}.weight"),
                vec![o, n],
                Init::Normal(1.0 / (n as f32).sqrt()),
            )
        };
        if l > 0 {
            specs.push((format!("{p}.attn_norm.weight"), vec![h], Init::NearOne));
        }
        specs.extend([
            lin("attn.Wqkv", 3 * h, h),
            lin("attn.Wo", h, h),
            (format!("{p}.mlp_norm.weight"), vec![h], Init::NearOne),
            lin("mlp.Wi", 2 * i, h),
            lin("mlp.Wo", h, i),
        ]);
    }
    let prefix = if opts.model_prefix { "model." } else { "" };
    let tensors = random_tensors(specs, opts.seed)?
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v))
        .collect();
    written.extend(write_safetensors(dir, tensors, opts.shards.max(1))?);
    Ok(written)
}
