//! Memory-mapped weights of a Hugging Face model directory.
//!
//! Reads `model.safetensors`, or the shards listed in `model.safetensors.index.json`, without
//! copying them into memory. We keep our own routing table (tensor name -> file) instead of
//! candle's `VarBuilder::from_mmaped_safetensors` so that every error names the file and the
//! tensor, and so that names resolve with or without the `model.` prefix that `*ForCausalLM`
//! checkpoints carry (`Qwen3ForCausalLM`) and bare-model ones (`Qwen3Model`) do not. Every
//! family reads its weights through this; the tensor names are the family's.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, ModelResult};

/// Name of the single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Where tensors come from: mapped files, or tensors already in memory (benchmarks).
enum Source {
    Mmap(MmapedSafetensors),
    Memory(HashMap<String, Tensor>),
}

/// The weight files of one model directory, memory-mapped.
pub struct Weights {
    files: Vec<(PathBuf, Source)>,
    /// Tensor name as stored -> index into `files`.
    routing: HashMap<String, usize>,
    dtype: DType,
    device: Device,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths: Vec<_> = self.files.iter().map(|(p, _)| p).collect();
        f.debug_struct("Weights").field("files", &paths).finish()
    }
}

impl Weights {
    /// Opens the weights of `dir`; tensors are converted to `dtype` on `device` when fetched.
    pub fn open(dir: &Path, dtype: DType, device: &Device) -> ModelResult<Weights> {
        let paths = weight_files(dir)?;
        let mut files = Vec::with_capacity(paths.len());
        let mut routing = HashMap::new();
        for (index, path) in paths.into_iter().enumerate() {
            // SAFETY: the file is mapped read-only; a concurrent truncation of the file by
            // another process would fault, which is the documented hazard of `mmap` that every
            // safetensors loader accepts. We never write through the mapping.
            let st = unsafe { MmapedSafetensors::new(&path) }.map_err(|source| {
                ModelError::Safetensors {
                    path: path.clone(),
                    cause: Box::new(source),
                }
            })?;
            for (name, _) in st.tensors() {
                routing.insert(name, index);
            }
            files.push((path, Source::Mmap(st)));
        }
        Ok(Weights {
            files,
            routing,
            dtype,
            device: device.clone(),
        })
    }

    /// Weights from tensors in memory (random models for benchmarks), under `label`.
    pub fn from_tensors(
        tensors: HashMap<String, Tensor>,
        label: &str,
        dtype: DType,
        device: &Device,
    ) -> Weights {
        let routing = tensors.keys().map(|k| (k.clone(), 0)).collect();
        Weights {
            files: vec![(PathBuf::from(label), Source::Memory(tensors))],
            routing,
            dtype,
            device: device.clone(),
        }
    }

    /// The dtype tensors are converted to.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device tensors are loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Fetches `name` (or `model.{name}`), checks its shape and converts it.
    pub fn get(&self, name: &str, shape: &[usize]) -> ModelResult<Tensor> {
        let (stored, index) = self.resolve(name)?;
        let (path, st) = &self.files[index];
        let load_err = |source| ModelError::TensorLoad {
            name: stored.to_string(),
            path: path.clone(),
            cause: Box::new(source),
        };
        let actual = match st {
            Source::Mmap(st) => st.get(stored).map_err(load_err)?.shape().to_vec(),
            Source::Memory(map) => map[stored].dims().to_vec(),
        };
        if actual != shape {
            return Err(ModelError::TensorShape {
                name: stored.to_string(),
                path: path.clone(),
                expected: shape.to_vec(),
                actual,
            });
        }
        let tensor = match st {
            Source::Mmap(st) => st.load(stored, &self.device),
            Source::Memory(map) => map[stored].to_device(&self.device),
        };
        tensor
            .and_then(|t| t.to_dtype(self.dtype))
            .map_err(load_err)
    }

    /// The stored shape of `name` (or `model.{name}`), read from the header: nothing is loaded.
    pub fn shape_of(&self, name: &str) -> ModelResult<Vec<usize>> {
        let (stored, index) = self.resolve(name)?;
        let (path, st) = &self.files[index];
        match st {
            Source::Mmap(st) => {
                st.get(stored)
                    .map(|view| view.shape().to_vec())
                    .map_err(|source| ModelError::TensorLoad {
                        name: stored.to_string(),
                        path: path.clone(),
                        cause: Box::new(source),
                    })
            }
            Source::Memory(map) => Ok(map[stored].dims().to_vec()),
        }
    }

    /// The weight files and how many tensors they hold.
    pub fn files(&self) -> (Vec<PathBuf>, usize) {
        let paths = self.files.iter().map(|(p, _)| p.clone()).collect();
        (paths, self.routing.len())
    }

    fn resolve<'a>(&'a self, name: &str) -> ModelResult<(&'a str, usize)> {
        let candidates = std::iter::once(name.to_string())
            .chain(HEAD_PREFIXES.iter().map(|p| format!("{p}{name}")));
        for candidate in candidates {
            if let Some((stored, &index)) = self.routing.get_key_value(&candidate) {
                return Ok((stored.as_str(), index));
            }
        }
        let searched = self
            .files
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        Err(ModelError::MissingTensor {
            name: name.to_string(),
            searched,
        })
    }
}

/// The prefixes a checkpoint saved with a task head puts before the base model's names
/// (`Qwen3ForCausalLM`'s `model.`, `BertForMaskedLM`'s `bert.`, `XLMRobertaForMaskedLM`'s
/// `roberta.`); a base model or a sentence-transformers download has none.
pub const HEAD_PREFIXES: &[&str] = &["model.", "bert.", "roberta."];

/// The safetensors files of `dir`: the single file, or the shards named by the index.
fn weight_files(dir: &Path) -> ModelResult<Vec<PathBuf>> {
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join(INDEX_FILE);
    if !index.is_file() {
        return Err(ModelError::MissingFile {
            path: single,
            hint: "the directory needs model.safetensors or model.safetensors.index.json with its shards",
        });
    }
    let shards = read_index(&index)?;
    let mut paths = Vec::with_capacity(shards.len());
    for shard in shards {
        let path = dir.join(&shard);
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path,
                hint: "a shard listed in model.safetensors.index.json is absent; download it again",
            });
        }
        paths.push(path);
    }
    Ok(paths)
}

/// Distinct shard file names of an index, in a stable order.
fn read_index(path: &Path) -> ModelResult<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let invalid = |reason: String| ModelError::InvalidIndex {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        cause: source,
    })?;
    let index: Index = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let mut shards: Vec<String> = index.weight_map.into_values().collect();
    shards.sort();
    shards.dedup();
    if shards.is_empty() {
        return Err(invalid("weight_map is empty".into()));
    }
    if let Some(bad) = shards
        .iter()
        .find(|s| s.contains("..") || s.starts_with('/'))
    {
        return Err(invalid(format!(
            "shard name `{bad}` leaves the model directory"
        )));
    }
    Ok(shards)
}
