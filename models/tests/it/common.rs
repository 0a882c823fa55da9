//! Shared helpers: a tiny model written once per test run into a temp dir.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use embedfleet_models::{load_embedder, write_tiny_model, Embedder, LoadOptions};

/// The seed the committed golden vectors were made with.
pub const GOLDEN_SEED: u64 = 0;

/// Directory holding the tiny model for `GOLDEN_SEED` (written once, kept for the process).
pub fn tiny_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("create temp dir");
        write_tiny_model(dir.path(), GOLDEN_SEED).expect("write tiny model");
        dir
    })
    .path()
}

/// Deterministic pseudo-random ids below the tiny tokenizer's vocabulary.
pub fn ids(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(salt * 97) >> 7) % 400)
        .collect()
}

pub fn load(opts: &LoadOptions) -> Box<dyn Embedder> {
    load_embedder(tiny_dir(), opts).expect("load tiny model")
}

pub fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/tiny_seed0.json")
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
