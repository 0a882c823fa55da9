//! Submit's refusals and set-up, end to end: bad queues, templates and commands, an unknown
//! partition and a setup every job would fail on are refused before any job is sent; the
//! trial job; environment values kept out of job scripts.

use crate::submit::{jobs_submitted, BATCHES, PER_BATCH};
use crate::util::{slurm_up, TestDir, SUBMIT_ON_SLURM_CPU};
use std::process::Command;

#[test]
fn submit_refuses_bad_queues_templates_and_missing_commands() {
    let t = TestDir::new();
    t.plan_with_model(BATCHES * PER_BATCH, PER_BATCH);
    // A queue spec that is not NAME=CAP: a usage error naming it.
    let out = t.run(&["queues", "set", "--run-dir", "run", "debug"], 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NAME=CAP"));
    // A template with an unknown placeholder: a clear error, nothing recorded as submitted.
    std::fs::write(
        t.join("bad.toml"),
        "[scheduler.script]\ntemplate = \"#!/bin/bash\\n{comand}\\n\"\n",
    )
    .unwrap();
    let base = [
        "submit",
        "--run-dir",
        "run",
        "--model-dir",
        "model",
        "--queue",
        "local=1",
    ];
    let out = t.run(&[&base[..], &["--config", "bad.toml"]].concat(), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("comand"), "{err}");
    assert_eq!(jobs_submitted(&t), 0);
    // A scheduler command that does not exist: says which and how to fix it.
    std::fs::write(
        t.join("nosbatch.toml"),
        "[scheduler]\nbackend = \"slurm\"\n[scheduler.slurm.sbatch]\npath = \"/nonexistent/sbatch\"\n",
    )
    .unwrap();
    let nosbatch = ["--config", "nosbatch.toml", "--devices", "cpu"];
    let out = t.run(&[&base[..], &nosbatch].concat(), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/sbatch") && err.contains("not found"),
        "{err}"
    );
    // The failed submit asked for Slurm: given no backend, even a dry run is refused (the real
    // submit would otherwise run local jobs); local jobs asked for by name are shown.
    let out = t.run(&[&base[..], &["--dry-run"]].concat(), 4);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("asked for the slurm backend"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Dry run: prints the script with the embed-job line; submits nothing.
    let out = t.run(
        &[&base[..], &["--dry-run", "--backend", "local"]].concat(),
        0,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("embed-job --run-dir") && text.contains("--batch 1"),
        "{text}"
    );
    assert_eq!(jobs_submitted(&t), 0);
}

#[test]
fn submit_to_an_unknown_slurm_partition_is_a_clear_error() {
    if !slurm_up("submit_to_an_unknown_slurm_partition_is_a_clear_error") {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(BATCHES * PER_BATCH, PER_BATCH);
    let args = ["--queue", "nosuchpartition=2", "--poll-interval", "0.2"];
    let out = t.run(&[&SUBMIT_ON_SLURM_CPU[..], &args].concat(), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nosuchpartition") && err.contains("queues set"),
        "{err}"
    );
    assert_eq!(jobs_submitted(&t), 0);
}

/// The real Slurm's `debug` partition when Slurm runs here, else the local backend's queue.
pub(crate) fn backend_and_queue(slurm: bool) -> (&'static str, &'static str) {
    if slurm {
        ("slurm", "debug")
    } else {
        ("local", "local")
    }
}

/// `submit` of the run `plan_with_model` made, through `backend`, with the model in `model`.
pub(crate) fn submit_args<'a>(backend: &'a str, model: &'a str) -> Vec<&'a str> {
    let args = [
        "submit",
        "--run-dir",
        "run",
        "--backend",
        backend,
        "--model-dir",
        model,
    ];
    args.to_vec()
}

#[test]
fn submit_refuses_a_setup_every_job_would_fail_on_before_sending_any() {
    let t = TestDir::new();
    t.plan_with_model(16, 8);
    let slurm = slurm_up("submit_refuses_a_setup_every_job_would_fail_on_before_sending_any");
    // This run's jobs, queued or recently ended (other tests share the Slurm).
    let tag = format!(
        "ef{}",
        embedfleet_orchestrator::submit::run_tag(&t.join("run"))
    );
    let ours = || {
        let out = Command::new("squeue")
            .args(["-h", "-t", "all", "-o", "%j"])
            .output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|name| name.starts_with(&tag))
                .count()
        })
        .unwrap_or(0)
    };
    // A CPU build with the cluster's default devices (cuda:0..3): refused, exit 4, no job.
    let (backend, queue) = backend_and_queue(slurm);
    let queue = format!("{queue}=2");
    let mut args = submit_args(backend, "model");
    args.extend(["--queue", queue.as_str()]);
    if !slurm {
        args.extend(["--devices", "cuda:0,1"]);
    }
    let out = t.run(&args, 4);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CPU build") && err.contains("[scheduler.script] embedfleet"),
        "{err}"
    );
    assert_eq!(jobs_submitted(&t), 0);
    if slurm {
        assert_eq!(ours(), 0, "nothing reached Slurm");
    }
    // A broken model directory: refused, naming the file.
    let config = std::fs::read(t.join("model/config.json")).unwrap();
    std::fs::write(t.join("model/config.json"), "{ not json").unwrap();
    let mut broken = submit_args("local", "model");
    broken.extend(["--queue", "local=1", "--devices", "cpu"]);
    let out = t.run(&broken, 4);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.json"), "{err}");
    assert_eq!(jobs_submitted(&t), 0);
    // The refused submits pinned nothing: the run's settings are still open.
    assert!(!t.join("run/output-settings.json").exists());
    assert_eq!(jobs_submitted(&t), 0);
    // Once results were taken in with the run's settings, another model or another shard
    // size is refused, naming what differs.
    std::fs::write(t.join("model/config.json"), &config).unwrap();
    let mut first = submit_args("local", "model");
    first.extend(["--queue", "local=1", "--devices", "cpu"]);
    t.run(&first, 0);
    let embedded = jobs_submitted(&t);
    t.run(&["make-tiny-model", "--out", "other", "--seed", "1"], 0);
    let mut other = submit_args("local", "other");
    other.extend(["--queue", "local=1", "--devices", "cpu"]);
    let out = t.run(&other, 4);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("would mix") && err.contains("model: the run's"),
        "{err}"
    );
    let mut shard_size = first.clone();
    shard_size.extend(["--shard-papers", "7"]);
    let out = t.run(&shard_size, 4);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--shard-papers: the run's 500, here 7"),
        "{err}"
    );
    assert_eq!(
        jobs_submitted(&t),
        embedded,
        "nothing sent by the refused ones"
    );
}

