use super::*;

const DEFAULTS: LayoutDefaults = LayoutDefaults {
    pooling: Pooling::Cls,
    poolings: &[Pooling::Cls, Pooling::Mean, Pooling::LastToken],
    dense: true,
    query_prompt: "",
    document_prompt: "",
    say_when_used: true,
};

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// all-MiniLM-L6-v2's files as the Hub ships them (legacy keys).
fn minilm(dir: &Path) {
    write(
        dir,
        "modules.json",
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
            {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
    );
    write(
        dir,
        "1_Pooling/config.json",
        r#"{"word_embedding_dimension":384,"pooling_mode_cls_token":false,
            "pooling_mode_mean_tokens":true,"pooling_mode_max_tokens":false,
            "pooling_mode_mean_sqrt_len_tokens":false}"#,
    );
    write(
        dir,
        "sentence_bert_config.json",
        r#"{"max_seq_length":256,"do_lower_case":false}"#,
    );
}

#[test]
fn the_hubs_legacy_files_give_pooling_normalize_and_length() {
    let dir = tempfile::tempdir().unwrap();
    minilm(dir.path());
    let layout = SentenceLayout::read(dir.path(), &DEFAULTS).unwrap();
    assert_eq!(layout.pooling, Pooling::Mean);
    assert!(layout.normalize && layout.from_files && layout.dense.is_empty());
    assert_eq!(layout.max_seq_length, Some(256));
    assert_eq!(layout.output_width(384), 384);
}

