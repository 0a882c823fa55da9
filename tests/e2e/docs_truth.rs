//! ARCHITECTURE.md and the docs kept true: every repository path they name exists, and every
//! function or type they place "in" a file (`` `Name` (`path.rs`) ``, `` `Name` in `path.rs` ``)
//! is defined there.

use crate::util::root;

/// The markdown files that describe the code: ARCHITECTURE.md, README.md, BENCHMARKS.md and
/// every page of docs/.
fn described_in() -> Vec<String> {
    let mut files: Vec<String> = ["ARCHITECTURE.md", "README.md", "BENCHMARKS.md"]
        .map(String::from)
        .to_vec();
    for entry in std::fs::read_dir(root().join("docs")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            files.push(format!("docs/{name}"));
        }
    }
    files.sort();
    files
}

/// The `code spans` of a markdown text, with the byte where each ends; inside ```text fences
/// (ARCHITECTURE.md's map), every whitespace-separated word is one too (`true` last).
fn spans(text: &str) -> Vec<(String, usize, bool)> {
    let mut out = Vec::new();
    let mut in_text_fence = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            in_text_fence = !in_text_fence && trimmed.trim_end() == "```text";
        } else if in_text_fence {
            for word in line.split_whitespace() {
                let word = word.trim_end_matches([',', ';', ')', ':']);
                let word = word.trim_start_matches('(');
                out.push((word.to_string(), offset + line.len(), true));
            }
        } else {
            let mut rest = line;
            let mut at = offset;
            while let Some(open) = rest.find('`') {
                let after = &rest[open + 1..];
                let Some(close) = after.find('`') else {
                    break;
                };
                out.push((after[..close].to_string(), at + open + 1 + close + 1, false));
                at += open + 1 + close + 1;
                rest = &after[close + 1..];
            }
        }
        offset += line.len();
    }
    out
}

/// `span` as a path of this repository, when it is one: it starts at a top-level entry of the
/// repository and holds no placeholder (`<name>`, `*`, `$VAR`, `{a,b}`). A `:line` is dropped.
fn repo_path(span: &str, top: &[String]) -> Option<String> {
    if !span.contains('/') || span.contains("://") {
        return None;
    }
    if span.contains(['<', '>', '*', '{', '}', '$', ' ', '=']) {
        return None;
    }
    let path = span.split(':').next()?.trim_end_matches('/');
    let first = path.split('/').next()?;
    top.iter().any(|t| t == first).then(|| path.to_string())
}

/// The top-level entries of the repository (what a repo path starts with).
fn top_level() -> Vec<String> {
    std::fs::read_dir(root())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect()
}

#[test]
fn every_repo_path_the_docs_name_exists() {
    let top = top_level();
    let mut named = 0;
    let mut missing = Vec::new();
    for file in described_in() {
        let text = std::fs::read_to_string(root().join(&file)).unwrap();
        for (span, _, _) in spans(&text) {
            let Some(path) = repo_path(&span, &top) else {
                continue;
            };
            named += 1;
            if !root().join(&path).exists() {
                missing.push(format!("{file}: `{span}`"));
            }
        }
    }
    assert!(named > 100, "only {named} paths found: the scan is broken");
    assert!(
        missing.is_empty(),
        "paths the docs name that do not exist (moved? say where it is now):\n{}",
        missing.join("\n")
    );
}

/// `(name, path)` for each `` `Name` (`path.rs`) `` and `` `Name` in `path.rs` `` of `text`
/// (the name an identifier, the path a repo path to a `.rs` file).
fn placed_items(text: &str, top: &[String]) -> Vec<(String, String)> {
    let spans = spans(text);
    let mut out = Vec::new();
    for pair in spans.windows(2) {
        let [(name, name_end, false), (path, path_end, false)] = pair else {
            continue;
        };
        // The text between the name's closing backtick and the path's opening one.
        let Some(between) = text.get(*name_end..path_end - path.len() - 2) else {
            continue;
        };
        let between = between.trim();
        let placed = between == "(" || between == "in" || between == ", in";
        let is_ident = !name.is_empty()
            && name.chars().all(|c| c.is_alphanumeric() || c == '_')
            && !name.starts_with(char::is_numeric);
        if let (true, true, Some(path)) = (placed, is_ident, repo_path(path, top)) {
            if path.ends_with(".rs") {
                out.push((name.clone(), path));
            }
        }
    }
    out
}

/// Whether `src` defines `name` (an item of that name) or, for a crate, uses it (`name::`).
fn defines(src: &str, name: &str) -> bool {
    let defined = [
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "type ",
        "const ",
        "static ",
        "mod ",
        "macro_rules! ",
    ]
    .iter()
    .any(|kw| {
        src.match_indices(&format!("{kw}{name}")).any(|(at, m)| {
            let next = src[at + m.len()..].chars().next();
            !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    });
    defined || src.contains(&format!("{name}::"))
}

#[test]
fn every_item_the_docs_place_in_a_file_is_there() {
    let top = top_level();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for file in described_in() {
        let text = std::fs::read_to_string(root().join(&file)).unwrap();
        for (name, path) in placed_items(&text, &top) {
            let Ok(src) = std::fs::read_to_string(root().join(&path)) else {
                continue; // a missing file is the other test's to say
            };
            checked += 1;
            if !defines(&src, &name) {
                wrong.push(format!("{file}: `{name}` is not in `{path}`"));
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} placed items found: the scan is broken"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_scans_find_paths_in_spans_and_the_map_and_items_placed_in_files() {
    let top = vec!["core".to_string(), "src".to_string()];
    let text = "See `core/src/layout.rs:12` and `core/<x>/a.rs`, `not/a/repo`.\n\
                ```text\n  ingest   core/src/rundb/attempts.rs\n```\n\
                `RunLayout` (`core/src/layout.rs`) and `open_sink` in `src/commands/upload.rs`.\n";
    let paths: Vec<String> = spans(text)
        .iter()
        .filter_map(|(s, _, _)| repo_path(s, &top))
        .collect();
    assert_eq!(
        paths,
        [
            "core/src/layout.rs",
            "core/src/rundb/attempts.rs",
            "core/src/layout.rs",
            "src/commands/upload.rs"
        ]
    );
    assert_eq!(
        placed_items(text, &top),
        [
            ("RunLayout".to_string(), "core/src/layout.rs".to_string()),
            (
                "open_sink".to_string(),
                "src/commands/upload.rs".to_string()
            )
        ]
    );
    assert!(defines("pub fn open_sink(", "open_sink"));
    assert!(!defines("pub fn open_sink_for(", "open_sink"));
    assert!(defines("let r = ureq::get(url);", "ureq"));
}
