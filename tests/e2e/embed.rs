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

/// `bench-gpu`'s JSON lines on stdout.
fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

#[test]
fn bench_gpu_measures_in_the_peers_fields_and_checks_fidelity_on_any_device() {
    let t = TestDir::new();
    t.run(&["make-tiny-model", "--out", "model"], 0);
    // The tiny model's own golden file (transformers' vectors), as gpu-check.sh writes one
    // for the 4B shape.
    let golden =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/tiny_seed0.json");
    std::fs::write(t.join("mix.json"), "[5, 300, 17, 2000, 64, 64, 900]").unwrap();
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench-gpu",
            "--model-dir",
            "model",
            "--devices",
            "cpu:2",
            "--shapes",
            "2x64,1x200",
            "--forwards",
            "1",
            "--mix",
            "mix.json",
            "--batch-tokens",
            "2048",
        ];
        args.extend_from_slice(extra);
        json_lines(&t.run(&args, 0))
    };
    let golden = golden.to_str().unwrap();
    let lines = bench(&["--fidelity", golden, "--save-vectors", "v.json"]);
    let fidelity: Vec<_> = lines.iter().filter(|l| l["event"] == "fidelity").collect();
    assert_eq!(fidelity.len(), 8, "{lines:?}");
    for f in fidelity {
        assert!(f["cosine"].as_f64().unwrap() >= 0.99999, "{f}");
    }
    let runs: Vec<_> = lines.iter().filter(|l| l["event"] == "bench").collect();
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    // The token-budget mix first, so a run cut short on a GPU still has its headline figure
    // and the vectors the later steps compare with (issue 40).
    assert_eq!(
        labels,
        [
            "mix_packed_token_budget",
            "uniform_b2_t64",
            "uniform_b1_t200",
            "mix_packed_study_batches"
        ]
    );
    for r in &runs {
        for field in ["secs", "real_tok_per_s", "tflops_useful", "estimate_gb"] {
            assert!(r[field].as_f64().unwrap() > 0.0, "{field}: {r}");
        }
        assert!(
            r["peak_mem_gb"].is_null(),
            "no device memory on the CPU: {r}"
        );
        assert_eq!(r["attention"], "tiled-cpu", "the CPU's own kernel: {r}");
    }
    let mixes: Vec<_> = runs
        .iter()
        .filter(|r| r["label"].as_str().unwrap().starts_with("mix_"))
        .collect();
    let mix = mixes[0];
    assert_eq!(mix["real_tokens"], 5 + 300 + 17 + 2000 + 64 + 64 + 900);
    assert!(mix["padded_tokens"].as_u64() >= mix["real_tokens"].as_u64());
    // The same mix again, mini-batches not planned by memory: the same vectors.
    let again = bench(&[
        "--skip-uniform",
        "--no-memory-plan",
        "--compare-vectors",
        "v.json",
    ]);
    let compare = again.iter().find(|l| l["event"] == "compare").unwrap();
    assert!(
        compare["min_cosine"].as_f64().unwrap() >= 0.99999,
        "{compare}"
    );
    assert_eq!(compare["papers"], 7);
    // EMBEDFLEET_ATTENTION=blockwise puts back candle's blockwise kernel on the CPU (the tiled
    // kernel's A/B reference): said in each run, and the same vectors.
    let out = t
        .cmd(&[
            "bench-gpu",
            "--model-dir",
            "model",
            "--devices",
            "cpu",
            "--skip-uniform",
            "--skip-study",
            "--mix",
            "mix.json",
            "--compare-vectors",
            "v.json",
        ])
        .env("EMBEDFLEET_ATTENTION", "blockwise")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let blockwise = json_lines(&out);
    for r in blockwise.iter().filter(|l| l["event"] == "bench") {
        assert_eq!(r["attention"], "blockwise", "{r}");
    }
    let compare = blockwise.iter().find(|l| l["event"] == "compare").unwrap();
    assert!(
        compare["min_cosine"].as_f64().unwrap() >= 0.99999,
        "{compare}"
    );
    // Every mix run names its attention plans: few, none under the length floor.
    for r in &mixes {
        let plans = r["plans"].as_array().unwrap();
        assert!(!plans.is_empty() && plans.len() <= 4, "{r}");
        assert!(plans.iter().all(|p| p[1].as_u64().unwrap() >= 1024), "{r}");
    }

    // The decode-shaped mix (1-token sequences only) goes through the same planning: one
    // plan, at the floor, not 1×1.
    std::fs::write(t.join("decode.json"), format!("[{}]", ["1"; 64].join(","))).unwrap();
    let decode = json_lines(&t.run(
        &[
            "bench-gpu",
            "--model-dir",
            "model",
            "--devices",
            "cpu",
            "--skip-uniform",
            "--skip-study",
            "--mix",
            "decode.json",
        ],
        0,
    ));
    let run = decode.iter().find(|l| l["event"] == "bench").unwrap();
    assert_eq!(run["real_tokens"], 64);
    let plans = run["plans"].as_array().unwrap();
    assert!(
        plans.iter().all(|p| p[1] == 1024),
        "1-token sequences plan at the floor: {run}"
    );

    // A fidelity case that cannot run (a token id past the vocabulary) is one line: the other
    // cases and the measurements still come, and the exit code says something failed.
    let mut cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
    let first = cases["cases"][0].clone();
    let mut broken = first.clone();
    broken["name"] = "broken".into();
    broken["ids"] = serde_json::json!([1, 999_999_999u64]);
    cases["cases"] = serde_json::json!([broken, first]);
    std::fs::write(t.join("cases.json"), cases.to_string()).unwrap();
    let out = t.run(
        &[
            "bench-gpu",
            "--model-dir",
            "model",
            "--devices",
            "cpu",
            "--shapes",
            "1x64",
            "--forwards",
            "1",
            "--skip-mix",
            "--fidelity",
            "cases.json",
        ],
        1,
    );
    let lines = json_lines(&out);
    let error = lines
        .iter()
        .find(|l| l["event"] == "fidelity_error")
        .unwrap();
    assert_eq!(error["name"], "broken");
    assert!(!error["error"].as_str().unwrap().is_empty());
    assert_eq!(
        lines.iter().filter(|l| l["event"] == "fidelity").count(),
        1,
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l["label"] == "uniform_b1_t64"));
}

