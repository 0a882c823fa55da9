//! The size and layering rules the code keeps (ARCHITECTURE.md, "Rules the tests keep"): no
//! source file over 700 lines, no function over 100, clap's types only in `src/cli`. Each rule
//! is a function over a file's text, shown failing on a made-up file below, then run over the
//! workspace's own non-test sources.

use crate::util::root;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: usize = 100;

/// Every `.rs` file of the workspace that is not test, bench or example code, relative to the
/// root: a `tests/` folder, a `tests.rs` or `tests_*.rs` module, `benches/`, `examples/`.
pub fn non_test_sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let rel = rel.join(&name);
            // A symlink (a checkout's target link, say) is not the project's own source.
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                let skip = name.starts_with('.')
                    || matches!(name.as_str(), "target" | "tests" | "benches" | "examples");
                if !skip {
                    walk(&path, &rel, out);
                }
            } else if kind.is_file()
                && name.ends_with(".rs")
                && name != "tests.rs"
                && !name.starts_with("tests_")
            {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(root(), Path::new(""), &mut out);
    out.sort();
    out
}

/// `src` with comments, strings and character literals blanked (newlines kept), so that
/// braces and words are code's own.
pub fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, s: &[u8]| {
        out.extend(s.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }))
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let after_word = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let end = if rest.starts_with(b"//") {
            rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, 0);
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if let Some(len) = (!after_word).then(|| raw_string(rest)).flatten() {
            len
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else if rest[0] == b'\'' {
            // A character literal ('a', '\n', '\u{7f}'), not a lifetime ('a).
            match rest.get(1) {
                Some(b'\\') => rest[2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map_or(1, |p| p + 3),
                Some(_) if rest.get(2) == Some(&b'\'') => 3,
                // A multi-byte character.
                Some(&c) if c >= 0x80 => rest[1..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map_or(1, |p| p + 2),
                _ => 1,
            }
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        blank(&mut out, &rest[..end]);
        i += end;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The length of a raw string starting `rest` (`r"…"`, `r#"…"#`, `br"…"`), if it is one.
fn raw_string(rest: &[u8]) -> Option<usize> {
    let start = if rest.starts_with(b"br") {
        2
    } else if rest.starts_with(b"r") {
        1
    } else {
        return None;
    };
    let hashes = rest[start..].iter().take_while(|&&c| c == b'#').count();
    if rest.get(start + hashes) != Some(&b'"') {
        return None;
    }
    let close: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let body = start + hashes + 1;
    let end = rest[body..]
        .windows(close.len())
        .position(|w| w == close.as_slice())
        .map_or(rest.len(), |p| body + p + close.len());
    Some(end)
}

/// Each function with a body in `src` (before its `#[cfg(test)]` module): its name, first line
/// and length in lines, from `fn` to its closing brace.
pub fn functions(src: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(src);
    // The file's test module (`#[cfg(test)] mod tests`) is test code.
    let test_module = code
        .match_indices("#[cfg(test)]")
        .find(|(at, attr)| code[at + attr.len()..].trim_start().starts_with("mod "));
    let code = match test_module {
        Some((cut, _)) => &code[..cut],
        None => &code[..],
    };
    let b = code.as_bytes();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = code[at..].find("fn ") {
        let start = at + found;
        at = start + 3;
        if start > 0 && (b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_') {
            continue;
        }
        let name: String = code[at..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body's `{`, past the signature's brackets; a `;` first: no body (a trait's).
        let (mut depth, mut j) = (0i32, at);
        let open = loop {
            match b.get(j) {
                None => break None,
                Some(b'(' | b'[') => depth += 1,
                Some(b')' | b']') => depth -= 1,
                Some(b';') if depth == 0 => break None,
                Some(b'{') if depth == 0 => break Some(j),
                _ => {}
            }
            j += 1;
        };
        let Some(open) = open else {
            continue;
        };
        let mut braces = 0;
        let close = (open..b.len()).find(|&k| {
            match b[k] {
                b'{' => braces += 1,
                b'}' => braces -= 1,
                _ => {}
            }
            braces == 0
        });
        let close = close.unwrap_or(b.len() - 1);
        out.push((name, line_of(start), line_of(close) - line_of(start) + 1));
    }
    out
}

/// What `src` (the file `path`) breaks of the size rules.
pub fn size_problems(path: &str, src: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let lines = src.lines().count();
    if lines > MAX_FILE_LINES {
        problems.push(format!(
            "{path} has {lines} lines (at most {MAX_FILE_LINES}): split it into modules"
        ));
    }
    for (name, line, len) in functions(src) {
        if len > MAX_FN_LINES {
            problems.push(format!(
                "{path}:{line}: fn {name} has {len} lines (at most {MAX_FN_LINES}): split it"
            ));
        }
    }
    problems
}

/// Whether `src` uses clap (its derives, attributes or paths) in code.
pub fn uses_clap(src: &str) -> bool {
    let code = code_only(src);
    [
        "clap::",
        "use clap",
        "#[arg(",
        "#[command(",
        "#[derive(Parser",
        "ValueEnum",
    ]
    .iter()
    .any(|needle| code.contains(needle))
}

#[test]
fn a_long_file_or_function_is_found_and_named() {
    let body: String = (0..99).map(|i| format!("    let x{i} = {i};\n")).collect();
    // 99 lines of body and the two of `fn` and `}`: 101.
    let long_fn = format!("fn long() {{\n{body}}}\n");
    let fitting = format!(
        "fn fits() {{\n{}}}\n",
        &body[body.find('\n').unwrap() + 1..]
    );
    assert_eq!(functions(&long_fn), [("long".to_string(), 1, 101)]);
    assert_eq!(functions(&fitting), [("fits".to_string(), 1, 100)]);
    let problems = size_problems("x.rs", &long_fn);
    assert_eq!(
        problems,
        ["x.rs:1: fn long has 101 lines (at most 100): split it"]
    );
    assert!(size_problems("x.rs", &fitting).is_empty());
    let long_file = "// a line\n".repeat(701);
    assert_eq!(
        size_problems("big.rs", &long_file),
        ["big.rs has 701 lines (at most 700): split it into modules"]
    );
    assert!(size_problems("big.rs", &"// a line\n".repeat(700)).is_empty());
}

#[test]
fn braces_in_strings_comments_and_chars_do_not_end_a_function() {
    let src = concat!(
        "impl X {\n",
        "    fn a(&self) -> Result<(), E> {\n",
        "        let s = \"}}}\"; // }\n",
        "        let r = r#\"}\"#; let c = '}'; let l: &'static str = \"\";\n",
        "        /* } /* } */ } */\n",
        "        if true { 1 } else { 2 };\n",
        "    }\n",
        "    fn b();\n",
        "    fn c<'a>(x: &'a [u8; 2]) where T: Fn() -> u8 { }\n",
        "}\n",
        "#[cfg(test)]\nmod tests { fn t() {} }\n",
    );
    assert_eq!(
        functions(src),
        [("a".to_string(), 2, 6), ("c".to_string(), 9, 1)]
    );
}

#[test]
fn clap_is_seen_in_code_and_not_in_comments() {
    assert!(uses_clap("#[derive(clap::Parser)]\nstruct A;"));
    assert!(uses_clap("use clap::Args;"));
    assert!(!uses_clap(
        "/// `PORT`, for clap.\nfn f() {}\n// clap::Parser\n"
    ));
    assert!(!uses_clap("let s = \"clap::Parser\";"));
}

#[test]
fn no_source_file_over_700_lines_nor_function_over_100() {
    let sources = non_test_sources();
    assert!(sources.len() > 100, "{} sources found", sources.len());
    let problems: Vec<String> = sources
        .iter()
        .flat_map(|rel| {
            let src = std::fs::read_to_string(root().join(rel)).unwrap();
            size_problems(&rel.display().to_string(), &src)
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn clap_types_stay_in_src_cli() {
    let outside: Vec<String> = non_test_sources()
        .iter()
        .filter(|rel| !rel.starts_with("src/cli"))
        .filter(|rel| uses_clap(&std::fs::read_to_string(root().join(rel)).unwrap()))
        .map(|rel| rel.display().to_string())
        .collect();
    assert!(
        outside.is_empty(),
        "clap outside src/cli (map its types onto settings there): {outside:?}"
    );
    assert!(non_test_sources()
        .iter()
        .filter(|rel| rel.starts_with("src/cli"))
        .any(|rel| uses_clap(&std::fs::read_to_string(root().join(rel)).unwrap())));
}

/// What `src/commands` must not hold (its files map flags onto the pipeline's and call it): a
/// function over 40 lines, a run.db setting key, a choice by backend, sink kind or
/// model family. Each is the pipeline's, or the seam's.
pub fn command_module_problems(path: &str, src: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, line, len) in functions(src) {
        if len > 40 {
            problems.push(format!(
                "{path}:{line}: fn {name} has {len} lines (a command's at most 40): move the logic into pipeline"
            ));
        }
    }
    let code = code_only(src);
    for (needle, what) in [
        ("_SETTING", "a run.db setting key"),
        (".setting(", "a run.db setting read"),
        (".set_setting(", "a run.db setting write"),
        ("Backend::", "a choice by backend"),
        ("SinkKind::", "a choice by sink kind"),
        ("Qwen", "a model family named"),
        ("qwen", "a model family named"),
    ] {
        let found = code.contains(needle);
        if found {
            problems.push(format!(
                "{path} holds {what} (`{needle}`): it belongs in pipeline"
            ));
        }
    }
    problems
}

#[test]
fn a_command_module_with_pipeline_logic_is_named() {
    let long: String = (0..40).map(|i| format!("    let x{i} = {i};\n")).collect();
    let src = format!(
        "fn long() {{\n{long}}}\nfn tuned(db: &RunDb) {{ db.setting(TUNED_SETTING); }}\n\
         fn by_kind(k: SinkKind) {{ match k {{ SinkKind::Edge => {{}} _ => {{}} }} }}\n"
    );
    let problems = command_module_problems("src/commands/x.rs", &src);
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(problems[0].starts_with("src/commands/x.rs:1: fn long has 42 lines"));
    assert!(command_module_problems("x.rs", "// db.setting(\nfn f() {}\n").is_empty());
}

#[test]
fn the_commands_map_flags_call_the_pipeline_and_print() {
    let commands: Vec<PathBuf> = non_test_sources()
        .into_iter()
        .filter(|rel| rel.starts_with("src/commands"))
        .collect();
    assert!(commands.len() >= 2, "{commands:?}");
    let problems: Vec<String> = commands
        .iter()
        .flat_map(|rel| {
            let src = std::fs::read_to_string(root().join(rel)).unwrap();
            command_module_problems(&rel.display().to_string(), &src)
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
