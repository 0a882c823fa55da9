//! Small deterministic `tokenizer.json`s of each kind the encoder families ship, for their
//! tiny test models: WordPiece (BERT's), SentencePiece Unigram (XLM-RoBERTa's) and byte-level
//! BPE with special tokens in front (RoBERTa's, ModernBERT's), each with the post-processor its
//! family's real file has. Their vocabularies come from one built-in text; a character outside
//! it is the unknown token (WordPiece, Unigram) or its bytes (BPE).

use serde_json::{json, Value};

use crate::qwen3::vocab::tiny_tokenizer_json;

/// Text the vocabularies are made from.
const TEXT: &str = "We embed the full text of scientific papers with an encoder model. \
The embedding of a paper is pooled from the hidden states of its tokens, normalised to unit \
length. Attention over long papers is computed in tiles; papers longer than the context are \
split into chunks, and the vectors of the chunks are combined. Retrieval of related papers \
compares the embeddings of a query and of the documents in the collection (2024, 0.5-1.0). \
ΟΔΟΣ σ";

/// A special token as `added_tokens` lists it.
fn added(content: &str, id: u32) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": false, "special": true})
}

/// `first $A last` as a template post-processor (no `first` when it is `None`).
pub fn template(first: Option<(&str, u32)>, last: Option<(&str, u32)>) -> Value {
    let special = |(t, _): (&str, u32)| json!({"SpecialToken": {"id": t, "type_id": 0}});
    let single: Vec<Value> = first
        .map(special)
        .into_iter()
        .chain([json!({"Sequence": {"id": "A", "type_id": 0}})])
        .chain(last.map(special))
        .collect();
    let pair: Vec<Value> = single
        .iter()
        .cloned()
        .chain([json!({"Sequence": {"id": "B", "type_id": 1}})])
        .chain(last.map(special))
        .collect();
    let tokens: serde_json::Map<String, Value> = first
        .into_iter()
        .chain(last)
        .map(|(t, id)| (t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]})))
        .collect();
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": tokens})
}

fn words() -> Vec<String> {
    let mut words: Vec<String> = TEXT
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    words.sort();
    words.dedup();
    words
}

fn chars() -> Vec<char> {
    let mut chars: Vec<char> = [TEXT.to_lowercase(), TEXT.to_uppercase()]
        .concat()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    chars.sort();
    chars.dedup();
    chars
}

/// BERT's kind: `[PAD] [UNK] [CLS] [SEP] [MASK]` = 0..4, lowercasing, WordPiece with `##`
/// pieces of every character and the text's words, `[CLS] $A [SEP]`.
pub fn wordpiece_json() -> Value {
    let specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
    let mut vocab: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    for c in chars() {
        vocab.push(c.to_string());
        vocab.push(format!("##{c}"));
    }
    vocab.extend(words().into_iter().filter(|w| w.chars().count() > 1));
    let map: serde_json::Map<String, Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": specials.iter().enumerate().map(|(i, s)| added(s, i as u32)).collect::<Vec<_>>(),
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                       "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": template(Some(("[CLS]", 2)), Some(("[SEP]", 3))),
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": map},
    })
}

/// XLM-RoBERTa's kind: `<s> <pad> </s> <unk>` = 0..3, whitespace split then Metaspace, a
/// Unigram of every character and the text's words with their `▁`, `<s> $A </s>`.
pub fn unigram_json() -> Value {
    let specials = ["<s>", "<pad>", "</s>", "<unk>"];
    let mut pieces: Vec<Value> = specials.iter().map(|s| json!([s, 0.0])).collect();
    pieces.push(json!(["▁", -3.0]));
    for c in chars() {
        pieces.push(json!([c.to_string(), -8.0]));
    }
    for (i, w) in words().into_iter().enumerate() {
        pieces.push(json!([format!("▁{w}"), -2.0 - 0.01 * i as f64]));
    }
    let metaspace =
        json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true});
    // What transformers' XLMRobertaTokenizer builds, whatever the file says (a real XLM-R
    // file has it too): whitespace runs split first, so that doubled spaces, tabs and
    // newlines are one boundary, as sentence-transformers reads a text.
    let pre_tokenizer = json!({"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, metaspace]});
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": specials.iter().enumerate().map(|(i, s)| added(s, i as u32)).collect::<Vec<_>>(),
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": template(Some(("<s>", 0)), Some(("</s>", 2))),
        "decoder": metaspace,
        "model": {"type": "Unigram", "unk_id": 3, "vocab": pieces, "byte_fallback": false},
    })
}