/// The 4B/8B attention layout (32 query heads of 128 over 8 key/value heads), transformers'
/// init and lengths across many tiles, against an independent float64 implementation of
/// transformers' Qwen3 math (`tests/golden/qwen3_numpy_reference.py`): the golden file above
/// is the tiny layout only. f32 must match it; bf16 (on the CPU) must stay within bf16's drift,
/// which is how a GPU's loss of fidelity with length was told from precision (issue 40).
#[test]
fn bench_gpu_matches_a_float64_reference_on_the_4b_attention_layout() {
    let t = TestDir::new();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/qwen3_numpy_reference.py");
    let out = t.join("model");
    let code = format!(
        "import os, runpy, sys; os.environ.update(HIDDEN='512', INTER='1024'); \
         sys.argv = [{script:?}, {out:?}, '1,700,1100', '2']; runpy.run_path({script:?}, run_name='__main__')",
        script = script.to_str().unwrap(),
        out = out.to_str().unwrap(),
    );
    if crate::util::python(&code, "numpy", "EMBEDFLEET_REQUIRE_PANDAS").is_none() {
        return;
    }
    t.run(&["make-tiny-model", "--out", "tiny"], 0);
    std::fs::copy(t.join("tiny/tokenizer.json"), out.join("tokenizer.json")).unwrap();
    for (dtype, floor) in [("f32", 0.9999999), ("bf16", 0.9999)] {
        let cosines = fidelity_cosines(&t, dtype, "model/fidelity.json");
        assert_eq!(cosines.len(), 3);
        assert!(
            cosines.iter().all(|&c| c >= floor),
            "{dtype}: cosines {cosines:?} below {floor}"
        );
    }
}

/// `bench-gpu --fidelity` of the model in `model/` on the CPU in `dtype`: each case's cosine.
fn fidelity_cosines(t: &TestDir, dtype: &str, cases: &str) -> Vec<f64> {
    let lines = json_lines(&t.run(
        &[
            "bench-gpu",
            "--model-dir",
            "model",
            "--devices",
            "cpu",
            "--dtype",
            dtype,
            "--skip-uniform",
            "--skip-mix",
            "--fidelity",
            cases,
        ],
        0,
    ));
    assert!(
        lines.iter().all(|l| l["event"] != "fidelity_error"),
        "{lines:?}"
    );
    lines
        .iter()
        .filter(|l| l["event"] == "fidelity")
        .map(|l| l["cosine"].as_f64().unwrap())
        .collect()
}

/// Against transformers itself, not a copy of its math: `benches/torch_baseline.py` (the GPU
/// check's reference) builds a random Qwen3 with PyTorch on the CPU and writes its f32
/// embeddings of 1 to 2,048 random tokens; ours must equal them in f32 to float rounding and
/// stay within bf16's drift in bf16. It caught the reference's own bug: `.to(bf16)` had rounded
/// the rotary frequencies, which moved the reference 9e-6 off at 2,048 tokens here and to 0.47
/// at 32,768 on the 4B shape (issue 40).
#[test]
fn bench_gpu_matches_transformers_from_one_to_2048_tokens() {
    let Some(python) = crate::util::torch_python() else {
        return;
    };
    let t = TestDir::new();
    t.run(&["make-tiny-model", "--out", "tok"], 0);
    let out = std::process::Command::new(&python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/torch_baseline.py"
        ))
        .env("MODEL_OUT", t.join("model"))
        .env("TOKENIZER", t.join("tok/tokenizer.json"))
        .env("FIDELITY_OUT", t.join("fidelity.json"))
        .env("FIDELITY_LENGTHS", "1 16 512 2048")
        .env("SHAPE", "tiny")
        .env("DEVICE", "cpu")
        .env("BENCH", "0")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "torch_baseline.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The reference is sound: PyTorch's own bf16 forward stays near it at every length.
    let peer = json_lines(&out);
    let peer: Vec<f64> = peer
        .iter()
        .filter(|l| l["event"] == "peer_fidelity")
        .map(|l| l["cosine"].as_f64().unwrap())
        .collect();
    assert_eq!(peer.len(), 4, "{}", String::from_utf8_lossy(&out.stdout));
    assert!(peer.iter().all(|&c| c >= 0.9999), "PyTorch bf16: {peer:?}");
    for (dtype, floor) in [("f32", 1.0 - 1e-9), ("bf16", 0.999)] {
        let cosines = fidelity_cosines(&t, dtype, "fidelity.json");
        assert_eq!(cosines.len(), 4);
        assert!(
            cosines.iter().all(|&c| c >= floor),
            "{dtype}: cosines {cosines:?} below {floor}"
        );
    }
}
