//! A tiny random Qwen3 in the exact Hugging Face layout, for tests and demos.
//!
//! `config.json`, `model.safetensors` (names as transformers writes them for `Qwen3Model`,
//! f32, `{"format": "pt"}` metadata) and a small byte-level BPE `tokenizer.json`. The same
//! seed always gives the same bytes, so Rust tests and the Python golden script
//! (`tests/golden/make_golden.py`) see identical weights.
//!
//! Weights are scaled so that attention is far from uniform (per-head norms near 1, linear
//! layers ~ 1/sqrt(fan_in)): a masking or rotary bug changes the output visibly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use super::config::Config;
use super::vocab::tiny_tokenizer_json;
use crate::error::{ModelError, ModelResult};
use crate::tiny::{random_tensors, write_json, write_safetensors, Init, TinyModelOptions};

/// Merges learned by the tiny tokenizer (vocabulary: 256 bytes + merges + EOS).
pub const TINY_MERGES: usize = 200;

/// The tiny model's config: 3 layers, hidden 128, 6 query heads over 2 KV heads of 32
/// (so `heads × head_dim` ≠ hidden, as in the real models), 2,048 positions.
pub fn tiny_config() -> Config {
    Config {
        model_type: Some("qwen3".into()),
        hidden_size: 128,
        num_hidden_layers: 3,
        num_attention_heads: 6,
        num_key_value_heads: 2,
        head_dim: Some(32),
        intermediate_size: 256,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        vocab_size: 512,
        max_position_embeddings: 2048,
        tie_word_embeddings: true,
        hidden_act: "silu".into(),
        attention_bias: false,
        use_sliding_window: false,
        rope_scaling: None,
    }
}

/// Writes the tiny model for `opts.seed` into `dir` (created if needed), with the loader
/// variations of `opts`. Returns the files written.
pub fn write_tiny_model(dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        cause: source,
    })?;
    let mut cfg = tiny_config();
    if let Some(hidden) = opts.hidden_size {
        cfg.hidden_size = hidden;
    }
    let mut written = Vec::new();
    let mut config = serde_json::to_value(&cfg).expect("Config serialises. This is a bug.");
    config["architectures"] = serde_json::json!(["Qwen3Model"]);
    config["torch_dtype"] = serde_json::json!("float32");
    let (tok, eos) = tiny_tokenizer_json(TINY_MERGES);
    config["eos_token_id"] = serde_json::json!(eos);
    config["bos_token_id"] = serde_json::json!(eos);
    written.push(dir.join("config.json"));
    write_json(&written[0], &config)?;
    written.push(dir.join("tokenizer.json"));
    write_json(&written[1], &tok)?;
    let prefix = if opts.model_prefix { "model." } else { "" };
    let tensors = random_weights(&cfg, opts.seed)?
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v))
        .collect();
    written.extend(write_safetensors(dir, tensors, opts.shards.max(1))?);
    Ok(written)
}

/// Every tensor of `Qwen3Model` with its transformers name, random for `seed`.
pub fn random_weights(cfg: &Config, seed: u64) -> ModelResult<BTreeMap<String, Tensor>> {
    let (h, hd, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
    let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
    let mut specs: Vec<(String, Vec<usize>, Init)> = vec![(
        "embed_tokens.weight".into(),
        vec![cfg.vocab_size, h],
        Init::Normal(1.0),
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("layers.{l}");
        let lin = |name: &str, o: usize, n: usize| {
            (
                format!("{p}.{name}.weight"),
                vec![o, n],
                Init::Normal(1.0 / (n as f32).sqrt()),
            )
        };
        let norm = |name: &str, n: usize| (format!("{p}.{name}.weight"), vec![n], Init::NearOne);
        specs.extend([
            norm("input_layernorm", h),
            lin("self_attn.q_proj", q, h),
            lin("self_attn.k_proj", kv, h),
            lin("self_attn.v_proj", kv, h),
            lin("self_attn.o_proj", h, q),
            norm("self_attn.q_norm", hd),
            norm("self_attn.k_norm", hd),
            norm("post_attention_layernorm", h),
            lin("mlp.gate_proj", i, h),
            lin("mlp.up_proj", i, h),
            lin("mlp.down_proj", h, i),
        ]);
    }
    specs.push(("norm.weight".into(), vec![h], Init::NearOne));
    random_tensors(specs, seed)
}