/// A byte-level BPE (the tiny Qwen3 one's merges) with `specials` given the first ids and the
/// BPE's own after them, and `post_processor` around every text. Returns the JSON and its
/// vocabulary size.
pub fn byte_bpe_json(specials: &[&str], post_processor: Value) -> (Value, usize) {
    let (mut json, eos) = tiny_tokenizer_json(crate::qwen3::TINY_MERGES);
    let shift = specials.len() as u64;
    if let Some(vocab) = json["model"]["vocab"].as_object_mut() {
        for id in vocab.values_mut() {
            *id = json!(id.as_u64().unwrap_or(0) + shift);
        }
        // In the model's vocabulary too, as a real RoBERTa's or ModernBERT's file has them:
        // transformers' RobertaTokenizer keeps only that vocabulary, and would give special
        // tokens missing from it new ids past its end.
        for (i, s) in specials.iter().enumerate() {
            vocab.insert(s.to_string(), json!(i));
        }
    }
    json["added_tokens"] = json!(specials
        .iter()
        .enumerate()
        .map(|(i, s)| added(s, i as u32))
        .collect::<Vec<_>>());
    json["post_processor"] = post_processor;
    // The tiny Qwen3 vocabulary ends with its `<|endoftext|>`, dropped here.
    (json, eos as usize + specials.len())
}

/// Gemma's kind (SentencePiece BPE, as in Gemma 3's file): `<pad> <eos> <bos> <unk>` = 0..3,
/// the 256 byte-fallback tokens `<0x00>`..`<0xFF>`, every character and `▁`, then each of the
/// text's words after `▁` built up by merges letter by letter; spaces become `▁`;
/// `<bos> $A <eos>` as EmbeddingGemma's file frames a text.
pub fn gemma_bpe_json() -> Value {
    let specials = ["<pad>", "<eos>", "<bos>", "<unk>"];
    let mut vocab: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    vocab.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    vocab.push("▁".into());
    vocab.extend(chars().into_iter().map(String::from));
    let mut merges: Vec<(String, String)> = Vec::new();
    for word in words() {
        let mut piece = "▁".to_string();
        for c in word.chars() {
            let next = format!("{piece}{c}");
            if !vocab.contains(&next) {
                merges.push((piece.clone(), c.to_string()));
                vocab.push(next.clone());
            }
            piece = next;
        }
    }
    let map: serde_json::Map<String, Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let merges: Vec<String> = merges.iter().map(|(a, b)| format!("{a} {b}")).collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": specials.iter().enumerate().map(|(i, s)| added(s, i as u32)).collect::<Vec<_>>(),
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false},
        "post_processor": template(Some(("<bos>", 2)), Some(("<eos>", 1))),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                  "ignore_merges": false, "vocab": map, "merges": merges},
    })
}

/// Ids `json`'s vocabulary has in all (its model's and its added tokens).
pub fn vocab_len(json: &Value) -> usize {
    let model = match &json["model"]["vocab"] {
        Value::Object(map) => map.len(),
        Value::Array(list) => list.len(),
        _ => 0,
    };
    let added = json["added_tokens"].as_array().map_or(0, Vec::len);
    let specials_in_vocab = json["added_tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| {
            let content = t["content"].as_str().unwrap_or_default();
            json["model"]["vocab"].get(content).is_some()
                || json["model"]["vocab"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|p| p[0] == content))
        })
        .count();
    model + added - specials_in_vocab
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(json: &Value) -> tokenizers::Tokenizer {
        tokenizers::Tokenizer::from_bytes(serde_json::to_vec(json).unwrap()).unwrap()
    }

    #[test]
    fn each_kind_loads_and_frames_a_text_as_its_family_does() {
        let text = "Papers longer than the context";
        let bert = load(&wordpiece_json());
        let ids = bert.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!((ids[0], *ids.last().unwrap()), (2, 3));
        assert!(
            !ids.contains(&1),
            "every word of the text is known: {ids:?}"
        );
        assert_eq!(
            bert.decode(&ids[1..ids.len() - 1], true).unwrap(),
            text.to_lowercase()
        );

        let xlmr = load(&unigram_json());
        let ids = xlmr.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!((ids[0], *ids.last().unwrap()), (0, 2));
        assert!(!ids.contains(&3), "{ids:?}");

        let (json, n) = byte_bpe_json(
            &["<s>", "<pad>", "</s>", "<unk>"],
            template(Some(("<s>", 0)), Some(("</s>", 2))),
        );
        let roberta = load(&json);
        let ids = roberta.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!((ids[0], *ids.last().unwrap()), (0, 2));
        assert!(ids[1..ids.len() - 1]
            .iter()
            .all(|&i| i >= 4 && (i as usize) < n));
        assert_eq!(roberta.get_vocab_size(true), n);
        assert_eq!(vocab_len(&json), n);
        assert_eq!(vocab_len(&wordpiece_json()), bert.get_vocab_size(true));
        assert_eq!(vocab_len(&unigram_json()), xlmr.get_vocab_size(true));

        let gemma = load(&gemma_bpe_json());
        let ids = gemma.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!((ids[0], *ids.last().unwrap()), (2, 1));
        assert!(!ids.contains(&3), "{ids:?}");
        // A character outside the vocabulary falls back to its bytes.
        let ids = gemma.encode("é", false).unwrap().get_ids().to_vec();
        assert_eq!(ids, vec![4 + 0xC3, 4 + 0xA9]);
        assert_eq!(
            gemma
                .decode(gemma.encode(text, false).unwrap().get_ids(), true)
                .unwrap(),
            text
        );
    }
}
