//! The tiny model against transformers' `Qwen3Model` (vectors made by
//! `tests/golden/make_golden.py`, committed so this test needs no Python).

use crate::common;

use common::{cosine, golden_path, load, max_abs_diff};
use embedfleet_models::{LoadOptions, PackedSequences};

struct Case {
    name: String,
    text: String,
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(golden_path()).expect("read golden json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("parse golden json");
    json["cases"]
        .as_array()
        .expect("cases array")
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            text: c["text"].as_str().unwrap().to_string(),
            ids: c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect(),
            embedding: c["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect(),
        })
        .collect()
}

#[test]
fn tokenizer_matches_python_tokenizers() {
    let tok =
        embedfleet_models::load_tokenizer(common::tiny_dir(), Some(Default::default())).unwrap();
    for case in cases() {
        assert_eq!(
            tok.encode_document(&case.text).unwrap(),
            case.ids,
            "{}",
            case.name
        );
    }
}

#[test]
fn golden_vectors_one_at_a_time_and_batched() {
    let cases = cases();
    assert!(
        cases.iter().any(|c| c.ids.len() > 128),
        "golden set needs a text longer than a tile"
    );
    // A small tile so the long text spans several query and key tiles; the default as well.
    for tile in [64, 512] {
        let model = load(&LoadOptions {
            attention_tile: tile,
            ..Default::default()
        });
        let mut singles = Vec::new();
        for case in &cases {
            let got = model
                .embed(&PackedSequences::from_sequences(&[&case.ids]))
                .unwrap()
                .remove(0);
            let cos = cosine(&got, &case.embedding);
            assert!(cos >= 0.99999, "{} (tile {tile}): cosine {cos}", case.name);
            singles.push(got);
        }
        let all: Vec<&[u32]> = cases.iter().map(|c| c.ids.as_slice()).collect();
        let batched = model.embed(&PackedSequences::from_sequences(&all)).unwrap();
        assert_eq!(batched.len(), cases.len());
        for ((case, b), s) in cases.iter().zip(&batched).zip(&singles) {
            let diff = max_abs_diff(b, s);
            assert!(
                diff < 1e-5,
                "{}: batched differs from single by {diff}",
                case.name
            );
        }
    }
}
