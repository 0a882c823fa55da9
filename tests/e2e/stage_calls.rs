//! What `src/commands` may call in a stage crate (ARCHITECTURE.md, "Rules the tests keep").
//! The binary maps flags, calls `pipeline` and prints; where a command is one stage and nothing
//! crosses, it calls that stage's driver itself. Every free function of a stage crate that a
//! command module calls must be listed here with its reason, and every entry must still be
//! called: a new call from the binary into a stage is a choice made in review, not by drift.

use crate::code_rules::{code_only, non_test_sources};
use std::collections::{BTreeMap, BTreeSet};

/// The crates that do a stage's work. `core` (the run's files and run.db) and `models` (the
/// model family) are below every stage, and `pipeline` is where the stages meet.
const STAGE_CRATES: [&str; 6] = [
    "embedfleet_orchestrator",
    "embedfleet_upload",
    "embedfleet_embed",
    "embedfleet_snapshot",
    "embedfleet_publish",
    "embedfleet_query",
];

/// The stage functions `src/commands` may call (a path, or a module ending in `::`), each with
/// its reason.
const ALLOWED: &[(&str, &str)] = &[
    ("embedfleet_orchestrator::plan::plan", "`plan` is one stage: nothing crosses"),
    ("embedfleet_orchestrator::sample::write", "`sample-corpus` writes a corpus: no run"),
    (
        "embedfleet_orchestrator::submit::",
        "the submit loop drives itself round by round; `pipeline::submit::prepare` made every option it runs with",
    ),
    ("embedfleet_orchestrator::status::", "renders the status text the binary prints"),
    ("embedfleet_orchestrator::report::", "`report` reads run.db and renders: one stage"),
    (
        "embedfleet_orchestrator::stored_config::",
        "`doctor` checks, and `submit --show-config` prints, the run config the loop would use",
    ),
    ("embedfleet_orchestrator::scheduler::shell_quote", "quotes a path in a command printed as advice"),
    ("embedfleet_embed::parse_devices", "parses a --devices flag"),
    (
        "embedfleet_embed::job::",
        "the embed job runs alone on a compute node (no run.db); `doctor` reports its peak memory",
    ),
    ("embedfleet_embed::files::run", "`embed-files` embeds files outside any run: one stage"),
    ("embedfleet_embed::bench::", "`bench` measures the model alone"),
    ("embedfleet_embed::model_revision", "`doctor` names the model a node has"),
    (
        "embedfleet_upload::",
        "`upload` is one stage over a target `pipeline::target` opened, with batching `pipeline::tuned` resolved; the progress key names the collection in output",
    ),
    (
        "embedfleet_snapshot::",
        "`build-shard` and the snapshot load run one stage over sources and keys `pipeline::build_shard` chose",
    ),
    (
        "embedfleet_query::",
        "`query`, `eval` and their tune and compare run one stage over a sink `pipeline::target` opened, with settings `pipeline::settings::query` resolved; the rest parse flags and render",
    ),
    ("embedfleet_publish::", "`publish` writes a dataset folder from the run's files: one stage"),
];

/// The names a file's `use` items bring in from stage crates: name → full path.
fn stage_imports(code: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for item in code.split(';') {
        // The keyword, not the end of a word (`because `).
        let keyword = item.match_indices("use ").map(|(at, _)| at).find(|&at| {
            !item[..at]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        });
        let Some(at) = keyword else {
            continue;
        };
        let tree: String = item[at + 4..]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if !STAGE_CRATES.iter().any(|c| tree.starts_with(c)) {
            continue;
        }
        let (prefix, items) = match tree.find("::{") {
            Some(brace) => (
                tree[..brace].to_string(),
                tree[brace + 3..].trim_end_matches('}').to_string(),
            ),
            None => match tree.rsplit_once("::") {
                Some((prefix, last)) => (prefix.to_string(), last.to_string()),
                None => continue,
            },
        };
        for part in items.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, alias) = match part.split_once(" as ") {
                Some((name, alias)) => (name.trim(), Some(alias.trim())),
                None => (part, None),
            };
            let full = if name == "self" {
                prefix.clone()
            } else {
                format!("{prefix}::{name}")
            };
            let alias = alias.unwrap_or_else(|| full.rsplit("::").next().unwrap());
            names.insert(alias.to_string(), full);
        }
    }
    names
}

