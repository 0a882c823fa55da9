//! The imports between a crate's files (ARCHITECTURE.md, "Rules the tests keep"): no two files
//! import each other, and a folder's files do not reach up into their `mod.rs` for its helpers
//! (what several children share lives in a file of its own beside them: `core/src/rundb/error.rs`
//! and `handle.rs`, `vectordb/src/pg/sql.rs` and `config.rs`). Read from `use` items, resolved
//! to files as rustc resolves `crate::`, `super::` and `self::`.

use crate::code_rules::{code_only, non_test_sources};
use crate::util::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `code` without its `#[cfg(test)]` modules: test code is no part of the layering (and a
/// `use super::*` there is the file's own module).
fn without_test_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let Some(open) = after.find('{').filter(|&o| after[..o].contains("mod ")) else {
            out.push_str("#[cfg(test)]");
            rest = &after["#[cfg(test)]".len()..];
            continue;
        };
        let mut depth = 0;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Every `use` path of `src` (comments, strings and test modules aside), braces expanded:
/// `a::{b, c::d}` is `a::b` and `a::c::d`; an `as` rename is dropped.
fn use_paths(src: &str) -> Vec<String> {
    let code = without_test_modules(&code_only(src));
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = find_use(rest) {
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        // `a as b` keeps its name apart from its rename; every other blank goes.
        let words: Vec<&str> = after[..end].split_whitespace().collect();
        let tree: String = words.join(" ").replace(" as ", "@").replace(' ', "");
        expand("", &tree, &mut out);
        rest = &after[end..];
    }
    out
}

/// Where the next `use ` item starts (`use` as a word, `pub use` and `pub(crate) use` too).
fn find_use(s: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = s[from..].find("use ") {
        let at = from + i;
        let before = s[..at].chars().next_back();
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let Some(open) = tree.find('{') else {
        let path = tree.split('@').next().unwrap_or(tree);
        out.push(format!("{prefix}{path}"));
        return;
    };
    let head = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&format!("{prefix}{head}"), &inner[start..i], out);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < inner.len() {
        expand(&format!("{prefix}{head}"), &inner[start..], out);
    }
}

/// A source file's crate source folder (`…/src`) and its module path within the crate.
fn module_of(rel: &Path) -> Option<(PathBuf, Vec<String>)> {
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let src = parts.iter().rposition(|p| p == "src")?;
    let dir: PathBuf = parts[..=src].iter().collect();
    let mut module: Vec<String> = parts[src + 1..].to_vec();
    let file = module.pop()?;
    match file.as_str() {
        "mod.rs" => {}
        "lib.rs" | "main.rs" if module.is_empty() => {}
        name => module.push(name.trim_end_matches(".rs").to_string()),
    }
    Some((dir, module))
}

/// The file that defines module `module` of the crate whose sources are in `src`.
fn file_of(src: &Path, module: &[String], files: &BTreeSet<PathBuf>) -> Option<PathBuf> {
    if module.is_empty() {
        return ["lib.rs", "main.rs"]
            .iter()
            .map(|f| src.join(f))
            .find(|p| files.contains(p));
    }
    let path: PathBuf = module.iter().collect();
    let flat = src.join(&path).with_extension("rs");
    let folder = src.join(&path).join("mod.rs");
    [flat, folder].into_iter().find(|p| files.contains(p))
}

/// The file a `use` path of `file` reaches: the deepest module of the path that has a file.
/// `None` for a path into another crate.
fn target(file: &Path, path: &str, files: &BTreeSet<PathBuf>) -> Option<PathBuf> {
    let (src, here) = module_of(file)?;
    let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (mut module, rest) = match *segments.first()? {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (here.clone(), &segments[1..]),
        "super" => {
            let ups = segments.iter().take_while(|s| **s == "super").count();
            let mut m = here.clone();
            for _ in 0..ups {
                m.pop()?;
            }
            (m, &segments[ups..])
        }
        _ => return None,
    };
    for segment in rest {
        let mut deeper = module.clone();
        deeper.push(segment.to_string());
        if file_of(&src, &deeper, files).is_none() {
            break;
        }
        module = deeper;
    }
    file_of(&src, &module, files)
}

/// The file-to-file imports of `sources` (relative paths and their text).
fn imports(sources: &BTreeMap<PathBuf, String>) -> BTreeSet<(PathBuf, PathBuf)> {
    let files: BTreeSet<PathBuf> = sources.keys().cloned().collect();
    let mut edges = BTreeSet::new();
    for (file, text) in sources {
        for path in use_paths(text) {
            if let Some(to) = target(file, &path, &files) {
                if &to != file {
                    edges.insert((file.clone(), to));
                }
            }
        }
    }
    edges
}

/// Pairs of files that import each other.
fn mutual(edges: &BTreeSet<(PathBuf, PathBuf)>) -> Vec<String> {
    edges
        .iter()
        .filter(|(a, b)| a < b && edges.contains(&(b.clone(), a.clone())))
        .map(|(a, b)| format!("{} <-> {}", a.display(), b.display()))
        .collect()
}

/// Imports of a folder's `mod.rs` (or a crate root) by the files of that folder: children
/// reaching up for their parent's helpers.
fn imports_up(edges: &BTreeSet<(PathBuf, PathBuf)>, folder: &Path) -> Vec<String> {
    let parent = [folder.join("mod.rs"), folder.join("lib.rs")];
    edges
        .iter()
        .filter(|(from, to)| from.starts_with(folder) && parent.contains(to))
        .map(|(from, to)| format!("{} -> {}", from.display(), to.display()))
        .collect()
}

fn workspace_sources() -> BTreeMap<PathBuf, String> {
    non_test_sources()
        .into_iter()
        .map(|rel| {
            let text = std::fs::read_to_string(root().join(&rel)).unwrap();
            (rel, text)
        })
        .collect()
}

#[test]
fn use_paths_are_expanded_and_resolved_to_files() {
    assert_eq!(
        use_paths(
            "use super::{a, b::{c, d as e}};\n// use crate::x;\npub use self::f::G;\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n    fn f() { {} }\n}\nuse crate::h;\n"
        ),
        vec![
            "super::a",
            "super::b::c",
            "super::b::d",
            "self::f::G",
            "crate::h"
        ]
    );
    let mut sources = BTreeMap::new();
    sources.insert(PathBuf::from("k/src/lib.rs"), "mod m;\n".to_string());
    sources.insert(
        PathBuf::from("k/src/m/mod.rs"),
        "mod a;\nmod b;\npub use a::A;\npub fn helper() {}\n".to_string(),
    );
    sources.insert(
        PathBuf::from("k/src/m/a.rs"),
        "use super::helper;\nuse super::b::B;\npub struct A;\n".to_string(),
    );
    sources.insert(
        PathBuf::from("k/src/m/b.rs"),
        "use crate::m::a::A;\npub struct B;\n".to_string(),
    );
    let edges = imports(&sources);
    // a and b import each other; a reaches up into mod.rs for a helper.
    assert_eq!(mutual(&edges), vec!["k/src/m/a.rs <-> k/src/m/b.rs"]);
    assert_eq!(
        imports_up(&edges, Path::new("k/src/m")),
        vec!["k/src/m/a.rs -> k/src/m/mod.rs"]
    );
}

#[test]
fn no_two_files_import_each_other() {
    let edges = imports(&workspace_sources());
    assert!(
        edges.len() > 300,
        "only {} imports read: the scan is broken",
        edges.len()
    );
    let pairs = mutual(&edges);
    assert!(
        pairs.is_empty(),
        "files that import each other (move what both need into a third):\n{}",
        pairs.join("\n")
    );
}

#[test]
fn children_do_not_reach_up_into_their_mod_rs() {
    let edges = imports(&workspace_sources());
    // Issue 61 found 16 such imports in core/src/rundb, 7 in the pgvector sink and 4 in the
    // binary's commands; what each folder has now is its ceiling.
    for (folder, most) in [
        ("core/src/rundb", 0),
        ("vectordb/src/pg", 0),
        ("src/commands", 0),
        ("src/cli", 0),
        ("pipeline/src/commands", 0),
        ("pipeline/src/settings", 0),
        ("orchestrator/src/submit", 0),
    ] {
        let up = imports_up(&edges, Path::new(folder));
        assert!(
            up.len() <= most,
            "{folder}: {} imports of the folder's mod.rs by its files (at most {most}): put what they share in a file beside them\n{}",
            up.len(),
            up.join("\n")
        );
    }
}
