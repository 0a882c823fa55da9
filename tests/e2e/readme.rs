//! README.md's command reference is the binary's own `--help` text.

use crate::util::TestDir;

const BEGIN: &str = "<!-- BEGIN HELP -->";
const END: &str = "<!-- END HELP -->";

fn help_reference(t: &TestDir) -> String {
    let top = t.run(&["--help"], 0);
    let top = String::from_utf8(top.stdout).unwrap();
    // The subcommands are the indented words between "Commands:" and the next blank line.
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        // Command lines are indented by two spaces; wrapped descriptions by more.
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() >= 3, "{top}");
    let mut out = format!("### `embedfleet --help`\n\n```text\n{}```\n", top);
    for command in commands {
        let help = t.run(&[&command, "--help"], 0);
        out.push_str(&format!(
            "\n### `embedfleet {command}`\n\n```text\n{}```\n",
            String::from_utf8(help.stdout).unwrap()
        ));
    }
    out
}

#[test]
fn command_reference_matches_help() {
    let t = TestDir::new();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = readme
        .split_once(BEGIN)
        .expect("README.md has the BEGIN HELP marker");
    let (current, tail) = rest
        .split_once(END)
        .expect("README.md has the END HELP marker");
    let expected = format!("\n{}", help_reference(&t));
    if std::env::var_os("EMBEDFLEET_BLESS").is_some() {
        std::fs::write(&path, format!("{head}{BEGIN}{expected}{END}{tail}")).unwrap();
        return;
    }
    assert!(
        current == expected,
        "README.md's command reference is out of date: run EMBEDFLEET_BLESS=1 cargo nextest run -E 'test(command_reference)'"
    );
}

/// The README section titles that `text` points to as `README, "Title"` (help text wraps
/// lines, so whitespace is collapsed first).
fn cited_sections(text: &str) -> Vec<String> {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    flat.split("README, \"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"').map(|(title, _)| title.to_string()))
        .collect()
}

#[test]
fn every_readme_section_that_help_names_exists() {
    let t = TestDir::new();
    let help = help_reference(&t);
    let cited = cited_sections(&help);
    assert!(
        cited.len() >= 3,
        "the help names README sections: {cited:?}"
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let headings: Vec<String> = readme
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .trim_matches('`')
                .to_string()
        })
        .collect();
    for title in cited {
        assert!(
            headings.contains(&title),
            "--help names README section \"{title}\", which README.md does not have"
        );
    }
}
