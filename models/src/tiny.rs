//! What every family's tiny test model shares: the loader variations a test asks for
//! ([`TinyModelOptions`]), a portable seeded generator of weights, and the safetensors writer
//! that lays them out as one file or as shards with transformers' index.
//!
//! Each family writes its own tiny model (Qwen3's: `qwen3/tiny.rs`) through
//! `ModelFamily::write_tiny_model`; the same seed always gives the same bytes, so Rust tests and
//! a Python golden script see identical weights.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::error::{ModelError, ModelResult};
use crate::weights::{INDEX_FILE, SINGLE_FILE};

/// Variations used by tests of the loader.
#[derive(Debug, Clone)]
pub struct TinyModelOptions {
    pub seed: u64,
    /// 1 writes `model.safetensors`; more writes `model-0000i-of-0000n.safetensors` + index.
    pub shards: usize,
    /// Store names with the `model.` prefix, as `*ForCausalLM` checkpoints (`Qwen3ForCausalLM`)
    /// do.
    pub model_prefix: bool,
    /// The output dimension (hidden size) instead of the tiny model's 128: a model as wide as
    /// a real one's output (2,560 for Qwen3-Embedding-4B, 4,096 for 8B), still tiny otherwise.
    pub hidden_size: Option<usize>,
}

impl Default for TinyModelOptions {
    fn default() -> Self {
        TinyModelOptions {
            seed: 0,
            shards: 1,
            model_prefix: false,
            hidden_size: None,
        }
    }
}

/// How a tensor of a random model is initialised.
#[derive(Clone, Copy)]
pub enum Init {
    /// Normal with mean 0 and this standard deviation.
    Normal(f32),
    /// Near 1 (`1 + 0.1 × normal`): norm scales.
    NearOne,
}

/// Random tensors for `specs` (name, shape, init), drawn in order from one generator seeded
/// by `seed`: the same specs and seed give the same values on every platform.
pub fn random_tensors(
    specs: Vec<(String, Vec<usize>, Init)>,
    seed: u64,
) -> ModelResult<BTreeMap<String, Tensor>> {
    let mut rng = SplitMix64(seed ^ 0x9E37_79B9_7F4A_7C15);
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
pub fn write_safetensors(
    dir: &Path,
    tensors: BTreeMap<String, Tensor>,
    shards: usize,
) -> ModelResult<Vec<PathBuf>> {
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let save = |path: &Path, part: Vec<(&String, &Tensor)>| {
        safetensors::serialize_to_file(part, Some(meta.clone()), path).map_err(|e| ModelError::Io {
            path: path.to_path_buf(),
            cause: std::io::Error::other(e.to_string()),
        })
    };
    if shards == 1 {
        let path = dir.join(SINGLE_FILE);
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
    let path = dir.join(INDEX_FILE);
    write_json(&path, &index)?;
    paths.push(path);
    Ok(paths)
}

/// Writes `value` as compact JSON to `path`.
pub fn write_json(path: &Path, value: &Value) -> ModelResult<()> {
    let text =
        serde_json::to_string(value).expect("a JSON value always serialises. This is a bug.");
    std::fs::write(path, text).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        cause: source,
    })
}

/// Attention heads for a tiny model `hidden` wide: 64-wide heads where it is a real model's
/// width (768: 12), at least 4, and always a divisor of `hidden`.
pub fn heads_for(hidden: usize) -> usize {
    let wide = hidden / 64;
    if wide >= 4 && hidden.is_multiple_of(wide) {
        return wide;
    }
    [4, 2, 1]
        .into_iter()
        .find(|&h| hidden.is_multiple_of(h))
        .unwrap_or(1)
}

/// The sentence-transformers files of a tiny model: `modules.json` (the transformer, a
/// pooling, `Normalize`), `1_Pooling/config.json` with `pooling`, `sentence_bert_config.json`
/// with `max_seq_length`, and `config_sentence_transformers.json` with `prompts`.
pub fn write_st_files(
    dir: &Path,
    pooling: &str,
    hidden: usize,
    max_seq_length: usize,
    prompts: Value,
) -> ModelResult<Vec<PathBuf>> {
    std::fs::create_dir_all(dir.join("1_Pooling")).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        cause: source,
    })?;
    let files = [
        (
            "modules.json",
            serde_json::json!([
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]),
        ),
        (
            "1_Pooling/config.json",
            serde_json::json!({"word_embedding_dimension": hidden, "pooling_mode": pooling, "include_prompt": true}),
        ),
        (
            "sentence_bert_config.json",
            serde_json::json!({"max_seq_length": max_seq_length, "do_lower_case": false}),
        ),
        (
            "config_sentence_transformers.json",
            serde_json::json!({"prompts": prompts, "default_prompt_name": null}),
        ),
    ];
    let mut written = Vec::new();
    for (name, value) in files {
        let path = dir.join(name);
        write_json(&path, &value)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tiny_heads_divide_the_width_and_are_64_wide_at_a_real_width() {
        for (hidden, heads) in [
            (64, 4),
            (96, 4),
            (768, 12),
            (1024, 16),
            (100, 4),
            (30, 2),
            (9, 1),
        ] {
            assert_eq!(super::heads_for(hidden), heads, "{hidden}");
        }
    }
}
