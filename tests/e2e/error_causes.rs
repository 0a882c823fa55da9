//! The rule `embedfleet_core::cause` states: an error either says its source in its message or
//! returns it from `source()`, never both, so that the command's error printer says each cause
//! once by the chain's structure (no text compared). Checked on every `#[error(...)]` of the
//! workspace's non-test sources; shown failing on a made-up file first.

use crate::code_rules::non_test_sources;
use crate::util::root;

/// The end (exclusive) of the bracketed group opening at `start` (`(`, `{` or `[`), strings and
/// character literals skipped.
fn group_end(b: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = start;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The variant (or struct) after an attribute ending at `from`: its name and its fields' text,
/// doc comments and other attributes skipped.
fn item_after(src: &str, mut from: usize) -> Option<(String, String)> {
    let b = src.as_bytes();
    loop {
        let rest = src[from..].trim_start();
        from = src.len() - rest.len();
        if rest.starts_with("//") {
            from += rest.find('\n')?;
        } else if rest.starts_with("#[") {
            from = group_end(b, from + 1)?;
        } else {
            break;
        }
    }
    let rest = &src[from..];
    let rest = rest.strip_prefix("pub ").unwrap_or(rest);
    let rest = rest.strip_prefix("struct ").unwrap_or(rest);
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    let after = &rest[name.len()..];
    let body = match after.trim_start().as_bytes().first() {
        Some(b'(' | b'{') => {
            let at = src.len() - after.trim_start().len();
            src[at..group_end(b, at)?].to_string()
        }
        _ => String::new(),
    };
    Some((name, body))
}

/// Each error variant of `src` that says its source in its message and returns it too.
pub fn said_twice(src: &str) -> Vec<String> {
    let b = src.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(pos) = src[at..].find("#[error(") {
        let start = at + pos;
        let Some(end) = group_end(b, start + "#[error".len()) else {
            break;
        };
        at = end;
        let message = &src[start + "#[error(".len()..end - 1];
        if message.trim() == "transparent" {
            continue;
        }
        let Some((name, body)) = item_after(src, end + 1) else {
            continue;
        };
        // Which field is returned: one named `source`, or marked `#[source]` / `#[from]`.
        let fields: Vec<&str> = body
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        let fields = fields.join("\n");
        let named_source = fields.split([',', '{', '(']).any(|f| {
            let f = f.trim().trim_start_matches("#[source]").trim();
            f.starts_with("source:") || f.starts_with("pub source:")
        });
        let marked = fields.contains("#[source]") || body.contains("#[from]");
        let says = if let Some(tuple) = body.strip_prefix('(') {
            // A tuple variant: the marked field's index.
            let index = tuple
                .split(',')
                .position(|f| f.contains("#[source]") || f.contains("#[from]"));
            index.is_some_and(|i| {
                message.contains(&format!("{{{i}}}"))
                    || message.contains(&format!("{{{i}:"))
                    || message.contains(&format!(".{i}"))
            })
        } else {
            let marked_name = body.split(',').find_map(|f| {
                let f = f.split("#[source]").nth(1).or(f.split("#[from]").nth(1))?;
                Some(f.trim().split(':').next()?.trim().to_string())
            });
            let field = if named_source {
                Some("source".to_string())
            } else {
                marked_name
            };
            field.is_some_and(|f| {
                message.contains(&format!("{{{f}}}"))
                    || message.contains(&format!("{{{f}:"))
                    || message
                        .split('"')
                        .next_back()
                        .is_some_and(|args| args.contains(f.as_str()))
            })
        };
        if (named_source || marked) && says {
            let line = src[..start].matches('\n').count() + 1;
            found.push(format!("{name} (line {line})"));
        }
    }
    found
}

#[test]
fn an_error_that_says_its_source_and_returns_it_is_named() {
    let src = r#"
#[derive(Debug, thiserror::Error)]
pub enum E {
    #[error("failed to read {path}: {source}")]
    Twice { path: PathBuf, source: std::io::Error },
    #[error("failed to read {path}: {cause}")]
    Said { path: PathBuf, cause: std::io::Error },
    #[error("failed to start `{command}`")]
    Returned {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("search failed: {0}")]
    FromTwice(#[from] UploadError),
    #[error("failed to {action} {}: {}", path.display(), inner)]
    /// Marked, and said as an argument.
    ArgTwice { action: &'static str, path: PathBuf, #[source] inner: Box<E> },
    #[error(transparent)]
    Forwarded(#[from] ModelError),
    #[error("model: {0}")]
    SaidTuple(ModelError),
}
"#;
    assert_eq!(
        said_twice(src),
        [
            "Twice (line 4)".to_string(),
            "FromTwice (line 14)".to_string(),
            "ArgTwice (line 16)".to_string()
        ]
    );
}

#[test]
fn no_error_says_its_source_and_returns_it_too() {
    let mut problems = Vec::new();
    let mut errors = 0;
    for rel in non_test_sources() {
        let src = std::fs::read_to_string(root().join(&rel)).unwrap();
        errors += src.matches("#[error(").count();
        for variant in said_twice(&src) {
            problems.push(format!("{}: {variant}", rel.display()));
        }
    }
    assert!(
        errors > 200,
        "the scan saw the workspace's errors ({errors})"
    );
    assert!(
        problems.is_empty(),
        "these errors say their source in the message and return it from source() as well, so \
         the printer would say it twice: name the field `cause` (see embedfleet_core::cause):\n{}",
        problems.join("\n")
    );
}
