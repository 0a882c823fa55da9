//! What is done to a text before it is tokenised: the rule of the sentence-transformers release
//! a user's own script runs, so that its vectors and embedfleet's are the same.
//!
//! sentence-transformers changed its rule in 5.4.0: up to 5.3 its `Transformer` module stripped
//! every text of leading and trailing whitespace and lowercased it with Python's `str.lower()`
//! where `sentence_bert_config.json` says `do_lower_case`; from 5.4 the text (its prompt
//! before it) is tokenised as given, and `do_lower_case` puts the tokenizers library's
//! `Lowercase` normalizer first in the tokenizer's, which lowercases one character at a time
//! (`ΟΔΟΣ` → `οδοσ`, where `str.lower()` writes a final sigma: `οδος`). A paper's text that
//! starts or ends with a space, a newline or a tab, under a tokenizer that keeps whitespace
//! (byte-level BPE, SentencePiece), gets other tokens under each rule.

use tokenizers::normalizers::{Lowercase, NormalizerWrapper, Sequence};

/// How a text is prepared for the tokenizer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum TextRule {
    /// As sentence-transformers ≥ 5.4 does (6.x): the text as given; `do_lower_case` by the
    /// tokenizer's own `Lowercase` normalizer, put first.
    #[default]
    AsGiven,
    /// As sentence-transformers ≤ 5.3 did: leading and trailing whitespace stripped (the prompt
    /// with the text); `do_lower_case` by Unicode's lowercase mapping of the whole string,
    /// final sigma included, as Python's `str.lower()`.
    Stripped,
}

impl TextRule {
    /// Both rules, by name.
    pub const ALL: [TextRule; 2] = [TextRule::AsGiven, TextRule::Stripped];

    /// Its name on the command line, in the run's settings, in shard metadata and in the
    /// dataset card (`as-given`, `stripped`).
    pub fn name(self) -> &'static str {
        match self {
            TextRule::AsGiven => "as-given",
            TextRule::Stripped => "stripped",
        }
    }

    /// The rule named `name` ([`TextRule::name`]).
    pub fn from_name(name: &str) -> Option<TextRule> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The rule a run's settings record by name (`output-settings.json`'s `text_rule`, shard
    /// metadata): `None` where none is recorded (a run fixed before embedfleet recorded it),
    /// an error naming what is there where it is no rule this build knows.
    pub fn recorded(name: Option<&str>) -> Result<Option<TextRule>, String> {
        name.map(|n| {
            TextRule::from_name(n).ok_or_else(|| {
                format!(
                    "the run's text rule `{n}` is none this embedfleet knows (as-given, \
                     stripped): it was recorded by a newer one, which this run needs"
                )
            })
        })
        .transpose()
    }

    /// The sentence-transformers releases that follow it, in words.
    pub fn releases(self) -> &'static str {
        match self {
            TextRule::AsGiven => "sentence-transformers 5.4 and later",
            TextRule::Stripped => "sentence-transformers 5.3 and earlier",
        }
    }
}

impl std::fmt::Display for TextRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `tokenizer` with the `Lowercase` normalizer first in its normalizer, as sentence-transformers
/// ≥ 5.4 applies `do_lower_case`: left as it is where its normalizer is a `Lowercase` or a
/// sequence holding one (a `BertNormalizer` that lowercases does not count: sentence-transformers
/// puts one before it all the same). A sequence is flattened into the new one, as there.
pub fn with_lowercase_first(tokenizer: &mut tokenizers::Tokenizer) {
    let current = tokenizer.get_normalizer().cloned();
    let has_lowercase = match &current {
        Some(NormalizerWrapper::Lowercase(_)) => true,
        Some(NormalizerWrapper::Sequence(seq)) => seq
            .as_ref()
            .iter()
            .any(|n| matches!(n, NormalizerWrapper::Lowercase(_))),
        _ => false,
    };
    if has_lowercase {
        return;
    }
    let mut normalizers = vec![NormalizerWrapper::Lowercase(Lowercase)];
    match current {
        Some(NormalizerWrapper::Sequence(seq)) => normalizers.extend(seq),
        Some(other) => normalizers.push(other),
        None => {}
    }
    tokenizer.with_normalizer(Some(Sequence::new(normalizers)));
    // The added tokens marked `normalized` are matched on normalised text: tokenizers 0.22
    // rebuilds that matcher only when tokens are added.
    tokenizer.add_tokens(&[]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_default_is_todays_sentence_transformers() {
        for rule in TextRule::ALL {
            assert_eq!(TextRule::from_name(rule.name()), Some(rule));
        }
        assert_eq!(TextRule::from_name("strip"), None);
        assert_eq!(TextRule::recorded(None), Ok(None));
        assert_eq!(
            TextRule::recorded(Some("stripped")),
            Ok(Some(TextRule::Stripped))
        );
        assert!(TextRule::recorded(Some("nfkc"))
            .unwrap_err()
            .contains("`nfkc` is none this embedfleet knows"));
        assert_eq!(
            serde_json::to_string(&TextRule::AsGiven).unwrap(),
            "\"as-given\""
        );
        assert_eq!(TextRule::default(), TextRule::AsGiven);
    }

    #[test]
    fn lowercase_first_lowercases_one_character_at_a_time_and_is_put_once() {
        // XLM-R's kind: no normalizer of its own.
        let json = crate::tiny_tokenizers::unigram_json();
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(json.to_string()).unwrap();
        assert!(tokenizer.get_normalizer().is_none());
        let normalize = |t: &tokenizers::Tokenizer, s: &str| {
            t.get_normalizer()
                .map(|n| {
                    let mut text = tokenizers::NormalizedString::from(s);
                    tokenizers::Normalizer::normalize(n, &mut text).unwrap();
                    text.get().to_string()
                })
                .unwrap()
        };
        with_lowercase_first(&mut tokenizer);
        // A word-final capital sigma is σ, not ς (Python's str.lower() and Rust's
        // to_lowercase() write ς).
        assert_eq!(normalize(&tokenizer, "ΟΔΟΣ"), "οδοσ");
        assert_eq!("ΟΔΟΣ".to_lowercase(), "οδος");
        let once = serde_json::to_string(tokenizer.get_normalizer().unwrap()).unwrap();
        with_lowercase_first(&mut tokenizer);
        let twice = serde_json::to_string(tokenizer.get_normalizer().unwrap()).unwrap();
        assert_eq!(once, twice);
        assert_eq!(once.matches("Lowercase").count(), 1, "{once}");
        assert!(once.starts_with(r#"{"type":"Sequence","normalizers":[{"type":"Lowercase"}"#));
        // BERT's: the Lowercase goes before its BertNormalizer, which lowercases too.
        let json = crate::tiny_tokenizers::wordpiece_json();
        let mut bert = tokenizers::Tokenizer::from_bytes(json.to_string()).unwrap();
        with_lowercase_first(&mut bert);
        let seq = serde_json::to_string(bert.get_normalizer().unwrap()).unwrap();
        assert!(
            seq.starts_with(
                r#"{"type":"Sequence","normalizers":[{"type":"Lowercase"},{"type":"BertNormalizer""#
            ),
            "{seq}"
        );
    }
}
