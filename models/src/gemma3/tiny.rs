//! A tiny random EmbeddingGemma in the Hugging Face and sentence-transformers layout, as
//! google/embeddinggemma-300m ships: Gemma's kind of tokenizer (`<bos> $A <eos>`), six layers
//! (five local with a window of 8 tokens, 4 either side, then one global), grouped-query
//! attention (4 query heads over 2 key/value heads), mean pooling, two dense projections
//! without bias or activation (96 → 192 → 96), Normalize, and its task prompts.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::error::{ModelError, ModelResult};
use crate::tiny::{
    random_tensors, write_json, write_safetensors, write_st_files, Init, TinyModelOptions,
};
use crate::tiny_tokenizers::{gemma_bpe_json, vocab_len};

/// Positions of the tiny model.
pub const TINY_CONTEXT: usize = 128;

/// EmbeddingGemma's query and document prompts (its `config_sentence_transformers.json`).
pub const QUERY_PROMPT: &str = "task: search result | query: ";
pub const DOCUMENT_PROMPT: &str = "title: none | text: ";

pub fn write_tiny_model(dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io {
            path,
            cause: source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tokenizer = gemma_bpe_json();
    let vocab = vocab_len(&tokenizer);
    let (h, i, hd, layers) = (opts.hidden_size.unwrap_or(96), 128, 16, 6);
    let (heads, kv_heads) = (4, 2);
    let config = json!({
        "architectures": ["Gemma3TextModel"],
        "model_type": "gemma3_text",
        "vocab_size": vocab,
        "hidden_size": h,
        "intermediate_size": i,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hd,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": TINY_CONTEXT,
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": hd,
        "sliding_window": 8,
        "_sliding_window_pattern": 6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "use_bidirectional_attention": true,
        "attention_bias": false,
        "attn_logit_softcapping": null,
        "final_logit_softcapping": null,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
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
        json!({"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT,
               "STS": "task: sentence similarity | query: "}),
    )?);
    written.extend(write_dense_modules(dir, h, opts.seed)?);
    let specs = specs(vocab, (h, i, hd), (heads, kv_heads), layers);
    let prefix = if opts.model_prefix { "model." } else { "" };
    let tensors = random_tensors(specs, opts.seed)?
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v))
        .collect();
    written.extend(write_safetensors(dir, tensors, opts.shards.max(1))?);
    Ok(written)
}

/// EmbeddingGemma's modules after the pooling: two dense projections (`h` → `2h` → `h`, no
/// bias, Identity), then Normalize.
fn write_dense_modules(dir: &Path, h: usize, seed: u64) -> ModelResult<Vec<PathBuf>> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io {
            path,
            cause: source,
        }
    };
    let mut written = Vec::new();
    let modules = json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]);
    write_json(&dir.join("modules.json"), &modules)?;
    for (n, (folder, inner, outer)) in [("2_Dense", h, 2 * h), ("3_Dense", 2 * h, h)]
        .into_iter()
        .enumerate()
    {
        let folder = dir.join(folder);
        std::fs::create_dir_all(&folder).map_err(io(&folder))?;
        let config = json!({"in_features": inner, "out_features": outer, "bias": false,
                            "activation_function": "torch.nn.modules.linear.Identity"});
        written.push(folder.join("config.json"));
        write_json(&folder.join("config.json"), &config)?;
        let spec = vec![(
            "linear.weight".to_string(),
            vec![outer, inner],
            Init::Normal(1.0 / (inner as f32).sqrt()),
        )];
        written.extend(write_safetensors(
            &folder,
            random_tensors(spec, seed + 1 + n as u64)?,
            1,
        )?);
    }
    Ok(written)
}

/// Every tensor of the text model with its transformers name and initialisation.
fn specs(
    vocab: usize,
    (h, i, hd): (usize, usize, usize),
    (heads, kv_heads): (usize, usize),
    layers: usize,
) -> Vec<(String, Vec<usize>, Init)> {
    let mut specs = vec![
        (
            "embed_tokens.weight".to_string(),
            vec![vocab, h],
            Init::Normal(0.2),
        ),
        ("norm.weight".into(), vec![h], Init::Normal(0.1)),
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
        // Gemma's norms scale by 1 + w: weights near 0.
        let norm =
            |name: &str, n: usize| (format!("{p}.{name}.weight"), vec![n], Init::Normal(0.1));
        specs.extend([
            norm("input_layernorm", h),
            lin("self_attn.q_proj", heads * hd, h),
            lin("self_attn.k_proj", kv_heads * hd, h),
            lin("self_attn.v_proj", kv_heads * hd, h),
            lin("self_attn.o_proj", h, heads * hd),
            norm("self_attn.q_norm", hd),
            norm("self_attn.k_norm", hd),
            norm("post_attention_layernorm", h),
            norm("pre_feedforward_layernorm", h),
            lin("mlp.gate_proj", i, h),
            lin("mlp.up_proj", i, h),
            lin("mlp.down_proj", h, i),
            norm("post_feedforward_layernorm", h),
        ]);
    }
    specs
}
