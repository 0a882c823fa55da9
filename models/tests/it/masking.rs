//! Packing, tiling and pooling: results must not depend on batch company or tile size.

use crate::common;

use common::{cosine, ids, load, max_abs_diff};
use embedfleet_models::{matryoshka, LoadOptions, ModelError, PackedSequences};

#[test]
fn packed_batch_equals_singles_including_one_token_and_multi_tile() {
    let model = load(&LoadOptions {
        attention_tile: 32,
        ..Default::default()
    });
    let seqs = vec![
        ids(1, 1),
        ids(31, 2),
        ids(32, 3),
        ids(33, 4),
        ids(200, 5),
        ids(5, 6),
    ];
    let batched = model
        .embed(&PackedSequences::from_sequences(&seqs))
        .unwrap();
    for (seq, b) in seqs.iter().zip(&batched) {
        let single = model
            .embed(&PackedSequences::from_sequences(&[seq]))
            .unwrap()
            .remove(0);
        let diff = max_abs_diff(b, &single);
        assert!(diff < 1e-5, "len {}: {diff}", seq.len());
        let norm: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }
    // Different sequences give different vectors (pooling reads the right rows).
    assert!(cosine(&batched[1], &batched[2]) < 0.999);
}

#[test]
fn tile_size_does_not_change_the_result() {
    let seq = ids(300, 9);
    let reference = load(&LoadOptions {
        attention_tile: 4096,
        ..Default::default()
    });
    let want = reference
        .embed(&PackedSequences::from_sequences(&[&seq]))
        .unwrap()
        .remove(0);
    for tile in [7, 64, 299] {
        let model = load(&LoadOptions {
            attention_tile: tile,
            ..Default::default()
        });
        let got = model
            .embed(&PackedSequences::from_sequences(&[&seq]))
            .unwrap()
            .remove(0);
        assert!(max_abs_diff(&got, &want) < 1e-5, "tile {tile}");
    }
    // Tiles of a single token: every key tile is a full online-softmax step.
    let short = &seq[..24];
    let want = reference
        .embed(&PackedSequences::from_sequences(&[short]))
        .unwrap()
        .remove(0);
    let model = load(&LoadOptions {
        attention_tile: 1,
        ..Default::default()
    });
    let got = model
        .embed(&PackedSequences::from_sequences(&[short]))
        .unwrap()
        .remove(0);
    assert!(max_abs_diff(&got, &want) < 1e-5, "tile 1");
}

#[test]
fn later_tokens_do_not_leak_into_earlier_ones() {
    // Causality: the embedding of a prefix equals the hidden state at that position, so
    // appending tokens must not change the embedding of the prefix when embedded alone.
    let model = load(&LoadOptions {
        attention_tile: 16,
        ..Default::default()
    });
    let long = ids(80, 11);
    let a = model
        .embed(&PackedSequences::from_sequences(&[&long[..50], &long[..]]))
        .unwrap();
    let b = model
        .embed(&PackedSequences::from_sequences(&[&long[..50]]))
        .unwrap();
    assert!(max_abs_diff(&a[0], &b[0]) < 1e-5);
    assert!(cosine(&a[0], &a[1]) < 0.9999);
}

#[test]
fn matryoshka_dim_truncates_then_renormalises() {
    let full = load(&LoadOptions::default());
    let small = load(&LoadOptions {
        output_dim: Some(32),
        ..Default::default()
    });
    assert_eq!(small.output_dim(), 32);
    assert_eq!(small.hidden_size(), 128);
    let batch = PackedSequences::from_sequences(&[ids(20, 1), ids(9, 2)]);
    let f = full.embed(&batch).unwrap();
    let s = small.embed(&batch).unwrap();
    for (f, s) in f.iter().zip(&s) {
        assert_eq!(s.len(), 32);
        assert!(max_abs_diff(s, &matryoshka(f, 32)) < 1e-6);
        let norm: f32 = s.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }
    let err = embedfleet_models::load_embedder(
        common::tiny_dir(),
        &LoadOptions {
            output_dim: Some(129),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(
        err,
        ModelError::InvalidDim {
            dim: 129,
            hidden: 128
        }
    ));
}

#[test]
fn memory_cap_turns_a_big_batch_into_out_of_memory() {
    let model = load(&LoadOptions::default());
    let small = PackedSequences::from_sequences(&[ids(10, 1)]);
    let big = PackedSequences::from_sequences(&[ids(400, 1), ids(400, 2)]);
    let cap = model.estimate_memory(&[10]);
    assert!(model.estimate_memory(&[400, 400]) > cap);
    model.set_memory_limit(Some(cap));
    assert!(model.embed(&small).is_ok());
    match model.embed(&big) {
        Err(ModelError::OutOfMemory {
            needed: Some(n),
            limit: Some(l),
            ..
        }) => assert!(n > l),
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    model.set_memory_limit(None);
    assert_eq!(model.embed(&big).unwrap().len(), 2);
}

#[test]
fn malformed_batches_are_errors() {
    let model = load(&LoadOptions::default());
    let max = model.max_position_embeddings();
    let bad = [
        PackedSequences {
            ids: vec![1, 2],
            cu_seqlens: vec![0, 3],
        },
        PackedSequences {
            ids: vec![1, 2],
            cu_seqlens: vec![1, 2],
        },
        PackedSequences {
            ids: vec![1, 2],
            cu_seqlens: vec![0, 0, 2],
        },
        PackedSequences {
            ids: vec![1, 9999],
            cu_seqlens: vec![0, 2],
        },
    ];
    for b in &bad {
        assert!(
            matches!(model.embed(b), Err(ModelError::InvalidBatch(_))),
            "{b:?}"
        );
    }
    let too_long = PackedSequences::from_sequences(&[vec![1u32; max + 1]]);
    assert!(matches!(
        model.embed(&too_long),
        Err(ModelError::SequenceTooLong { .. })
    ));
    assert!(model.embed(&PackedSequences::default()).unwrap().is_empty());
}
