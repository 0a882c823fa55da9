//! `make-tiny-model` and `embed`: the quickest way to try a model.

use crate::util::{read_shard, TestDir};

fn vectors(path: &std::path::Path) -> Vec<(String, Vec<f32>)> {
    read_shard(path)
        .into_iter()
        .map(|r| (r.id, r.vector))
        .collect()
}

#[test]
fn embeds_lines_documents_and_queries_with_matryoshka_dims() {
    let t = TestDir::new();
    t.run(&["make-tiny-model", "--out", "model"], 0);
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(t.join("model").join(f).is_file(), "{f}");
    }
    std::fs::write(
        t.join("texts.txt"),
        "protein folding\n\nquantum lattice models\nα-helix\n",
    )
    .unwrap();
    let docs = [
        "embed",
        "--model-dir",
        "model",
        "--input",
        "texts.txt",
        "--lines",
        "--output",
        "docs.parquet",
    ];
    t.run(&docs, 0);
    let docs = vectors(&t.join("docs.parquet"));
    assert_eq!(
        docs.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["texts.txt:1", "texts.txt:3", "texts.txt:4"]
    );
    for (_, v) in &docs {
        assert!((v.iter().map(|x| x * x).sum::<f32>().sqrt() - 1.0).abs() < 1e-4);
    }

    let query = [
        "embed",
        "--model-dir",
        "model",
        "--input",
        "texts.txt",
        "--lines",
        "--query",
        "--output",
        "q.parquet",
    ];
    t.run(&query, 0);
    let queries = vectors(&t.join("q.parquet"));
    let cos: f32 = docs[0]
        .1
        .iter()
        .zip(&queries[0].1)
        .map(|(a, b)| a * b)
        .sum();
    assert!(
        cos < 0.9999,
        "a query embeds with its instruction: cosine {cos}"
    );

    let small = [
        "embed",
        "--model-dir",
        "model",
        "--input",
        "texts.txt",
        "--lines",
        "--dim",
        "16",
        "--output",
        "s.parquet",
    ];
    t.run(&small, 0);
    let small = vectors(&t.join("s.parquet"));
    assert_eq!(small[0].1.len(), 16);
    let full = &docs[0].1[..16];
    let norm = full.iter().map(|x| x * x).sum::<f32>().sqrt();
    for (a, b) in small[0].1.iter().zip(full) {
        assert!(
            (a - b / norm).abs() < 1e-5,
            "Matryoshka: the first 16 components, renormalised"
        );
    }
}

#[test]
fn a_broken_model_directory_is_a_clear_error() {
    let t = TestDir::new();
    t.run(&["make-tiny-model", "--out", "model"], 0);
    std::fs::remove_file(t.join("model/tokenizer.json")).unwrap();
    std::fs::write(t.join("x.txt"), "text\n").unwrap();
    let out = t.run(
        &[
            "embed",
            "--model-dir",
            "model",
            "--input",
            "x.txt",
            "--lines",
            "--output",
            "o.parquet",
        ],
        1,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tokenizer.json"), "{stderr}");
    assert!(!t.join("o.parquet").exists());
}
