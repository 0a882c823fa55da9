//! The run keeps its scheduler configuration (a restart without options stays on Slurm; a
//! different one is refused with the difference shown, or replaced when asked), and
//! `submit --dry-run` writes nothing.

use crate::util::{assert_same_tree, embed_job_args, slurm_up, tree, TestDir};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn db(t: &TestDir) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(t.join("run/run.db")).unwrap();
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c
}

/// (name, backend, scheduler id, state) of every job row.
fn jobs(t: &TestDir) -> Vec<(String, String, Option<String>, String)> {
    let c = db(t);
    let mut stmt = c
        .prepare("SELECT name, backend, scheduler_id, state FROM jobs ORDER BY rowid")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap();
    rows.map(Result::unwrap).collect()
}

#[test]
fn a_restart_without_options_keeps_the_runs_slurm_config_and_starts_no_local_job() {
    let test = "a_restart_without_options_keeps_the_runs_slurm_config_and_starts_no_local_job";
    if !slurm_up(test) {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(40, 8);
    std::fs::write(
        t.join("slurm.toml"),
        "[scheduler]\nbackend = \"slurm\"\n[scheduler.script]\nwalltime = \"00:10:00\"\n",
    )
    .unwrap();
    let first = [
        "submit",
        "--run-dir",
        "run",
        "--config",
        "slurm.toml",
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--queue",
        "debug=1",
        "--shard-papers",
        "3",
        "--poll-interval",
        "0.3",
    ];
    let mut child = t
        .cmd(&first)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed while a Slurm job of the run is queued or running.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "no Slurm job was submitted");
        if t.join("run/run.db").exists() {
            let open = jobs(&t).into_iter().any(|(_, _, id, state)| {
                id.is_some() && (state == "pending" || state == "running")
            });
            if open {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        jobs(&t).len() < 5,
        "killed before every batch had a job: {:?}",
        jobs(&t)
    );
    // Restarted after a "reboot" with only the run: the model, the devices and the shard size
    // are the run's (a restart that fell back to 500 papers per shard would be refused).
    let out = t.run(&["submit", "--run-dir", "run"], 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("using the run's stored run config (backend slurm)"),
        "{err}"
    );
    assert!(err.contains("adopting 1 jobs"), "{err}");
    assert!(
        err.contains("using the run's loop options: --poll-interval 0.3"),
        "{err}"
    );
    assert!(!err.contains("lost"), "no job was called lost: {err}");
    assert_eq!(t.status("run")["batches_by_state"]["done"], 5);
    let shards = std::fs::read_dir(t.join("run/shards")).unwrap().count();
    assert_eq!(shards, 5 * 3, "8 papers in shards of 3: 3 per batch");
    let rows = jobs(&t);
    assert!(rows.len() >= 5, "{rows:?}");
    for (name, backend, id, state) in &rows {
        assert_eq!(backend, "slurm", "{name}: every job went through Slurm");
        assert!(id.is_some(), "{name}");
        assert_eq!(state, "completed", "{name}");
        // The scripts are Slurm's (a local job's script has no #SBATCH directives) and
        // their log says Slurm ran them.
        let script = std::fs::read_to_string(t.join(&format!("run/jobs/{name}.sh"))).unwrap();
        assert!(script.contains("#SBATCH --partition=debug"), "{script}");
    }
    // The jobs Slurm knows by this run's names are all of the rows: none ran elsewhere.
    // Slurm's accounting writes a job's record a moment after the job ends, so the last
    // job may take a few seconds to appear.
    let lines: Vec<String> = rows
        .iter()
        .map(|(name, _, id, _)| format!("{name}|{}", id.as_deref().unwrap()))
        .collect();
    let read_sacct = || {
        Command::new("sacct")
            .args(["-n", "-X", "-P", "-o", "JobName,JobID", "-S", "now-1hour"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let accounting_deadline = Instant::now() + Duration::from_secs(30);
    let mut sacct = read_sacct();
    while !sacct.trim().is_empty()
        && lines.iter().any(|l| !sacct.contains(l.as_str()))
        && Instant::now() < accounting_deadline
    {
        std::thread::sleep(Duration::from_millis(500));
        sacct = read_sacct();
    }
    if !sacct.trim().is_empty() {
        for (name, _, id, _) in &rows {
            let line = format!("{name}|{}", id.as_deref().unwrap());
            assert!(sacct.contains(&line), "Slurm ran {line}: {sacct}");
        }
    }
    // A different backend is refused, the difference shown key by key; nothing changes.
    let out = t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--backend",
            "local",
        ],
        4,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"scheduler.backend: the run's "slurm", here "local""#)
            && err.contains("--replace-config"),
        "{err}"
    );
    std::fs::write(
        t.join("slurm2.toml"),
        "[scheduler]\nbackend = \"slurm\"\n[scheduler.script]\nwalltime = \"00:20:00\"\n",
    )
    .unwrap();
    let out = t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--config",
            "slurm2.toml",
            "--dry-run",
        ],
        4,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"scheduler.script.walltime: the run's "00:10:00", here "00:20:00""#),
        "{err}"
    );
    // Asked for explicitly, the new one is stored.
    let out = t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--config",
            "slurm2.toml",
            "--replace-config",
        ],
        0,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("replacing the run's stored run config"),
        "{err}"
    );
    let stored: String = db(&t)
        .query_row(
            "SELECT value FROM settings WHERE key = 'run_config'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(stored.contains("00:20:00"), "{stored}");
}

#[test]
fn a_dry_run_leaves_the_run_directory_byte_identical() {
    let t = TestDir::new();
    t.plan_with_model(24, 8);
    // Batch 1 finished and taken in, batch 2's result manifest written but not read yet:
    // opening run.db the usual way would ingest it and write.
    t.run(&embed_job_args(&["--devices", "cpu"]), 0);
    t.status("run");
    let mut second = embed_job_args(&["--devices", "cpu"]);
    second[4] = "2";
    t.run(&second, 0);
    let before = tree(&t.join("run"));
    assert!(!before.contains_key(Path::new("run.db-wal")));
    let dry = [
        "submit",
        "--run-dir",
        "run",
        "--model-dir",
        "model",
        "--queue",
        "local=2",
        "--dry-run",
    ];
    let out = t.run(&dry, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("the run config this submit would store")
            && text.contains("backend = \"local\""),
        "{text}"
    );
    assert!(
        text.contains("output-settings.json has them already"),
        "{text}"
    );
    assert!(text.contains("# ---- job "), "{text}");
    assert!(
        text.contains("# batches 2 have result manifests that run.db has not taken in"),
        "{text}"
    );
    assert_same_tree(&before, &t.join("run"));

    // A fresh run: the dry run pins no vector dtype, so f16 may still be chosen after it.
    let t = TestDir::new();
    t.plan_with_model(16, 8);
    let before = tree(&t.join("run"));
    let out = t.run(&dry, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("output settings the first job would pin") && text.contains("\"f32\""),
        "{text}"
    );
    assert_same_tree(&before, &t.join("run"));
    t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--queue",
            "local=2",
            "--vector-dtype",
            "f16",
            "--poll-interval",
            "0.3",
        ],
        0,
    );
    assert_eq!(t.status("run")["batches_by_state"]["done"], 2);
    let pinned = std::fs::read_to_string(t.join("run/output-settings.json")).unwrap();
    assert!(pinned.contains("f16"), "{pinned}");
}