/// The length as sentence-transformers 6 reads it: a tokenizer argument's `model_max_length`
/// over `max_seq_length`; where sentence_bert_config.json gives neither (sentence-transformers
/// ≥ 5.4 saves it so), tokenizer_config.json's `model_max_length`; transformers' "no limit"
/// (1e30) is none.
#[test]
fn the_length_is_read_where_sentence_transformers_6_reads_and_saves_it() {
    let length = |sbert: Option<&str>, tokenizer: Option<&str>| {
        let dir = tempfile::tempdir().unwrap();
        minilm(dir.path());
        std::fs::remove_file(dir.path().join("sentence_bert_config.json")).unwrap();
        if let Some(text) = sbert {
            write(dir.path(), "sentence_bert_config.json", text);
        }
        if let Some(text) = tokenizer {
            write(dir.path(), "tokenizer_config.json", text);
        }
        SentenceLayout::read(dir.path(), &DEFAULTS)
            .unwrap()
            .max_seq_length
    };
    let saved_by_6 =
        r#"{"transformer_task": "feature-extraction", "module_output_name": "token_embeddings"}"#;
    assert_eq!(
        length(Some(saved_by_6), Some(r#"{"model_max_length": 60}"#)),
        Some(60)
    );
    assert_eq!(
        length(None, Some(r#"{"model_max_length": 128}"#)),
        Some(128)
    );
    assert_eq!(
        length(
            Some(r#"{"max_seq_length": 256}"#),
            Some(r#"{"model_max_length": 512}"#)
        ),
        Some(256),
        "sentence_bert_config.json's wins"
    );
    assert_eq!(
        length(
            Some(r#"{"max_seq_length": 256, "tokenizer_args": {"model_max_length": 64}}"#),
            None
        ),
        Some(64)
    );
    assert_eq!(
        length(
            Some(r#"{"max_seq_length": 256, "processor_kwargs": {"model_max_length": 32}}"#),
            None
        ),
        Some(32)
    );
    assert_eq!(
        length(
            None,
            Some(r#"{"model_max_length": 1000000000000000019884624838656}"#)
        ),
        None
    );
    assert_eq!(length(None, None), None);
}

#[test]
fn a_directory_without_the_files_has_the_familys_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let defaults = LayoutDefaults {
        query_prompt: "query: ",
        document_prompt: "passage: ",
        ..DEFAULTS
    };
    let layout = SentenceLayout::read(dir.path(), &defaults).unwrap();
    assert_eq!(layout.pooling, Pooling::Cls);
    assert!(!layout.from_files && !layout.normalize);
    assert_eq!(
        (
            layout.query_prompt.as_str(),
            layout.document_prompt.as_str()
        ),
        ("query: ", "passage: ")
    );
}

/// EmbeddingGemma's layout as sentence-transformers 5+ writes it: new pooling keys, two dense
/// projections without bias or activation, task prompts.
#[test]
fn new_keys_dense_modules_and_prompts_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "modules.json",
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.base.modules.transformer.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
            {"idx":2,"name":"2","path":"2_Dense","type":"sentence_transformers.base.modules.dense.Dense"},
            {"idx":3,"name":"3","path":"3_Dense","type":"sentence_transformers.base.modules.dense.Dense"},
            {"idx":4,"name":"4","path":"4_Normalize","type":"sentence_transformers.base.modules.normalize.Normalize"}]"#,
    );
    write(
        d,
        "1_Pooling/config.json",
        r#"{"embedding_dimension":768,"pooling_mode":"mean","include_prompt":true}"#,
    );
    for (folder, i, o) in [("2_Dense", 768, 3072), ("3_Dense", 3072, 768)] {
        write(
            d,
            &format!("{folder}/config.json"),
            &format!(
                r#"{{"in_features":{i},"out_features":{o},"bias":false,
                    "activation_function":"torch.nn.modules.linear.Identity"}}"#
            ),
        );
        write(d, &format!("{folder}/model.safetensors"), "");
    }
    write(
        d,
        "config_sentence_transformers.json",
        r#"{"prompts":{"query":"task: search result | query: ","document":"title: none | text: ",
            "STS":"task: sentence similarity | query: "},"default_prompt_name":null}"#,
    );
    let layout = SentenceLayout::read(d, &DEFAULTS).unwrap();
    assert_eq!(layout.pooling, Pooling::Mean);
    assert_eq!(layout.dense.len(), 2);
    assert_eq!(
        (layout.dense[0].in_features, layout.dense[0].out_features),
        (768, 3072)
    );
    assert!(!layout.dense[1].bias);
    assert_eq!(layout.dense[1].activation, DenseActivation::Identity);
    assert_eq!(layout.output_width(768), 768);
    assert_eq!(layout.query_prompt, "task: search result | query: ");
    assert_eq!(layout.document_prompt, "title: none | text: ");
}

#[test]
fn a_passage_prompt_is_the_documents_and_tanh_is_the_dense_default() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "config_sentence_transformers.json",
        r#"{"prompts":{"query":"query: ","passage":"passage: "}}"#,
    );
    write(
        d,
        "modules.json",
        r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
            {"path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
            {"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#,
    );
    write(d, "1_Pooling/config.json", r#"{"pooling_mode":["cls"]}"#);
    write(
        d,
        "2_Dense/config.json",
        r#"{"in_features":8,"out_features":4}"#,
    );
    write(d, "2_Dense/model.safetensors", "");
    let layout = SentenceLayout::read(d, &DEFAULTS).unwrap();
    assert_eq!(layout.document_prompt, "passage: ");
    assert_eq!(layout.query_prompt, "query: ");
    assert_eq!(layout.pooling, Pooling::Cls);
    assert!(layout.dense[0].bias);
    assert_eq!(layout.dense[0].activation, DenseActivation::Tanh);
    assert!(!layout.normalize);
}

fn refusal(d: &Path, defaults: &LayoutDefaults) -> String {
    SentenceLayout::read(d, defaults).unwrap_err().to_string()
}

#[test]
fn modules_we_do_not_implement_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "modules.json",
        r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
            {"path":"1_WeightedLayerPooling","type":"sentence_transformers.models.WeightedLayerPooling"}]"#,
    );
    let why = refusal(d, &DEFAULTS);
    assert!(
        why.contains("`sentence_transformers.models.WeightedLayerPooling`"),
        "{why}"
    );
    assert!(
        why.contains("1_WeightedLayerPooling") && why.contains("modules.json"),
        "{why}"
    );
    write(
        d,
        "modules.json",
        r#"[{"path":"","type":"my_package.CustomEncoder"}]"#,
    );
    assert!(refusal(d, &DEFAULTS).contains("`my_package.CustomEncoder`"));
}

