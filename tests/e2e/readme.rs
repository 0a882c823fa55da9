//! The documentation tells the truth about the binary: docs/commands.md's command reference
//! is the binary's own `--help` text, every section that code or docs cite as
//! `docs/NAME.md, "Title"` (or `README, "Title"`) exists, every relative link of README.md and
//! docs/ resolves, and the README's two commands at the top are the ones that work.

use crate::util::root;
use crate::util::TestDir;
use std::path::{Path, PathBuf};

const BEGIN: &str = "<!-- BEGIN HELP -->";
const END: &str = "<!-- END HELP -->";
/// Where the command reference lives (README links to it).
const COMMANDS: &str = "docs/commands.md";

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The subcommands a `--help` text lists, `help` left out: the first word of each line of a
/// section of commands (clap's "Commands:", or one of the top-level help's groups), and the
/// internal ones the top-level help names in its "Internal ...: a, b" line.
fn subcommands(help: &str) -> Vec<String> {
    const NOT_COMMANDS: [&str; 5] = [
        "Arguments:",
        "Options:",
        "Global options:",
        "Examples:",
        "Usage:",
    ];
    let mut out = Vec::new();
    let mut in_commands = false;
    for line in help.lines() {
        if line.starts_with("Internal") {
            let (_, names) = line.split_once("): ").expect("Internal (...): a, b");
            out.extend(names.split(", ").map(str::to_owned));
        } else if !line.starts_with(' ') && !line.is_empty() {
            in_commands = line.ends_with(':') && !NOT_COMMANDS.iter().any(|h| line.starts_with(h));
        } else if in_commands && line.starts_with("  ") && !line.starts_with("   ") {
            // Command lines are indented by two spaces; wrapped descriptions by more.
            out.extend(line.split_whitespace().next().map(str::to_owned));
        }
    }
    out.retain(|c| c != "help");
    out
}

/// Every command's `--help`, each subcommand's (`queues set`) after its command's.
fn help_reference(t: &TestDir) -> String {
    let help = |args: &[&str]| {
        let mut args = args.to_vec();
        args.push("--help");
        String::from_utf8(t.run(&args, 0).stdout).unwrap()
    };
    let top = help(&[]);
    let commands = subcommands(&top);
    assert!(commands.len() >= 3, "{top}");
    let mut out = format!("### `embedfleet --help`\n\n```text\n{}```\n", top);
    for command in commands {
        let text = help(&[&command]);
        out.push_str(&format!(
            "\n### `embedfleet {command}`\n\n```text\n{text}```\n"
        ));
        for sub in subcommands(&text) {
            out.push_str(&format!(
                "\n### `embedfleet {command} {sub}`\n\n```text\n{}```\n",
                help(&[&command, &sub])
            ));
        }
    }
    out
}

#[test]
fn command_reference_matches_help() {
    let t = TestDir::new();
    let path = root().join(COMMANDS);
    let doc = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = doc
        .split_once(BEGIN)
        .expect("docs/commands.md has the BEGIN HELP marker");
    let (current, tail) = rest
        .split_once(END)
        .expect("docs/commands.md has the END HELP marker");
    let expected = format!("\n{}", help_reference(&t));
    if std::env::var_os("EMBEDFLEET_BLESS").is_some() {
        std::fs::write(&path, format!("{head}{BEGIN}{expected}{END}{tail}")).unwrap();
        return;
    }
    assert!(
        current == expected,
        "docs/commands.md's command reference is out of date: run EMBEDFLEET_BLESS=1 cargo nextest run -E 'test(command_reference)'"
    );
}

/// The lines of a markdown file outside its fenced code blocks (a `# comment` in a shell or
/// TOML example is not a heading).
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// A markdown file's headings, as written (`#` marks and backticks removed).
fn headings(text: &str) -> Vec<String> {
    prose_lines(text)
        .into_iter()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim().replace('`', ""))
        .collect()
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a markdown file; a repeated heading gets `-1`, `-2`, ... as on GitHub.
fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for h in headings(text) {
        let base = slug(&h);
        let mut anchor = base.clone();
        let mut n = 0;
        while out.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        out.push(anchor);
    }
    out
}

