//! Loading model directories: layouts that must work, and one error per malformed case.

use crate::common;

use std::path::Path;

use candle_core::{Device, Tensor};
use common::max_abs_diff;
use embedfleet_models::{
    load_embedder, load_tokenizer, write_tiny_model, write_tiny_model_with, LoadOptions,
    ModelError, PackedSequences, TinyModelOptions,
};

fn fresh() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), 0).unwrap();
    dir
}

fn load_err(dir: &Path) -> ModelError {
    load_embedder(dir, &LoadOptions::default()).unwrap_err()
}

fn rewrite_weights(dir: &Path, edit: impl FnOnce(&mut std::collections::HashMap<String, Tensor>)) {
    let path = dir.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, &path).unwrap();
}

fn embed_one(dir: &Path) -> Vec<f32> {
    let model = load_embedder(dir, &LoadOptions::default()).unwrap();
    model
        .embed(&PackedSequences::from_sequences(&[[5u32, 80, 300, 7]]))
        .unwrap()
        .remove(0)
}

#[test]
fn sharded_and_prefixed_checkpoints_load_the_same_model() {
    let plain = embed_one(common::tiny_dir());
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model_with(
        dir.path(),
        &TinyModelOptions {
            seed: 0,
            shards: 3,
            model_prefix: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!dir.path().join("model.safetensors").exists());
    assert!(dir.path().join("model-00003-of-00003.safetensors").exists());
    assert_eq!(max_abs_diff(&plain, &embed_one(dir.path())), 0.0);
    // Another seed is another model.
    let other = tempfile::tempdir().unwrap();
    write_tiny_model(other.path(), 1).unwrap();
    assert!(max_abs_diff(&plain, &embed_one(other.path())) > 1e-3);
}

#[test]
fn same_seed_writes_identical_files() {
    let a = fresh();
    let b = fresh();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        assert_eq!(
            std::fs::read(a.path().join(f)).unwrap(),
            std::fs::read(b.path().join(f)).unwrap(),
            "{f}"
        );
    }
}

/// A mistyped directory is named as the directory that is not there, not as its config.json
/// missing; a file given for the directory is said to be one.
#[test]
fn a_missing_directory_or_a_file_is_said_to_be_one() {
    let dir = fresh();
    let typo = dir.path().join("minlm");
    let err = load_err(&typo);
    assert!(
        matches!(&err, ModelError::NoModelDir { path, what } if *path == typo && what.contains("does not exist")),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("config.json, tokenizer and weights"),
        "{err}"
    );
    let file = dir.path().join("config.json");
    let err = load_err(&file);
    assert!(
        matches!(&err, ModelError::NoModelDir { what, .. } if what.contains("is a file")),
        "{err}"
    );
}

#[test]
fn missing_config() {
    let dir = fresh();
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::MissingFile { path, .. } if path.ends_with("config.json")),
        "{err}"
    );
}

#[test]
fn config_that_is_not_json() {
    let dir = fresh();
    std::fs::write(dir.path().join("config.json"), "{\"hidden_size\": 12,").unwrap();
    assert!(matches!(
        load_err(dir.path()),
        ModelError::ConfigParse { .. }
    ));
}

#[test]
fn config_of_another_model() {
    let dir = fresh();
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"qwen3\"", "\"llama\"");
    std::fs::write(&path, text).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::UnsupportedConfig { reason, .. } if reason.contains("llama")),
        "{err}"
    );
}

#[test]
fn missing_weights() {
    let dir = fresh();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::MissingFile { path, .. } if path.ends_with("model.safetensors")),
        "{err}"
    );
}

#[test]
fn missing_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model_with(
        dir.path(),
        &TinyModelOptions {
            seed: 0,
            shards: 2,
            model_prefix: false,
            ..Default::default()
        },
    )
    .unwrap();
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::MissingFile { path, .. } if path.ends_with("model-00002-of-00002.safetensors")),
        "{err}"
    );
}

#[test]
fn corrupt_weights_file() {
    let dir = fresh();
    std::fs::write(
        dir.path().join("model.safetensors"),
        b"not a safetensors file",
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::Safetensors { path, .. } if path.ends_with("model.safetensors")),
        "{err}"
    );
}

#[test]
fn missing_tensor() {
    let dir = fresh();
    rewrite_weights(dir.path(), |t| {
        t.remove("layers.1.self_attn.k_norm.weight");
    });
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::MissingTensor { name, .. } if name == "layers.1.self_attn.k_norm.weight"),
        "{err}"
    );
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn tensor_with_wrong_shape() {
    let dir = fresh();
    rewrite_weights(dir.path(), |t| {
        t.insert(
            "layers.0.mlp.up_proj.weight".into(),
            Tensor::zeros((128, 256), candle_core::DType::F32, &Device::Cpu).unwrap(),
        );
    });
    let err = load_err(dir.path());
    match &err {
        ModelError::TensorShape {
            name,
            path,
            expected,
            actual,
        } => {
            assert_eq!(name, "layers.0.mlp.up_proj.weight");
            assert!(path.ends_with("model.safetensors"));
            assert_eq!(
                (expected.as_slice(), actual.as_slice()),
                (&[256, 128][..], &[128, 256][..])
            );
        }
        _ => panic!("expected TensorShape, got {err}"),
    }
}

#[test]
fn tokenizer_without_endoftext() {
    let dir = fresh();
    let path = dir.path().join("tokenizer.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("<|endoftext|>", "<|end|>");
    std::fs::write(&path, text).unwrap();
    load_embedder(dir.path(), &LoadOptions::default()).unwrap();
    assert!(matches!(
        load_tokenizer(dir.path(), Some(Default::default())).unwrap_err(),
        ModelError::MissingEos { .. }
    ));
}

#[test]
fn missing_or_broken_tokenizer() {
    let dir = fresh();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, "{}").unwrap();
    load_embedder(dir.path(), &LoadOptions::default()).unwrap();
    assert!(matches!(
        load_tokenizer(dir.path(), Some(Default::default())).unwrap_err(),
        ModelError::Tokenizer { .. }
    ));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        load_tokenizer(dir.path(), Some(Default::default())).unwrap_err(),
        ModelError::MissingFile { .. }
    ));
}