#[test]
fn poolings_dense_weights_and_activations_we_lack_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    minilm(d);
    write(
        d,
        "1_Pooling/config.json",
        r#"{"pooling_mode_max_tokens":true}"#,
    );
    assert!(refusal(d, &DEFAULTS).contains("pooling `max` is not implemented"));
    write(
        d,
        "1_Pooling/config.json",
        r#"{"pooling_mode_cls_token":true,"pooling_mode_mean_tokens":true}"#,
    );
    assert!(refusal(d, &DEFAULTS).contains("several pooling modes"));
    write(
        d,
        "1_Pooling/config.json",
        r#"{"pooling_mode":"mean","include_prompt":false}"#,
    );
    assert!(refusal(d, &DEFAULTS).contains("include_prompt"));
    write(d, "1_Pooling/config.json", r#"{"pooling_mode":"mean"}"#);
    let last_only = LayoutDefaults {
        poolings: &[Pooling::LastToken],
        dense: false,
        ..DEFAULTS
    };
    let why = refusal(d, &last_only);
    assert!(
        why.contains("pooling `mean` is not one this model family computes (last_token)"),
        "{why}"
    );

    write(
        d,
        "modules.json",
        r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
            {"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#,
    );
    write(
        d,
        "2_Dense/config.json",
        r#"{"in_features":8,"out_features":4}"#,
    );
    write(d, "2_Dense/pytorch_model.bin", "");
    assert!(refusal(d, &DEFAULTS).contains("PyTorch pickle"));
    assert!(refusal(d, &last_only).contains("does not apply"));
    write(d, "2_Dense/model.safetensors", "");
    write(
        d,
        "2_Dense/config.json",
        r#"{"in_features":8,"out_features":4,"activation_function":"torch.nn.modules.activation.GELU"}"#,
    );
    assert!(refusal(d, &DEFAULTS).contains("activation `torch.nn.modules.activation.GELU`"));
    write(
        d,
        "modules.json",
        r#"[{"path":"0_Transformer","type":"sentence_transformers.models.Transformer"}]"#,
    );
    assert!(refusal(d, &DEFAULTS).contains("saved in `0_Transformer`"));
}

#[test]
fn null_prompts_read_as_none_and_the_default_prompt_serves_a_query_without_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "config_sentence_transformers.json",
        r#"{"prompts": null}"#,
    );
    let layout = SentenceLayout::read(d, &DEFAULTS).unwrap();
    assert_eq!(
        (
            layout.query_prompt.as_str(),
            layout.document_prompt.as_str()
        ),
        ("", "")
    );
    write(
        d,
        "config_sentence_transformers.json",
        r#"{"prompts": {"retrieval": "Represent this: "}, "default_prompt_name": "retrieval"}"#,
    );
    let layout = SentenceLayout::read(d, &DEFAULTS).unwrap();
    assert_eq!(layout.query_prompt, "Represent this: ");
    assert_eq!(layout.document_prompt, "Represent this: ");
}

#[test]
fn a_fifo_or_a_huge_file_in_place_of_a_json_file_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = std::ffi::CString::new(d.join("modules.json").to_str().unwrap()).unwrap();
    // SAFETY: a path of our own temporary directory, NUL-terminated.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let why = refusal(d, &DEFAULTS);
    assert!(why.contains("not a regular JSON file"), "{why}");
    std::fs::remove_file(d.join("modules.json")).unwrap();
    let big = std::fs::File::create(d.join("modules.json")).unwrap();
    big.set_len(2 << 20).unwrap();
    assert!(refusal(d, &DEFAULTS).contains("not a regular JSON file"));
}
