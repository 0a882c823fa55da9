//! Every family of the registry, through the same calls the embed job makes: its tiny model
//! written, checked, loaded and run. What must hold whatever the architecture: vectors of unit
//! length and the declared width, a packed batch equal to its sequences one by one, a task
//! head's prefixed names and sharded files loading the same model, and the directory's pooling
//! and prompts read from its files.

use embedfleet_models::registry::FAMILIES;
use embedfleet_models::{
    family_of, load_embedder, load_tokenizer, model_layout, verify_model_dir, LoadOptions,
    PackedSequences, TextRule, TinyModelOptions,
};

const TEXTS: [&str; 3] = [
    "Attention over long papers is computed in tiles.",
    "We embed the full text of scientific papers",
    "a",
];

fn vectors(dir: &std::path::Path) -> Vec<Vec<f32>> {
    let tokenizer = load_tokenizer(dir, Some(TextRule::AsGiven)).unwrap();
    let model = load_embedder(dir, &LoadOptions::default()).unwrap();
    let seqs: Vec<Vec<u32>> = TEXTS
        .iter()
        .map(|t| tokenizer.encode_document(t).unwrap())
        .collect();
    let packed = model
        .embed(&PackedSequences::from_sequences(&seqs))
        .unwrap();
    for (seq, together) in seqs.iter().zip(&packed) {
        let alone = model
            .embed(&PackedSequences::from_sequences(&[seq]))
            .unwrap()
            .remove(0);
        let cos: f32 = alone.iter().zip(together).map(|(a, b)| a * b).sum();
        assert!(cos > 0.99999, "packed and alone differ: cosine {cos}");
        assert_eq!(alone.len(), model.output_dim());
        let norm: f32 = alone.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    }
    packed
}

#[test]
fn every_family_writes_checks_loads_and_embeds_its_tiny_model() {
    for family in FAMILIES {
        let name = family.model_type();
        let dir = tempfile::tempdir().unwrap();
        family
            .write_tiny_model(dir.path(), &TinyModelOptions::default())
            .unwrap();
        assert_eq!(family_of(dir.path()).unwrap().model_type(), name);
        let summary = verify_model_dir(dir.path()).unwrap();
        assert_eq!(summary.model_type, name);
        let plain = vectors(dir.path());
        assert_ne!(plain[0], plain[1], "{name}: two texts, one vector");

        let other = tempfile::tempdir().unwrap();
        let opts = TinyModelOptions {
            shards: 3,
            model_prefix: true,
            ..Default::default()
        };
        family.write_tiny_model(other.path(), &opts).unwrap();
        assert_eq!(
            vectors(other.path()),
            plain,
            "{name}: prefixed shards differ"
        );
    }
}

#[test]
fn the_directorys_files_give_pooling_prompts_and_context() {
    let dir = tempfile::tempdir().unwrap();
    let xlmr = embedfleet_models::registry::family("xlm-roberta").unwrap();
    xlmr.write_tiny_model(dir.path(), &TinyModelOptions::default())
        .unwrap();
    let layout = model_layout(dir.path()).unwrap();
    assert_eq!(layout.pooling.name(), "mean");
    assert_eq!(layout.document_prompt, "passage: ");
    assert_eq!(
        embedfleet_models::query_instruction(dir.path()).unwrap(),
        "query: "
    );
    let tokenizer = load_tokenizer(dir.path(), Some(TextRule::AsGiven)).unwrap();
    let with_prompt = tokenizer.encode_document("the papers").unwrap();
    let without = tokenizer.encode_raw("the papers").unwrap();
    assert_eq!(
        with_prompt[1..with_prompt.len() - 1].len(),
        tokenizer.encode_raw("passage: the papers").unwrap().len()
    );
    assert!(with_prompt.len() > without.len() + 2);
    assert_eq!(
        (with_prompt[0], *with_prompt.last().unwrap()),
        (0, 2),
        "<s> … </s>"
    );
    // The tiny context is the positions after RoBERTa's offset, as the card's
    // sentence_bert_config.json says.
    let model = load_embedder(dir.path(), &LoadOptions::default()).unwrap();
    assert_eq!(model.max_position_embeddings(), 128);
    let too_long = vec![5u32; 129];
    assert!(model
        .embed(&PackedSequences::from_sequences(&[too_long]))
        .is_err());

    // A Matryoshka width a BERT was not trained for is refused with the width it has.
    let err = load_embedder(
        dir.path(),
        &LoadOptions {
            output_dim: Some(32),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--dim 32") && err.contains("trained at 64"),
        "{err}"
    );
}

#[test]
fn a_custom_module_is_refused_by_name_at_load_and_check() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::registry::family("bert")
        .unwrap()
        .write_tiny_model(dir.path(), &TinyModelOptions::default())
        .unwrap();
    std::fs::write(
        dir.path().join("modules.json"),
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Custom","type":"my_lab.modules.AttentionPooling"}]"#,
    )
    .unwrap();
    for err in [
        verify_model_dir(dir.path()).unwrap_err().to_string(),
        load_embedder(dir.path(), &LoadOptions::default())
            .unwrap_err()
            .to_string(),
    ] {
        assert!(err.contains("`my_lab.modules.AttentionPooling`"), "{err}");
    }
}

