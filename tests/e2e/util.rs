//! A temporary directory and a `Command` for the binary under test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct TestDir {
    dir: tempfile::TempDir,
}

impl TestDir {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `embedfleet ARGS...` run in this directory.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_embedfleet"));
        cmd.current_dir(self.path())
            .args(args)
            .env_remove("EMBEDFLEET_LOG");
        cmd
    }

    /// Runs `embedfleet ARGS...`, asserting it exits with `code`.
    pub fn run(&self, args: &[&str], code: i32) -> Output {
        let out = self.cmd(args).output().expect("the binary runs");
        assert_eq!(
            out.status.code(),
            Some(code),
            "embedfleet {args:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `status --json` of a run directory.
    pub fn status(&self, run_dir: &str) -> serde_json::Value {
        let out = self.run(&["status", "--run-dir", run_dir, "--json"], 0);
        serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
    }

    /// A sample corpus of `papers` short papers over `files` files; returns its path.
    pub fn sample(&self, name: &str, papers: u64, files: u32) -> String {
        let (papers, files) = (papers.to_string(), files.to_string());
        self.run(
            &[
                "sample-corpus",
                "--papers",
                &papers,
                "--mean-chars",
                "1500",
                "--files",
                &files,
                "--out",
                name,
            ],
            0,
        );
        name.to_string()
    }
}