/// Every free function of a stage crate that `src` calls, by its full path: a call spelled
/// out from the crate, or through a name its `use` items bring in. Functions of a type
/// (`Options::new`) and methods are not counted, nor a function this file defines.
pub fn stage_calls(src: &str) -> BTreeSet<String> {
    let code = code_only(src);
    let imports = stage_imports(&code);
    let bytes = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut calls = BTreeSet::new();
    for (open, _) in code.match_indices('(') {
        // The path before the parenthesis: identifiers joined by `::`.
        let mut start = open;
        while start > 0 && (ident(bytes[start - 1]) || bytes[start - 1] == b':') {
            start -= 1;
        }
        let path = &code[start..open];
        if path.is_empty() || bytes.get(start.wrapping_sub(1)) == Some(&b'.') {
            continue;
        }
        if code[..start].trim_end().ends_with("fn") {
            continue;
        }
        let segments: Vec<&str> = path.split("::").collect();
        let last = segments[segments.len() - 1];
        if segments
            .iter()
            .any(|s| s.is_empty() || s.starts_with(char::is_uppercase))
            || !last.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        {
            continue;
        }
        let full = if STAGE_CRATES.contains(&segments[0]) {
            path.to_string()
        } else if let Some(imported) = imports.get(segments[0]) {
            std::iter::once(imported.as_str())
                .chain(segments[1..].iter().copied())
                .collect::<Vec<_>>()
                .join("::")
        } else {
            continue;
        };
        calls.insert(full);
    }
    calls
}

/// The entry of [`ALLOWED`] that allows `call`.
fn allowed_by(call: &str) -> Option<&'static str> {
    ALLOWED
        .iter()
        .map(|(path, _)| *path)
        .find(|path| call == *path || (path.ends_with("::") && call.starts_with(path)))
}

#[test]
fn stage_calls_are_found_through_the_names_a_file_imports() {
    let src = "use embedfleet_upload::{self as upload, Sink};\n\
               use embedfleet_query::tune::{self, QueryTuneOptions};\n\
               use embedfleet_orchestrator::plan::plan;\n\
               fn plan_cmd() { upload::upload(&s, &o); tune::tune_queries(x); plan(&p); }\n\
               fn other() { Sink::open(x); o.upload(); embedfleet_publish::publish(&p); }\n\
               fn upload() { /* upload::send( */ let s = \"upload::send(\"; }\n";
    let calls: Vec<String> = stage_calls(src).into_iter().collect();
    assert_eq!(
        calls,
        [
            "embedfleet_orchestrator::plan::plan",
            "embedfleet_publish::publish",
            "embedfleet_query::tune::tune_queries",
            "embedfleet_upload::upload",
        ]
    );
    assert_eq!(
        allowed_by("embedfleet_upload::upload"),
        Some("embedfleet_upload::")
    );
    assert_eq!(allowed_by("embedfleet_orchestrator::plan::pack"), None);
}

#[test]
fn the_commands_call_only_the_stage_functions_listed_with_a_reason() {
    let mut unlisted = Vec::new();
    let mut used = BTreeSet::new();
    for rel in non_test_sources()
        .iter()
        .filter(|r| r.starts_with("src/commands"))
    {
        let src = std::fs::read_to_string(crate::util::root().join(rel)).unwrap();
        for call in stage_calls(&src) {
            match allowed_by(&call) {
                Some(entry) => {
                    used.insert(entry);
                }
                None => unlisted.push(format!("{}: {call}", rel.display())),
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "src/commands calls stage functions not in tests/e2e/stage_calls.rs's ALLOWED: call \
         them through pipeline, or list each with its reason:\n{}",
        unlisted.join("\n")
    );
    let stale: Vec<&str> = ALLOWED
        .iter()
        .map(|(path, _)| *path)
        .filter(|path| !used.contains(path))
        .collect();
    assert!(
        stale.is_empty(),
        "ALLOWED entries no command calls any more: {stale:?}"
    );
}
