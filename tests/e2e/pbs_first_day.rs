//! A PBS site's first day on the one-node OpenPBS (issue 60, items 4-6): a misspelt queue is
//! refused before anything is stored, the dry run included; a failed first submit's bare
//! restart never falls back to local jobs; a CPU build named for GPU jobs is refused before
//! the dry run and the trial, and a job refused for its setup is no loss of the queue's.

use crate::pbs_util::{finish, jobs, pbs_up, run_config, spawn_submit};
use crate::util::TestDir;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `--queue debgu=1` (a typo for debug) beside a good queue: refused in the dry run and in the
/// real submit, before anything is stored, naming the server's queues; nothing ran anywhere.
/// Then the documented restart (`submit --run-dir` alone) is refused too: the run never falls
/// back to local jobs on the login node.
#[test]
fn pbs_a_misspelt_queue_is_refused_and_a_bare_restart_never_runs_locally() {
    let test = "pbs_a_misspelt_queue_is_refused_and_a_bare_restart_never_runs_locally";
    if !pbs_up(test) {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(8, 4);
    std::fs::write(t.join("run.toml"), run_config("")).unwrap();
    let dry = t
        .cmd(&[
            "submit",
            "--run-dir",
            "run",
            "--config",
            "run.toml",
            "--model-dir",
            "model",
            "--devices",
            "cpu",
            "--queue",
            "debgu=1",
            "--queue",
            "preemptable=1",
            "--dry-run",
        ])
        .output()
        .unwrap();
    let err = stderr(&dry);
    assert_eq!(dry.status.code(), Some(4), "{err}");
    assert!(
        err.contains("the PBS server has no queue `debgu`") && err.contains("debug"),
        "{err}"
    );
    assert!(
        !String::from_utf8_lossy(&dry.stdout).contains("#PBS -q debgu"),
        "no script for it"
    );
    let (code, err) = finish(
        spawn_submit(&t, &["--queue", "debgu=1", "--queue", "preemptable=1"]),
        120,
        || {},
    );
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("the PBS server has no queue `debgu`"), "{err}");
    assert!(jobs(&t).is_empty(), "no job was sent to any queue");
    let status = t.status("run");
    assert!(
        status["queue_caps"].as_object().unwrap().is_empty(),
        "no caps stored: {status}"
    );
    // The restart README documents, given no config: refused, not run as local jobs.
    let out = t
        .cmd(&[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--devices",
            "cpu",
        ])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("asked for the pbs backend") && err.contains("--config"),
        "{err}"
    );
    assert!(jobs(&t).is_empty(), "no local job either: {:?}", jobs(&t));
}

/// A CPU build named as the jobs' binary while the devices default to the GPUs of PBS's nodes
/// (no `gpus_per_node`): the dry run says so and refuses, and so does the trial, before any
/// job reaches PBS.
#[test]
fn pbs_a_cpu_build_named_for_gpu_jobs_is_refused_before_the_dry_run_and_the_trial() {
    let test = "pbs_a_cpu_build_named_for_gpu_jobs_is_refused_before_the_dry_run_and_the_trial";
    if !pbs_up(test) {
        return;
    }
    if embedfleet_pipeline::VERSION.contains("cuda") {
        eprintln!("skipping {test}: this is a CUDA build");
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(8, 4);
    let exe = env!("CARGO_BIN_EXE_embedfleet");
    std::fs::write(
        t.join("run.toml"),
        run_config(&format!("embedfleet = \"{exe}\"\nwalltime = \"00:10:00\"")),
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
    ];
    for extra in [
        &["--queue", "debug=1", "--dry-run"][..],
        &["--trial", "debug"][..],
    ] {
        let out = t.cmd(&[&base[..], extra].concat()).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(4), "{extra:?}: {err}");
        assert!(
            err.contains("is a CPU build") && err.contains("--devices cuda:0,1,2,3"),
            "{extra:?}: {err}"
        );
        assert!(
            err.contains("gives no `gpus_per_node`"),
            "the note on the default devices: {err}"
        );
    }
    assert!(jobs(&t).is_empty(), "no job reached PBS");
    // With --devices cpu the same config passes its dry run.
    let out = t
        .cmd(
            &[
                &base[..],
                &["--queue", "debug=1", "--devices", "cpu", "--dry-run"],
            ]
            .concat(),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let scripts = String::from_utf8_lossy(&out.stdout);
    assert!(scripts.contains("--devices cpu"), "{scripts}");
    assert!(
        !scripts.contains("[scheduler.slurm]") && !scripts.contains("[scheduler.ssh]"),
        "only the chosen backend's settings: {scripts}"
    );
}
