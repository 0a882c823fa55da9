//! Readers of the report's files that are not ours: Debian's headless `chromium` (the page's
//! DOM after its scripts ran, a screenshot) and `promtool` (the metrics file). A missing tool
//! skips the check, or fails it where EMBEDFLEET_REQUIRE_CHROMIUM=1 / EMBEDFLEET_REQUIRE_PROMTOOL=1
//! (CI), as the Slurm tests do.

use std::path::Path;
use std::process::Command;

/// Whether `tool --version` runs; panics when it does not and `required_env` is 1.
fn tool(tool: &str, required_env: &str, install: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var(required_env).as_deref() != Ok("1"),
            "{required_env}=1 but `{tool}` does not run: {install}"
        );
        eprintln!("skipping the {tool} check: no {tool} ({install})");
    }
    ok
}

/// The page as headless Chromium has it once its scripts ran, and its console lines; `None`
/// when there is no chromium (and it is not required).
pub struct Rendered {
    pub dom: String,
    pub console: Vec<String>,
    pub wall_s: f64,
}

pub fn render(page: &Path, screenshot: Option<&Path>) -> Option<Rendered> {
    if !tool(
        "chromium",
        "EMBEDFLEET_REQUIRE_CHROMIUM",
        "apt-get install chromium",
    ) {
        return None;
    }
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    let profile = tempfile::tempdir().unwrap();
    let base = |c: &mut Command| {
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(["--virtual-time-budget=20000", "--window-size=1280,2400"]);
    };
    let started = std::time::Instant::now();
    let mut dump = Command::new("chromium");
    base(&mut dump);
    let out = dump
        .args(["--enable-logging=stderr", "--v=0", "--dump-dom"])
        .arg(&url)
        .output()
        .unwrap();
    let wall_s = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("CONSOLE"))
        .map(str::to_string)
        .collect();
    if let Some(png) = screenshot {
        let mut shot = Command::new("chromium");
        base(&mut shot);
        let out = shot
            .arg(format!("--screenshot={}", png.display()))
            .arg(&url)
            .output()
            .unwrap();
        assert!(out.status.success(), "chromium --screenshot failed");
    }
    Some(Rendered {
        dom: String::from_utf8(out.stdout).unwrap(),
        console,
        wall_s,
    })
}

/// `promtool check metrics` on the file; `false` when there is no promtool (and it is not
/// required). Panics with promtool's complaints when it fails.
pub fn promtool_check(metrics: &Path) -> bool {
    if !tool(
        "promtool",
        "EMBEDFLEET_REQUIRE_PROMTOOL",
        "apt-get install prometheus",
    ) {
        return false;
    }
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(metrics).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics {}:\n{}{}",
        metrics.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}