/// The sections `text` cites as `FILE, "Title"`, FILE being `README`, `README.md`,
/// `ARCHITECTURE.md` or `docs/NAME.md`: (the file, relative to the root; the title). Comment
/// marks, string escapes and line breaks (help text and comments wrap) are taken out first.
fn citations(text: &str) -> Vec<(String, String)> {
    let flat = text
        .lines()
        .map(|l| {
            let l = l.trim();
            let l = ["///", "//!", "//", "#", "*"]
                .iter()
                .find_map(|mark| l.strip_prefix(mark))
                .unwrap_or(l);
            l.strip_suffix('\\').unwrap_or(l).trim()
        })
        .collect::<Vec<_>>()
        .join(" ")
        .replace("\\\"", "\"");
    let flat = flat.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    let mut rest = flat.as_str();
    while let Some(at) = rest.find(", \"") {
        let before = &rest[..at];
        let word = before
            .rsplit(|c: char| c.is_whitespace() || c == '(' || c == '[')
            .next()
            .unwrap_or("");
        let after = &rest[at + 3..];
        rest = after;
        let file = match word {
            "README" | "README.md" => "README.md".to_string(),
            "ARCHITECTURE.md" => word.to_string(),
            w if w.starts_with("docs/") && w.ends_with(".md") => w.to_string(),
            _ => continue,
        };
        if let Some((title, _)) = after.split_once('"') {
            out.push((file, title.to_string()));
        }
    }
    out
}

fn assert_cited_sections_exist(cited: &[(String, String)], from: &str) {
    for (file, title) in cited {
        let path = root().join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{from} cites {file}, \"{title}\": {e}"));
        assert!(
            headings(&text).contains(title),
            "{from} cites {file}, \"{title}\", a section {file} does not have (its headings: {:?})",
            headings(&text)
        );
    }
}

#[test]
fn every_section_that_help_cites_exists() {
    let t = TestDir::new();
    let cited = citations(&help_reference(&t));
    assert!(cited.len() >= 3, "the help cites doc sections: {cited:?}");
    assert_cited_sections_exist(&cited, "--help");
}

/// The files under `dir` that may cite a doc section, skipping build output and hidden
/// folders other than `.ci`.
fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if name != "target" && (name == ".ci" || !name.starts_with('.')) {
                source_files(&path, out);
            }
        } else if ["rs", "md", "toml", "sh", "py"]
            .iter()
            .any(|ext| name.ends_with(&format!(".{ext}")))
        {
            out.push(path);
        }
    }
}

#[test]
fn every_section_that_code_and_docs_cite_exists() {
    let mut files = Vec::new();
    source_files(root(), &mut files);
    let this = root().join("tests/e2e/readme.rs");
    let mut count = 0;
    for file in files.iter().filter(|f| **f != this) {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let cited = citations(&text);
        count += cited.len();
        let from = file.strip_prefix(root()).unwrap().display().to_string();
        assert_cited_sections_exist(&cited, &from);
    }
    assert!(
        count >= 10,
        "only {count} citations found: is the scan broken?"
    );
}