/// The conventions of sentence-transformers' `Transformer` module and transformers' tokenizer
/// classes, where a directory's files leave them out: a text is prepared by the run's rule
/// (today's sentence-transformers: as given; ≤ 5.3's and a run pinned before the rule was
/// recorded: stripped), lowercased where `do_lower_case` says so (by the normalizer, one
/// character at a time; by the whole string under the old rule), and framed by the family's
/// special tokens where the file's post-processor adds none.
#[test]
fn texts_are_prepared_by_the_rule_lowercased_and_framed_as_sentence_transformers_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let xlmr = embedfleet_models::registry::family("xlm-roberta").unwrap();
    xlmr.write_tiny_model(dir.path(), &TinyModelOptions::default())
        .unwrap();
    let as_given = Some(TextRule::AsGiven);
    // As given: the trailing space and newline are tokens of the text where the tokenizer keeps
    // whitespace (RoBERTa's byte-level pieces; XLM-R's splits on it first).
    let roberta = tempfile::tempdir().unwrap();
    embedfleet_models::registry::family("roberta")
        .unwrap()
        .write_tiny_model(roberta.path(), &TinyModelOptions::default())
        .unwrap();
    let tok = load_tokenizer(roberta.path(), as_given).unwrap();
    assert_ne!(
        tok.encode_document("the papers \n").unwrap(),
        tok.encode_document("the papers").unwrap()
    );
    // Stripped as a whole, prompt included: the ends only; a run pinned before the rule was
    // recorded (`None`) was stripped so too.
    for old in [Some(TextRule::Stripped), None] {
        let tok = load_tokenizer(roberta.path(), old).unwrap();
        let padded = tok.encode_document("the papers \n").unwrap();
        assert_eq!(
            padded,
            tok.encode_document("the papers").unwrap(),
            "{old:?}"
        );
    }
    let tok = load_tokenizer(dir.path(), Some(TextRule::Stripped)).unwrap();
    assert_eq!(
        tok.input_text(None, " the papers \n"),
        "passage:  the papers"
    );
    let tok = load_tokenizer(dir.path(), as_given).unwrap();
    assert_eq!(
        tok.input_text(None, " the papers \n"),
        "passage:  the papers \n"
    );
    assert_ne!(
        tok.encode_document("The Papers").unwrap(),
        tok.encode_document("the papers").unwrap(),
        "the tiny Unigram is cased"
    );
    std::fs::write(
        dir.path().join("sentence_bert_config.json"),
        r#"{"max_seq_length": 128, "do_lower_case": true}"#,
    )
    .unwrap();
    for rule in [as_given, Some(TextRule::Stripped), None] {
        let tok = load_tokenizer(dir.path(), rule).unwrap();
        assert_eq!(
            tok.encode_document("The Papers").unwrap(),
            tok.encode_document("the papers").unwrap(),
            "{rule:?}"
        );
    }
    // One character at a time under today's rule: a word-final capital sigma is σ, not the
    // ς of the whole string's lowercase mapping (Python's str.lower()).
    let tok = load_tokenizer(dir.path(), as_given).unwrap();
    assert_eq!(
        tok.encode_raw("ΟΔΟΣ").unwrap(),
        tok.encode_raw("οδοσ").unwrap()
    );
    assert_ne!(
        tok.encode_raw("οδοσ").unwrap(),
        tok.encode_raw("οδος").unwrap(),
        "the tiny vocabulary tells σ from ς"
    );
    let tok = load_tokenizer(dir.path(), Some(TextRule::Stripped)).unwrap();
    assert_eq!(
        tok.input_text(None, "ΟΔΟΣ"),
        "passage: οδος",
        "the old rule lowercases the whole string"
    );

    // A tokenizer.json without a post-processor: <s> … </s> all the same.
    let path = dir.path().join("tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    json["post_processor"] = serde_json::Value::Null;
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let tok = load_tokenizer(dir.path(), as_given).unwrap();
    assert_eq!(
        (tok.framing().prefix.clone(), tok.framing().suffix.clone()),
        (vec![0], vec![2])
    );
    // The document prompt's own ids, which open the chunks after a paper's first.
    assert_eq!(
        tok.document_prompt_ids(),
        tok.encode_raw("passage: ").unwrap().as_slice()
    );
    assert!(!tok.document_prompt_ids().is_empty());
}

#[test]
fn embeddinggemma_refuses_float16() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::registry::family("gemma3_text")
        .unwrap()
        .write_tiny_model(dir.path(), &TinyModelOptions::default())
        .unwrap();
    let err = load_embedder(
        dir.path(),
        &LoadOptions {
            dtype: Some(embedfleet_models::DType::F16),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("float16"), "{err}");
}
