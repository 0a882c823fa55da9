//! A tiny random NomicBERT in the layout nomic-embed-text ships: nomic's `config.json` keys and
//! tensor names, a WordPiece tokenizer (`[CLS] $A [SEP]`), mean pooling and the
//! `search_query: ` / `search_document: ` prompts. Two layers; the q/k/v and fc2 biases on and
//! fc1's off (the real model has none: both kinds of layer are exercised).

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::error::{ModelError, ModelResult};
use crate::tiny::{
    heads_for, random_tensors, write_json, write_safetensors, write_st_files, Init,
    TinyModelOptions,
};
use crate::tiny_tokenizers::{vocab_len, wordpiece_json};

/// Positions of the tiny model.
pub const TINY_CONTEXT: usize = 128;

pub fn write_tiny_model(dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        cause: source,
    })?;
    let tokenizer = wordpiece_json();
    let vocab = vocab_len(&tokenizer);
    let (h, i, layers) = (opts.hidden_size.unwrap_or(64), 96, 2);
    let config = json!({
        "architectures": ["NomicBertModel"],
        "model_type": "nomic_bert",
        "vocab_size": vocab,
        "n_embd": h,
        "n_layer": layers,
        "n_head": heads_for(h),
        "n_inner": i,
        "n_positions": TINY_CONTEXT,
        "type_vocab_size": 2,
        "layer_norm_epsilon": 1e-12,
        "rotary_emb_fraction": 1.0,
        "rotary_emb_base": 1000,
        "rotary_emb_interleaved": false,
        "rotary_scaling_factor": null,
        "qkv_proj_bias": true,
        "mlp_fc1_bias": false,
        "mlp_fc2_bias": true,
        "activation_function": "swiglu",
        "prenorm": false,
        "causal": false,
        "scale_attn_weights": true,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    });
    let mut written = vec![dir.join("config.json"), dir.join("tokenizer.json")];
    write_json(&written[0], &config)?;
    write_json(&written[1], &tokenizer)?;
    written.extend(write_st_files(
        dir,
        "mean",
        h,
        TINY_CONTEXT,
        json!({"query": "search_query: ", "document": "search_document: "}),
    )?);
    let norm = |name: &str| {
        [
            (format!("{name}.weight"), vec![h], Init::NearOne),
            (format!("{name}.bias"), vec![h], Init::Normal(0.1)),
        ]
    };
    let mut specs = vec![
        (
            "embeddings.word_embeddings.weight".to_string(),
            vec![vocab, h],
            Init::Normal(1.0),
        ),
        (
            "embeddings.token_type_embeddings.weight".into(),
            vec![2, h],
            Init::Normal(0.5),
        ),
    ];
    specs.extend(norm("emb_ln"));
    for l in 0..layers {
        let p = format!("encoder.layers.{l}");
        let dense = |name: &str, o: usize, n: usize, bias: bool| {
            let mut v = vec![(
                format!("{p}.{name}.weight"),
                vec![o, n],
                Init::Normal(1.0 / (n as f32).sqrt()),
            )];
            if bias {
                v.push((format!("{p}.{name}.bias"), vec![o], Init::Normal(0.1)));
            }
            v
        };
        specs.extend(dense("attn.Wqkv", 3 * h, h, true));
        specs.extend(dense("attn.out_proj", h, h, true));
        specs.extend(norm(&format!("{p}.norm1")));
        specs.extend(dense("mlp.fc11", i, h, false));
        specs.extend(dense("mlp.fc12", i, h, false));
        specs.extend(dense("mlp.fc2", h, i, true));
        specs.extend(norm(&format!("{p}.norm2")));
    }
    let prefix = if opts.model_prefix { "model." } else { "" };
    let tensors = random_tensors(specs, opts.seed)?
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v))
        .collect();
    written.extend(write_safetensors(dir, tensors, opts.shards.max(1))?);
    Ok(written)
}
