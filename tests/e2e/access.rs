//! The run directory as another user of the filesystem sees it (docs/cluster.md, "Who can read
//! and write a run directory"): a run made under a project space's umask (`002`) keeps its
//! secrets — the `env` values and the notify command's token — from another uid (`nobody`,
//! through `setpriv`), and a run.db its group can write does not get its stored command run.

use crate::util::TestDir;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

const TOKEN: &str = "T0KEN_9f3a";
const SECRET: &str = "hf_s3cret_77";

/// `embedfleet ARGS` under umask 002, as on a project space made for sharing.
fn run_umask_002(t: &TestDir, args: &[&str], code: i32) -> Output {
    let out = Command::new("sh")
        .arg("-c")
        .arg("umask 002; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_embedfleet"))
        .args(args)
        .current_dir(t.path())
        .env_remove("EMBEDFLEET_LOG")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "embedfleet {args:?}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `plan` of `c.jsonl.gz` into `run` (2 papers a batch) under umask 002.
fn plan_umask_002(t: &TestDir) {
    let plan = [
        "plan",
        "--corpus",
        "c.jsonl.gz",
        "--run-dir",
        "run",
        "--papers-per-job",
        "2",
    ];
    run_umask_002(t, &plan, 0);
}

/// `sh -c SCRIPT` as `nobody` (uid and gid 65534, no groups).
fn as_nobody(dir: &Path, script: &str) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn access_another_user_cannot_read_a_runs_secrets_and_a_writable_run_db_runs_nothing() {
    if !running_as_root() {
        eprintln!("skipped: needs root to act as a second user (setpriv)");
        return;
    }
    let t = TestDir::new();
    // The test's own folder is tempfile's 0700: open it, as a project space is.
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    t.sample("c.jsonl.gz", 4, 1);
    plan_umask_002(&t);
    t.run(&["make-tiny-model", "--out", "model"], 0);
    let run = t.join("run");
    assert_eq!(mode(&run), 0o700, "a new run directory is its owner's");
    let config = format!(
        "[scheduler.script]\nenv = {{ HF_TOKEN = \"{SECRET}\" }}\n\n\
         [notify]\ncommand = 'echo \"$EMBEDFLEET_EVENT {TOKEN}\" >> {}'\n",
        t.join("hook.txt").display()
    );
    std::fs::write(t.join("run.toml"), config).unwrap();
    let submit = [
        "submit",
        "--run-dir",
        "run",
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--poll-interval",
        "0.3",
        "--config",
        "run.toml",
    ];
    let dry = run_umask_002(&t, &[&submit[..], &["--dry-run"]].concat(), 0);
    let shown = String::from_utf8_lossy(&dry.stdout);
    assert!(
        !shown.contains(TOKEN) && !shown.contains(SECRET) && shown.contains("HF_TOKEN"),
        "a dry run prints no secret:\n{shown}"
    );
    run_umask_002(&t, &submit, 0);
    let hooks = std::fs::read_to_string(t.join("hook.txt")).unwrap();
    assert!(hooks.contains(&format!("finished {TOKEN}")), "{hooks}");

    // Whatever the umask, each file that holds a secret is the owner's alone...
    let db = run.join("run.db");
    assert_eq!(mode(&db), 0o600);
    for wal in [run.join("run.db-wal"), run.join("run.db-shm")] {
        if wal.exists() {
            assert_eq!(mode(&wal), 0o600, "{}", wal.display());
        }
    }
    let scripts: Vec<_> = std::fs::read_dir(run.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sh"))
        .collect();
    assert!(!scripts.is_empty());
    for script in &scripts {
        assert_eq!(mode(script), 0o700, "{}", script.display());
        assert!(std::fs::read_to_string(script).unwrap().contains(SECRET));
    }
    assert_eq!(mode(&run.join("logs/notify.log")), 0o600);
    // ... so that even with the directory opened to everyone, another user reads none of them.
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let look = as_nobody(
        &run,
        &format!("cat run.db run.db-wal jobs/*.sh logs/notify.log 2>/dev/null | grep -c -e {TOKEN} -e {SECRET}"),
    );
    assert_eq!(
        String::from_utf8_lossy(&look.stdout).trim(),
        "0",
        "another user read a secret: {}",
        String::from_utf8_lossy(&look.stderr)
    );
    let denied = as_nobody(&run, "cat run.db");
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("Permission denied"),
        "{denied:?}"
    );
    // A directory others can write is warned about at every open.
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    let status = t.run(&["status", "--run-dir", "run"], 0);
    assert!(
        String::from_utf8_lossy(&status.stderr).contains("can be written by its group and others"),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();

    // A run.db from an older embedfleet (0644) is tightened by its owner's next open.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    t.run(&["status", "--run-dir", "run"], 0);
    assert_eq!(mode(&db), 0o600);

    // A run.db the group can write: its stored notify command (anyone in the group could have
    // put theirs there) is not run as the owner; the submit is refused and says what to do.
    std::fs::remove_file(t.join("hook.txt")).unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o664)).unwrap();
    let refused = t.run(&["submit", "--run-dir", "run", "--poll-interval", "0.3"], 4);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("can be written by its group (mode 664)") && why.contains("chmod go-w"),
        "{why}"
    );
    assert!(
        !t.join("hook.txt").exists(),
        "the stored command did not run"
    );
    assert_eq!(mode(&db), 0o664, "left for the owner to look at");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
    t.run(&["submit", "--run-dir", "run", "--poll-interval", "0.3"], 0);
}

#[test]
fn access_a_run_directory_made_for_a_group_gives_it_read_never_write() {
    let t = TestDir::new();
    let run = t.join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o750)).unwrap();
    t.sample("c.jsonl.gz", 2, 1);
    plan_umask_002(&t);
    assert_eq!(mode(&run), 0o750, "the user's choice is kept");
    assert_eq!(mode(&run.join("run.db")), 0o640);
}
