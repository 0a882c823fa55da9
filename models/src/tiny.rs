//! A tiny random Qwen3 in the exact Hugging Face layout, for tests and demos.
//!
//! `config.json`, `model.safetensors` (names as transformers writes them for `Qwen3Model`,
//! f32, `{"format": "pt"}` metadata) and a small byte-level BPE `tokenizer.json`. The same
//! seed always gives the same bytes, so Rust tests and the Python golden script
//! (`tests/golden/make_golden.py`) see identical weights.
//!
//! Weights are scaled so that attention is far from uniform (per-head norms near 1, linear
//! layers ~ 1/sqrt(fan_in)): a masking or rotary bug changes the output visibly.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::config::Config;
use crate::error::{ModelError, ModelResult};
use crate::vocab::{tiny_tokenizer_json, write_json};

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

/// Variations used by tests of the loader.
#[derive(Debug, Clone)]
pub struct TinyModelOptions {
    pub seed: u64,
    /// 1 writes `model.safetensors`; more writes `model-0000i-of-0000n.safetensors` + index.
    pub shards: usize,
    /// Store names with the `model.` prefix, as `Qwen3ForCausalLM` checkpoints do.
    pub model_prefix: bool,
}

impl Default for TinyModelOptions {
    fn default() -> Self {
        TinyModelOptions {
            seed: 0,
            shards: 1,
            model_prefix: false,
        }
    }
}

/// Writes the tiny model for `seed` into `dir` (created if needed). Returns the files written.
pub fn write_tiny_model(dir: &Path, seed: u64) -> ModelResult<Vec<PathBuf>> {
    write_tiny_model_with(
        dir,
        &TinyModelOptions {
            seed,
            ..Default::default()
        },
    )
}

/// Writes the tiny model with loader variations.
pub fn write_tiny_model_with(dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let cfg = tiny_config();
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
    let mut rng = SplitMix64(seed ^ 0x9E37_79B9_7F4A_7C15);
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
    let mut out = BTreeMap::new();
    for (name, shape, init) in specs {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| match init {
                Init::Normal(std) => rng.normal() * std,
                Init::NearOne => 1.0 + 0.1 * rng.normal(),
            })
            .collect();
        let t = Tensor::from_vec(data, shape, &Device::Cpu)
            .map_err(|e| ModelError::Backend(Box::new(e)))?;
        out.insert(name, t);
    }
    Ok(out)
}

#[derive(Clone, Copy)]
enum Init {
    Normal(f32),
    NearOne,
}

/// SplitMix64 with Box–Muller normals: tiny, portable, and the same on every platform.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (u1, u2) = (self.uniform(), self.uniform());
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

/// Writes `tensors` as one file or as `shards` files plus the index transformers writes.
fn write_safetensors(
    dir: &Path,
    tensors: BTreeMap<String, Tensor>,
    shards: usize,
) -> ModelResult<Vec<PathBuf>> {
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let save = |path: &Path, part: Vec<(&String, &Tensor)>| {
        safetensors::serialize_to_file(part, Some(meta.clone()), path).map_err(|e| ModelError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })
    };
    if shards == 1 {
        let path = dir.join(crate::weights::SINGLE_FILE);
        save(&path, tensors.iter().collect())?;
        return Ok(vec![path]);
    }
    let names: Vec<&String> = tensors.keys().collect();
    let per = names.len().div_ceil(shards);
    let mut weight_map = BTreeMap::new();
    let mut paths = Vec::new();
    for (s, chunk) in names.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        let path = dir.join(&file);
        save(&path, chunk.iter().map(|&n| (n, &tensors[n])).collect())?;
        for n in chunk {
            weight_map.insert((*n).clone(), file.clone());
        }
        paths.push(path);
    }
    let total: usize = tensors.values().map(|t| t.elem_count() * 4).sum();
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let path = dir.join(crate::weights::INDEX_FILE);
    write_json(&path, &index)?;
    paths.push(path);
    Ok(paths)
}
