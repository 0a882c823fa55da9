//! Embedding: the per-node embed job (`embedfleet embed-job`) and the one-off `embedfleet embed`.

pub mod chunk;
pub mod device;
pub mod job;
pub mod minibatch;
pub mod pipeline;

use embedfleet_core::shardfile::ShardMeta;
use embedfleet_models::{DeviceSpec, Embedder, LoadOptions, ModelError, Qwen3Embedder, Tokenizer};
use std::path::Path;
use std::time::{Duration, Instant};

/// Parses a device list: what `embedfleet_models::parse_devices` takes (`cpu`, `cuda`,
/// `cuda:0,1`), plus `cpu:N` for N CPU workers — the multi-device path without a GPU.
pub fn parse_devices(spec: &str) -> Result<Vec<DeviceSpec>, ModelError> {
    if let Some(n) = spec.trim().strip_prefix("cpu:") {
        let n: usize =
            n.parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| ModelError::InvalidDevice {
                    spec: spec.into(),
                    reason: "`cpu:N` takes a positive number of workers".into(),
                })?;
        return Ok(vec![DeviceSpec::Cpu; n]);
    }
    embedfleet_models::parse_devices(spec)
}

/// Models loaded once per device, and the tokenizer they share.
pub struct LoadedModels {
    pub models: Vec<Box<dyn Embedder>>,
    pub tokenizer: Tokenizer,
    pub meta: ShardMeta,
    /// Wall time of loading all devices (in parallel).
    pub load_time: Duration,
}

/// Loads the model directory on every device, in parallel.
pub fn load_models(
    model_dir: &Path,
    devices: &[DeviceSpec],
    output_dim: Option<usize>,
    memory_limit: Option<u64>,
) -> Result<LoadedModels, ModelError> {
    let started = Instant::now();
    let loaded: Vec<Result<Qwen3Embedder, ModelError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .map(|device| {
                let options = LoadOptions {
                    device: *device,
                    output_dim,
                    memory_limit,
                    ..LoadOptions::default()
                };
                scope.spawn(move || Qwen3Embedder::load(model_dir, &options))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a model loader panicked. This is a bug."))
            .collect()
    });
    let models = loaded.into_iter().collect::<Result<Vec<_>, _>>()?;
    let first = models.first().ok_or_else(|| ModelError::InvalidDevice {
        spec: String::new(),
        reason: "no device given".into(),
    })?;
    let tokenizer = first.tokenizer()?;
    let meta = ShardMeta {
        model: model_name(model_dir),
        model_revision: model_revision(model_dir),
        compute_dtype: format!("{:?}", first.dtype()).to_lowercase(),
        pooling: "last_token".into(),
        normalized: true,
        dim: first.output_dim(),
        embedfleet_version: env!("CARGO_PKG_VERSION").into(),
        timings: None,
    };
    let models = models
        .into_iter()
        .map(|m| Box::new(m) as Box<dyn Embedder>)
        .collect();
    Ok(LoadedModels {
        models,
        tokenizer,
        meta,
        load_time: started.elapsed(),
    })
}

fn model_name(dir: &Path) -> String {
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}

/// A short hash of config.json and the weight files' fingerprints (size and first and last
/// MiB): different weights give a different revision without hashing gigabytes.
pub fn model_revision(dir: &Path) -> String {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    if let Ok(config) = std::fs::read(dir.join("config.json")) {
        hasher.update(&config);
    }
    let mut weights: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    weights.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "safetensors"));
    weights.sort();
    for path in weights {
        if let Ok(fp) = embedfleet_core::fingerprint::Fingerprint::of(&path) {
            hasher.update(&fp.size.to_le_bytes());
            hasher.update(fp.edges.as_bytes());
        }
    }
    format!("{:016x}", hasher.digest())
}
