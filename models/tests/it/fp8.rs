//! FP8 projections (`--precision fp8`) in the CPU's emulation: the same quantization a GPU
//! runs (E4M3 codes, a scale per output channel and per token), the products in f32. The
//! issue's bar against the unquantized path, on the tiny random Qwen3 at every length to its
//! context. Random weights lack the activation outliers of real ones, so this is a floor, not
//! a measure of a real model's loss.

use crate::common;

use common::{cosine, ids, load, tiny_dir};
use embedfleet_models::{
    load_embedder, write_tiny_model_of, LoadOptions, ModelError, PackedSequences, TinyModelOptions,
};

#[test]
fn fp8_projections_stay_within_the_bar_against_the_unquantized_model_to_its_context() {
    let exact = load(&LoadOptions::default());
    let fp8 = load(&LoadOptions {
        fp8_projections: true,
        ..Default::default()
    });
    assert!(fp8.fp8_projections() && !exact.fp8_projections());
    let context = exact.max_position_embeddings();
    let lengths = [1, 2, 7, 16, 63, 128, 257, 1000, context];
    let mut cosines = Vec::new();
    for (salt, &len) in lengths.iter().enumerate() {
        let seqs = [ids(len, salt as u32)];
        let batch = PackedSequences::from_sequences(&seqs);
        let a = exact.embed(&batch).unwrap().remove(0);
        let b = fp8.embed(&batch).unwrap().remove(0);
        cosines.push((len, cosine(&a, &b)));
    }
    let mut sorted: Vec<f64> = cosines.iter().map(|c| c.1).collect();
    sorted.sort_by(f64::total_cmp);
    let (min, median) = (sorted[0], sorted[sorted.len() / 2]);
    eprintln!("fp8 against f32, (tokens, cosine): {cosines:?}");
    assert!(median >= 0.995 && min >= 0.99, "{cosines:?}");
    // The quantization is there: the vectors are not the unquantized ones.
    assert!(sorted.last().unwrap() < &0.999_999, "{cosines:?}");
}

#[test]
fn fp8_vectors_do_not_depend_on_their_batch_company() {
    // A token's activation scale is its own row's: packing papers together changes nothing.
    let fp8 = load(&LoadOptions {
        fp8_projections: true,
        ..Default::default()
    });
    let seqs = [ids(40, 1), ids(3, 2), ids(90, 3)];
    let together = fp8.embed(&PackedSequences::from_sequences(&seqs)).unwrap();
    for (seq, vector) in seqs.iter().zip(&together) {
        let alone = fp8
            .embed(&PackedSequences::from_sequences(std::slice::from_ref(seq)))
            .unwrap()
            .remove(0);
        assert!(cosine(vector, &alone) > 0.999_999, "{} tokens", seq.len());
    }
}

#[test]
fn an_encoder_family_refuses_fp8_naming_the_family_that_has_it() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model_of(Some("bert"), dir.path(), &TinyModelOptions::default()).unwrap();
    let err = load_embedder(
        dir.path(),
        &LoadOptions {
            fp8_projections: true,
            ..Default::default()
        },
    )
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(err, ModelError::PrecisionRefused { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("Qwen3") && message.contains("--precision"),
        "{message}"
    );
    // The Qwen3 directory loads with it (the emulation, on the CPU).
    assert!(load_embedder(
        tiny_dir(),
        &LoadOptions {
            fp8_projections: true,
            ..Default::default()
        }
    )
    .is_ok());
}