/// The markdown files whose links must resolve: README.md, the top-level guides and docs/.
fn doc_files() -> Vec<String> {
    let mut files: Vec<String> = [
        "README.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "models/README.md",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The targets of the inline links `[text](target)` in a markdown file's prose.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let mut checked = 0;
    for file in doc_files() {
        let text = read(&file);
        let dir = root().join(&file).parent().unwrap().to_path_buf();
        for link in links(&text) {
            if link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            let (target, anchor) = match link.split_once('#') {
                Some((t, a)) => (t, Some(a)),
                None => (link.as_str(), None),
            };
            let path = if target.is_empty() {
                root().join(&file)
            } else {
                dir.join(target)
            };
            assert!(
                path.exists(),
                "{file} links to {link}: {} does not exist",
                path.display()
            );
            if let Some(anchor) = anchor {
                let target_text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{file} links to {link}: {e}"));
                assert!(
                    anchors(&target_text).iter().any(|a| a == anchor),
                    "{file} links to {link}: no heading there has the anchor #{anchor} (anchors: {:?})",
                    anchors(&target_text)
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 20,
        "only {checked} links checked: is the scan broken?"
    );
}

/// The contents of the first `n` ```sh blocks of a markdown text.
fn sh_blocks(text: &str, n: usize) -> Vec<String> {
    text.split("```sh\n")
        .skip(1)
        .take(n)
        .map(|b| b.split("```").next().unwrap().trim().to_string())
        .collect()
}

#[test]
fn the_readme_test_command_is_what_ci_runs() {
    let readme = read("README.md");
    let blocks = sh_blocks(&readme, 2);
    assert_eq!(
        blocks[1], "bash .ci/run",
        "README's second command is the test command"
    );
    let ci = read(".ci/run");
    let runs_tests = ci
        .lines()
        .any(|l| l.trim() == "cargo nextest run --workspace");
    assert!(runs_tests, ".ci/run runs `cargo nextest run --workspace`");
    assert!(
        readme.contains("then runs `cargo nextest run --workspace`"),
        "README says which test command .ci/run runs"
    );
}

#[test]
fn the_readme_first_command_runs_the_whole_pipeline() {
    let readme = read("README.md");
    let first = sh_blocks(&readme, 1).remove(0);
    let args: Vec<&str> = first
        .strip_prefix("cargo run --release -- ")
        .unwrap_or_else(|| panic!("README's first command runs the binary through cargo: {first}"))
        .split_whitespace()
        .collect();
    assert_eq!(args[0], "run", "{first}");
    // The same arguments, from the repository root as the README says, into a fresh run
    // directory in place of /tmp/embedfleet-demo.
    let t = TestDir::new();
    let run_dir = t.join("demo");
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let at = args
        .iter()
        .position(|a| a == "--run-dir")
        .expect("the first command names a --run-dir");
    args[at + 1] = run_dir.display().to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_embedfleet"))
        .current_dir(root())
        .args(&args)
        .env_remove("EMBEDFLEET_LOG")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "README's first command: {first}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = t.status(&run_dir.display().to_string());
    assert!(status["papers_planned"].as_u64().unwrap() > 0, "{status}");
    assert_eq!(
        status["rows_in_shards"], status["papers_planned"],
        "{status}"
    );
}

/// `HH:MM:SS` in seconds.
fn seconds(walltime: &str) -> u64 {
    walltime
        .split(':')
        .map(|p| {
            p.parse::<u64>()
                .unwrap_or_else(|_| panic!("walltime {walltime}"))
        })
        .fold(0, |acc, p| acc * 60 + p)
}

#[test]
fn every_example_walltime_follows_the_trial_rule_for_the_studys_batch() {
    // The trial's rule (pipeline/src/commands/submit.rs): time per batch x 1.5 + 60 s. The study's
    // batch: 2,382 s of inference, ~2,500 s with model load and I/O.
    let needed = (2_500.0_f64 * 1.5 + 60.0).ceil() as u64;
    let mut found = 0;
    let mut files = vec![
        "examples/run-pbs-polaris.toml".to_string(),
        "examples/run-slurm-gpu.toml".to_string(),
    ];
    files.extend(doc_files());
    for file in files {
        for line in read(&file).lines() {
            let Some(rest) = line.trim_start().strip_prefix("walltime = \"") else {
                continue;
            };
            let value = rest.split('"').next().unwrap();
            found += 1;
            assert!(
                seconds(value) >= needed,
                "{file}: walltime = \"{value}\" is below the study's batch by the trial's rule ({needed} s)"
            );
        }
    }
    assert!(found >= 3, "walltime examples found: {found}");
}