#[test]
fn submit_trial_runs_one_job_and_prints_its_time_per_batch() {
    let t = TestDir::new();
    t.plan_with_model(16, 8);
    let slurm = slurm_up("submit_trial_runs_one_job_and_prints_its_time_per_batch");
    let (backend, queue) = backend_and_queue(slurm);
    let mut args = submit_args(backend, "model");
    args.extend([
        "--devices",
        "cpu",
        "--trial",
        queue,
        "--poll-interval",
        "0.3",
    ]);
    let out = t.run(&args, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("trial: batch 1 took") && stdout.contains("walltime = \""),
        "{stdout}"
    );
    let status = t.status("run");
    assert_eq!(status["batches_by_state"]["done"], 1, "{status}");
    assert_eq!(status["batches_by_state"]["planned"], 1, "{status}");
    assert_eq!(jobs_submitted(&t), 1, "one trial job");
    assert!(
        status["queue_caps"].as_object().unwrap().is_empty(),
        "a trial leaves the run's queues alone: {status}"
    );
}

#[test]
fn job_scripts_keep_env_values_private_and_dry_run_masks_them() {
    use std::os::unix::fs::PermissionsExt;
    let t = TestDir::new();
    t.plan_with_model(8, 8);
    std::fs::write(
        t.join("run.toml"),
        "[scheduler.script]\nenv = { HF_TOKEN = \"s3cret-value\" }\n",
    )
    .unwrap();
    let base = [
        "submit",
        "--run-dir",
        "run",
        "--config",
        "run.toml",
        "--model-dir",
        "model",
        "--queue",
        "local=1",
    ];
    let out = t.run(&[&base[..], &["--dry-run"]].concat(), 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("export HF_TOKEN='***'"), "{text}");
    assert!(!text.contains("s3cret"), "the dry run prints no secret");
    t.run(&base, 0);
    let scripts: Vec<_> = std::fs::read_dir(t.join("run/jobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sh"))
        .collect();
    assert_eq!(scripts.len(), 1);
    let mode = std::fs::metadata(&scripts[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "only its owner reads the script: {mode:o}");
    let script = std::fs::read_to_string(&scripts[0]).unwrap();
    assert!(
        script.contains("s3cret-value"),
        "the job itself gets the value"
    );
}

/// A run directory with a `%` in its name (`%u` is Slurm's pattern for the user name): the
/// trial job's log lands in the run's own `logs/`, where the breaker and `status` look.
#[test]
fn a_run_directory_with_a_percent_keeps_its_slurm_logs() {
    let t = TestDir::new();
    if !slurm_up("a_run_directory_with_a_percent_keeps_its_slurm_logs") {
        return;
    }
    t.plan_with_model(8, 8);
    std::fs::rename(t.join("run"), t.join("r%un")).unwrap();
    let out = t.run(
        &[
            "submit",
            "--run-dir",
            "r%un",
            "--backend",
            "slurm",
            "--model-dir",
            "model",
            "--devices",
            "cpu",
            "--trial",
            "debug",
            "--poll-interval",
            "0.3",
        ],
        0,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("trial: batch 1 took"), "{stdout}");
    let logs: Vec<_> = std::fs::read_dir(t.join("r%un").join("logs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(!logs.is_empty(), "the job's log is in the run's logs/");
}
