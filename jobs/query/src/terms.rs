//! Query terms from the files users have: plain text (one term per line), a CSV column, or a
//! JSON-lines field.

use std::path::{Path, PathBuf};

/// Why the terms could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TermsError {
    #[error("failed to read the terms file {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path} has no column `{field}` (its header: {header}): name one with --field")]
    NoColumn {
        path: PathBuf,
        field: String,
        header: String,
    },
    #[error("{path}:{line}: {why}")]
    BadLine {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error("{path} holds no terms")]
    Empty { path: PathBuf },
}

/// The terms of `path`, in file order: `.csv` → the column `field` (default: the first),
/// `.jsonl`/`.json` → the string field `field` (default `term`), anything else → each non-empty
/// line, trimmed.
pub fn read_terms(path: &Path, field: Option<&str>) -> Result<Vec<String>, TermsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TermsError::Io {
        path: path.into(),
        cause: source,
    })?;
    let name = path.to_string_lossy().to_ascii_lowercase();
    let terms = if name.ends_with(".csv") {
        csv_column(path, &text, field)?
    } else if name.ends_with(".jsonl") || name.ends_with(".json") {
        jsonl_field(path, &text, field.unwrap_or("term"))?
    } else {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    };
    if terms.is_empty() {
        return Err(TermsError::Empty { path: path.into() });
    }
    Ok(terms)
}

fn jsonl_field(path: &Path, text: &str, field: &str) -> Result<Vec<String>, TermsError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| TermsError::BadLine {
            path: path.into(),
            line: i + 1,
            why,
        };
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        match value.get(field) {
            Some(serde_json::Value::String(s)) if !s.trim().is_empty() => {
                out.push(s.trim().to_string())
            }
            _ => return Err(bad(format!("no string field `{field}`"))),
        }
    }
    Ok(out)
}

fn csv_column(path: &Path, text: &str, field: Option<&str>) -> Result<Vec<String>, TermsError> {
    let mut rows = csv_records(text);
    let Some(header) = rows.next() else {
        return Ok(Vec::new());
    };
    let column = match field {
        None => 0,
        Some(f) => {
            header
                .iter()
                .position(|h| h.trim() == f)
                .ok_or_else(|| TermsError::NoColumn {
                    path: path.into(),
                    field: f.into(),
                    header: header.join(","),
                })?
        }
    };
    Ok(rows
        .filter_map(|r| r.get(column).map(|v| v.trim().to_string()))
        .filter(|v| !v.is_empty())
        .collect())
}

/// RFC 4180 records: fields separated by commas, optionally quoted with `"` (a quote inside a
/// quoted field is doubled; quoted fields may span lines).
fn csv_records(text: &str) -> impl Iterator<Item = Vec<String>> + '_ {
    let mut chars = text.chars().peekable();
    std::iter::from_fn(move || {
        chars.peek()?;
        let (mut record, mut field, mut quoted) = (Vec::new(), String::new(), false);
        while let Some(c) = chars.next() {
            match (c, quoted) {
                ('"', true) if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                ('"', _) => quoted = !quoted,
                (',', false) => record.push(std::mem::take(&mut field)),
                ('\n', false) => break,
                ('\r', false) => {}
                (c, _) => field.push(c),
            }
        }
        record.push(field);
        Some(record)
    })
    .filter(|r| !(r.len() == 1 && r[0].is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn reads_lines_csv_columns_and_jsonl_fields() {
        let d = tempfile::tempdir().unwrap();
        let txt = write(d.path(), "t.txt", "BRCA1\n\n  TP53 \nEGFR\n");
        assert_eq!(read_terms(&txt, None).unwrap(), ["BRCA1", "TP53", "EGFR"]);
        let csv = write(
            d.path(),
            "t.csv",
            "id,symbol,name\r\n1,BRCA1,\"breast cancer 1, early onset\"\n2,TP53,\"tumor \"\"p53\"\"\"\n",
        );
        assert_eq!(read_terms(&csv, Some("symbol")).unwrap(), ["BRCA1", "TP53"]);
        assert_eq!(
            read_terms(&csv, Some("name")).unwrap(),
            ["breast cancer 1, early onset", "tumor \"p53\""]
        );
        assert_eq!(read_terms(&csv, None).unwrap(), ["1", "2"]);
        assert!(matches!(
            read_terms(&csv, Some("gene")),
            Err(TermsError::NoColumn { .. })
        ));
        let jsonl = write(
            d.path(),
            "t.jsonl",
            "{\"term\":\"BRCA1\"}\n{\"term\":\"TP53\",\"x\":1}\n",
        );
        assert_eq!(read_terms(&jsonl, None).unwrap(), ["BRCA1", "TP53"]);
        let bad = write(d.path(), "b.jsonl", "{\"term\":\"A\"}\n{\"other\":1}\n");
        let err = read_terms(&bad, None).unwrap_err().to_string();
        assert!(err.contains("b.jsonl:2"), "{err}");
        let empty = write(d.path(), "e.txt", "\n\n");
        assert!(matches!(
            read_terms(&empty, None),
            Err(TermsError::Empty { .. })
        ));
    }
}
