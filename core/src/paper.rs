//! One paper of the corpus, as the planner keeps it and the embed job reads it back.

use serde::{Deserialize, Serialize};

/// A paper: its id, its full text and the corpus metadata kept for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Paper {
    /// The corpus id, as a string (integer ids are written in decimal).
    pub id: String,
    pub text: String,
    pub source: Option<String>,
    pub created: Option<String>,
    pub added: Option<String>,
    pub version: Option<String>,
    /// Other fields kept by `--keep-field`, as one JSON object (`None` when there are none).
    pub extra: Option<String>,
}

impl Paper {
    /// Length in Unicode scalar values, the unit of every character budget.
    pub fn n_chars(&self) -> u64 {
        count_chars(&self.text)
    }
}

/// Counts the `char`s of a string without decoding it: every byte that is not a UTF-8
/// continuation byte starts a char. Vectorises, unlike `str::chars().count()` on older compilers.
pub fn count_chars(s: &str) -> u64 {
    s.as_bytes().iter().filter(|&&b| (b as i8) >= -0x40).count() as u64
}

/// The hash a corpus release's paper is compared by (`plan --update`): xxh3-64 of its text
/// alone, so a release that only touches other fields (`added`, `version`) re-embeds nothing.
pub fn text_hash(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

/// The hash an update compares a paper's corpus metadata by (`source`, `created`, `added`,
/// `version`, the kept fields), for a paper whose text it carries unchanged: the metadata must
/// follow the release without the paper being embedded again.
///
/// Two halves: the high 32 bits hash what the collection's payload holds of it (`source`, and
/// the year of `created`), the low 32 bits the rest. A release that changes only `version` or
/// `added` (peS2o stamps every paper of a release) changes the low half alone, and an upload
/// sets no payload for it; [`MetaHash::payload_differs`] tells them apart.
pub fn meta_hash(paper: &Paper) -> u64 {
    let year = paper.created.as_deref().and_then(parse_year);
    let payload = xxh3_fields(&[
        paper.source.as_deref(),
        year.map(|y| y.to_string()).as_deref(),
    ]);
    let rest = xxh3_fields(&[
        paper.created.as_deref(),
        paper.added.as_deref(),
        paper.version.as_deref(),
        paper.extra.as_deref(),
    ]);
    (payload & 0xFFFF_FFFF_0000_0000) | (rest >> 32)
}

/// Whether two [`meta_hash`]es differ in what the payload holds (`source`, the year).
pub fn payload_differs(a: u64, b: u64) -> bool {
    (a >> 32) != (b >> 32)
}

/// xxh3-64 of optional fields, each told apart from a missing one and from its neighbours.
fn xxh3_fields(fields: &[Option<&str>]) -> u64 {
    let mut bytes = Vec::new();
    for field in fields {
        match field {
            None => bytes.push(0u8),
            Some(v) => {
                bytes.push(1);
                bytes.extend_from_slice(&(v.len() as u64).to_le_bytes());
                bytes.extend_from_slice(v.as_bytes());
            }
        }
    }
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// The year of a `created` value such as `2019-05-02T00:00:00.000Z` or `2019-05-02`: the
/// collection's `year` payload.
///
/// Returns `None` when the value does not start with four digits followed by the end or `-`.
pub fn parse_year(created: &str) -> Option<i64> {
    let bytes = created.trim_start().as_bytes();
    let digits = bytes.get(..4)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if !matches!(bytes.get(4), None | Some(b'-')) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0')),
    )
}

/// The id of one planned batch: one per-node job's input. Stable once planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BatchId(pub i64);

/// Stored as the `batches.id` integer.
impl rusqlite::ToSql for BatchId {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}

impl rusqlite::types::FromSql for BatchId {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        i64::column_result(value).map(BatchId)
    }
}

impl std::fmt::Display for BatchId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_chars_counts_scalar_values() {
        for s in ["", "abc", "héllo", "日本語", "𝔘nicode ✓", "a\u{0301}"] {
            assert_eq!(count_chars(s), s.chars().count() as u64, "{s:?}");
        }
    }

    fn paper(source: &str, created: Option<&str>, version: &str) -> Paper {
        Paper {
            id: "p".into(),
            text: "t".into(),
            source: Some(source.into()),
            created: created.map(Into::into),
            added: Some("2023-01-03".into()),
            version: Some(version.into()),
            extra: None,
        }
    }

    #[test]
    fn the_metadata_hash_tells_a_payload_change_from_a_stamp() {
        let base = meta_hash(&paper("s2orc", Some("2019-05-02"), "v2"));
        assert_eq!(base, meta_hash(&paper("s2orc", Some("2019-05-02"), "v2")));
        // A new release stamp: the metadata changed, not the payload.
        let stamped = meta_hash(&paper("s2orc", Some("2019-05-02"), "v3"));
        assert_ne!(base, stamped);
        assert!(!payload_differs(base, stamped));
        // Another date of the same year: the same payload.
        let same_year = meta_hash(&paper("s2orc", Some("2019-11-30T00:00:00Z"), "v2"));
        assert_ne!(base, same_year);
        assert!(!payload_differs(base, same_year));
        for other in [
            paper("s2orc", Some("2020-05-02"), "v2"),
            paper("s2ag", Some("2019-05-02"), "v2"),
            paper("s2orc", None, "v2"),
        ] {
            let h = meta_hash(&other);
            assert!(payload_differs(base, h), "{other:?}");
        }
        // A field is not confused with its neighbour.
        let mut a = paper("s2orc", None, "v2");
        a.added = None;
        let mut b = a.clone();
        b.version = None;
        b.added = Some("v2".into());
        assert_ne!(meta_hash(&a), meta_hash(&b));
    }

    #[test]
    fn parse_year_reads_four_leading_digits() {
        assert_eq!(parse_year("2019-05-02T00:00:00.000Z"), Some(2019));
        assert_eq!(parse_year("1999"), Some(1999));
        for bad in ["", "19", "abcd", "20190", "2019/05"] {
            assert_eq!(parse_year(bad), None, "{bad:?}");
        }
    }
}
