//! Scheduler commands that are missing, fail, hang or answer oddly, through fake `sbatch`,
//! `squeue`, `sacct` and `qstat` scripts. No scheduler needed.

use std::path::{Path, PathBuf};

use embedfleet_orchestrator::scheduler::{
    CommandConfig, JobHandle, JobScript, JobState, JobSubmission, PbsConfig, PbsFlavor,
    PbsScheduler, ProgramConfig, SacctMode, Scheduler, SchedulerError, SchedulerJobId, SlurmConfig,
    SlurmScheduler,
};

/// A fast policy: 0.5 s timeout, 2 retries, tiny backoff.
fn policy() -> CommandConfig {
    CommandConfig {
        timeout_secs: 0.5,
        retries: 2,
        backoff_initial_secs: 0.01,
        backoff_max_secs: 0.05,
    }
}

/// Writes an executable fake command that appends a line to `<dir>/<name>.calls` on every call.
fn fake(dir: &Path, name: &str, body: &str) -> ProgramConfig {
    let path = dir.join(name);
    let calls = dir.join(format!("{name}.calls"));
    std::fs::write(
        &path,
        format!("#!/bin/bash\necho \"$*\" >> {}\n{body}\n", calls.display()),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&path)
        .status()
        .unwrap();
    ProgramConfig {
        path: Some(path),
        extra_args: vec![],
    }
}

fn calls(dir: &Path, name: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(format!("{name}.calls")))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn missing(name: &str) -> ProgramConfig {
    ProgramConfig {
        path: Some(PathBuf::from(format!("/nonexistent/bin/{name}"))),
        extra_args: vec![],
    }
}

fn slurm(cfg: SlurmConfig) -> SlurmScheduler {
    SlurmScheduler::new(cfg, policy())
}

fn job() -> JobSubmission {
    JobSubmission::new(
        "embed-b1",
        "debug",
        JobScript::Text("#!/bin/bash\ntrue\n".into()),
    )
}

fn handle(id: &str) -> JobHandle {
    JobHandle::new(SchedulerJobId::new(id))
}

#[test]
fn missing_scheduler_binaries_are_clear_errors() {
    let s = slurm(SlurmConfig {
        sbatch: missing("sbatch"),
        squeue: missing("squeue"),
        scancel: missing("scancel"),
        ..SlurmConfig::default()
    });
    for err in [
        s.submit(&job()).unwrap_err(),
        s.poll(&[handle("1")]).unwrap_err(),
        s.cancel(&handle("1")).unwrap_err(),
    ] {
        assert!(
            matches!(err, SchedulerError::CommandNotFound { .. }),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("/nonexistent/bin/") && msg.contains("path"),
            "{msg}"
        );
    }
    let p = PbsScheduler::new(
        PbsConfig {
            qstat: missing("qstat"),
            ..PbsConfig::default()
        },
        policy(),
    );
    assert!(matches!(
        p.poll(&[handle("1.s")]),
        Err(SchedulerError::CommandNotFound { .. })
    ));
}

#[test]
fn hanging_squeue_times_out_is_retried_and_is_never_a_job_state() {
    let dir = tempfile::tempdir().unwrap();
    let s = slurm(SlurmConfig {
        squeue: fake(dir.path(), "squeue", "echo 'slow' >&2; sleep 30"),
        ..SlurmConfig::default()
    });
    let err = s.poll(&[handle("5")]).unwrap_err();
    let SchedulerError::CommandTimedOut {
        attempts,
        ref command,
        ref stderr_tail,
        ..
    } = err
    else {
        panic!("expected a timeout, got {err}");
    };
    assert_eq!(attempts, 3);
    assert!(
        command.contains("squeue") && command.contains("-j 5"),
        "{command}"
    );
    assert_eq!(stderr_tail.trim(), "slow");
    assert_eq!(
        calls(dir.path(), "squeue").len(),
        3,
        "one call plus two retries"
    );
    assert!(err.is_transient());
}

#[test]
fn failing_squeue_is_an_error_not_a_finished_job() {
    let dir = tempfile::tempdir().unwrap();
    let body = "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1";
    let s = slurm(SlurmConfig {
        squeue: fake(dir.path(), "squeue", body),
        ..SlurmConfig::default()
    });
    let err = s.poll(&[handle("5")]).unwrap_err();
    assert!(
        matches!(err, SchedulerError::CommandFailed { attempts: 3, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("Unable to contact slurm controller"),
        "{err}"
    );
}

#[test]
fn flaky_squeue_succeeds_on_retry() {
    let dir = tempfile::tempdir().unwrap();
    let calls_file = dir.path().join("squeue.calls");
    let body = format!(
        "if [ $(wc -l < {}) -lt 2 ]; then echo 'Socket timed out' >&2; exit 1; fi\necho '5|RUNNING|debug|None|embed-b1'",
        calls_file.display()
    );
    let s = slurm(SlurmConfig {
        squeue: fake(dir.path(), "squeue", &body),
        ..SlurmConfig::default()
    });
    let states = s.poll(&[handle("5")]).unwrap();
    assert_eq!(states[&SchedulerJobId::new("5")], JobState::Running);
    assert_eq!(calls(dir.path(), "squeue").len(), 2);
}

#[test]
fn hanging_sbatch_is_not_resubmitted() {
    let dir = tempfile::tempdir().unwrap();
    let s = slurm(SlurmConfig {
        sbatch: fake(dir.path(), "sbatch", "sleep 30"),
        ..SlurmConfig::default()
    });
    let err = s.submit(&job()).unwrap_err();
    assert!(
        matches!(err, SchedulerError::SubmitUncertain { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("embed-b1"), "{err}");
    assert_eq!(
        calls(dir.path(), "sbatch").len(),
        1,
        "a timed-out sbatch may have queued the job"
    );
}

#[test]
fn unknown_partition_is_a_clear_error_without_retries() {
    let dir = tempfile::tempdir().unwrap();
    let body = "echo 'sbatch: error: invalid partition specified: nosuch' >&2\necho 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2; exit 1";
    let s = slurm(SlurmConfig {
        sbatch: fake(dir.path(), "sbatch", body),
        ..SlurmConfig::default()
    });
    let err = s.submit(&job()).unwrap_err();
    assert!(matches!(err, SchedulerError::InvalidJob { .. }), "{err}");
    assert!(
        err.to_string().contains("queue `debug` does not exist"),
        "{err}"
    );
    assert_eq!(calls(dir.path(), "sbatch").len(), 1);
}

#[test]
fn sbatch_arguments_and_script_on_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let stdin_copy = dir.path().join("stdin");
    let body = format!("cat > {}; echo '77;cluster1'", stdin_copy.display());
    let mut sbatch = fake(dir.path(), "sbatch", &body);
    sbatch.extra_args = vec!["--qos=debug".into()];
    let s = slurm(SlurmConfig {
        sbatch,
        ..SlurmConfig::default()
    });
    let j = job().workdir("/tmp").log("/tmp/x.log");
    assert_eq!(s.submit(&j).unwrap(), SchedulerJobId::new("77"));
    assert_eq!(
        calls(dir.path(), "sbatch"),
        vec!["--qos=debug --parsable --job-name=embed-b1 --partition=debug --chdir=/tmp --output=/tmp/x.log"]
    );
    assert_eq!(
        std::fs::read_to_string(stdin_copy).unwrap(),
        "#!/bin/bash\ntrue\n"
    );
}

#[test]
fn garbage_from_sbatch_is_unexpected_output() {
    let dir = tempfile::tempdir().unwrap();
    let s = slurm(SlurmConfig {
        sbatch: fake(dir.path(), "sbatch", "echo 'Submitted batch job 5'"),
        ..SlurmConfig::default()
    });
    assert!(matches!(
        s.submit(&job()),
        Err(SchedulerError::UnexpectedOutput { .. })
    ));
}

/// squeue knows job 5 (running) and 6 (failed, no exit code); sacct is disabled; scontrol gives
/// 6's exit code; 7 is forgotten but left a marker; 8 is forgotten without one.
#[test]
fn final_states_fall_back_from_sacct_to_scontrol_to_markers() {
    let dir = tempfile::tempdir().unwrap();
    let squeue = fake(
        dir.path(),
        "squeue",
        "echo '5|RUNNING|debug|None|a'; echo '6|FAILED|gpu|NonZeroExitCode|b'",
    );
    let sacct = fake(
        dir.path(),
        "sacct",
        "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1",
    );
    let scontrol = fake(dir.path(), "scontrol", "echo 'JobId=6 JobName=b JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 Partition=gpu'");
    let s = slurm(SlurmConfig {
        squeue,
        sacct,
        scontrol,
        ..SlurmConfig::default()
    });
    let marker = dir.path().join("m7");
    std::fs::write(&marker, "0\n").unwrap();
    let jobs = [
        handle("5"),
        handle("6"),
        handle("7").with_marker(&marker),
        handle("8").with_marker(dir.path().join("m8")),
    ];
    for round in 0..2 {
        let st = s.poll(&jobs).unwrap();
        assert_eq!(st[&SchedulerJobId::new("5")], JobState::Running);
        assert_eq!(
            st[&SchedulerJobId::new("6")],
            JobState::Failed {
                exit_code: Some(3),
                reason: "exit code 3".into()
            }
        );
        assert_eq!(
            st[&SchedulerJobId::new("7")],
            JobState::Completed,
            "round {round}"
        );
        assert_eq!(st[&SchedulerJobId::new("8")], JobState::Unknown);
    }
    // "accounting disabled" is permanent: asked once, neither retried nor asked again.
    assert_eq!(calls(dir.path(), "sacct").len(), 1);
}

#[test]
fn sacct_exit_codes_and_states_outrank_squeue_for_finished_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let squeue = fake(
        dir.path(),
        "squeue",
        "echo '6|FAILED|gpu|NonZeroExitCode|b'",
    );
    let sacct = fake(
        dir.path(),
        "sacct",
        "echo '6|FAILED|2:0|None'; echo '9|TIMEOUT|0:15|None'",
    );
    let scontrol = fake(dir.path(), "scontrol", "exit 1");
    let s = slurm(SlurmConfig {
        squeue,
        sacct,
        scontrol,
        ..SlurmConfig::default()
    });
    let st = s.poll(&[handle("6"), handle("9")]).unwrap();
    assert_eq!(
        st[&SchedulerJobId::new("6")],
        JobState::Failed {
            exit_code: Some(2),
            reason: "exit code 2".into()
        }
    );
    assert_eq!(st[&SchedulerJobId::new("9")], JobState::Timeout);
    assert!(calls(dir.path(), "scontrol").is_empty());
    assert_eq!(
        calls(dir.path(), "sacct"),
        vec!["-n -X -P -o JobID,State,ExitCode,Reason -j 6,9"]
    );
}

#[test]
fn sacct_never_mode_and_hanging_sacct_fall_back() {
    let dir = tempfile::tempdir().unwrap();
    let squeue = fake(dir.path(), "squeue", "exit 0");
    let sacct = fake(dir.path(), "sacct", "sleep 30");
    let marker = dir.path().join("m");
    std::fs::write(&marker, "0\n").unwrap();
    let never = slurm(SlurmConfig {
        squeue: squeue.clone(),
        sacct: sacct.clone(),
        use_sacct: SacctMode::Never,
        ..SlurmConfig::default()
    });
    let st = never.poll(&[handle("3").with_marker(&marker)]).unwrap();
    assert_eq!(st[&SchedulerJobId::new("3")], JobState::Completed);
    assert!(calls(dir.path(), "sacct").is_empty());
    // A hanging sacct is retried, then the marker decides; squeue worked, so polling works.
    let auto = slurm(SlurmConfig {
        squeue,
        sacct,
        ..SlurmConfig::default()
    });
    let st = auto
        .poll(&[handle("3").with_marker(&marker), handle("4")])
        .unwrap();
    assert_eq!(st[&SchedulerJobId::new("3")], JobState::Completed);
    assert_eq!(st[&SchedulerJobId::new("4")], JobState::Unknown);
    assert_eq!(calls(dir.path(), "sacct").len(), 3);
}

#[test]
fn pbs_pro_poll_reads_json_and_treats_unknown_ids_as_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let json = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/scheduler/pbspro_qstat_xf.json");
    let body = format!("cat {}; echo 'qstat: Unknown Job Id 42.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov' >&2; exit 153", json.display());
    let p = PbsScheduler::new(
        PbsConfig {
            qstat: fake(dir.path(), "qstat", &body),
            ..PbsConfig::default()
        },
        policy(),
    );
    let ids = [
        "2871001.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
        "2871004.polaris-pbs-01",
        "42.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
    ];
    let st = p.poll(&ids.map(handle)).unwrap();
    assert_eq!(st[&SchedulerJobId::new(ids[0])], JobState::Running);
    assert_eq!(
        st[&SchedulerJobId::new(ids[1])],
        JobState::Timeout,
        "short server name matches"
    );
    assert_eq!(st[&SchedulerJobId::new(ids[2])], JobState::Unknown);
    assert_eq!(
        calls(dir.path(), "qstat")[0],
        format!("-x -f -F json {}", ids.join(" "))
    );
}

#[test]
fn pbs_pro_invalid_json_falls_back_to_text() {
    let dir = tempfile::tempdir().unwrap();
    let txt = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/scheduler/pbspro_qstat_xf.txt");
    let body = format!(
        "if [[ \"$*\" == *json* ]]; then echo '{{\"Jobs\":{{\"x\":\"\\q\"}}}}'; else cat {}; fi",
        txt.display()
    );
    let p = PbsScheduler::new(
        PbsConfig {
            qstat: fake(dir.path(), "qstat", &body),
            ..PbsConfig::default()
        },
        policy(),
    );
    let id = "2871003.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov";
    assert_eq!(
        p.poll(&[handle(id)]).unwrap()[&SchedulerJobId::new(id)],
        JobState::Completed
    );
    assert_eq!(calls(dir.path(), "qstat").len(), 2);
}

#[test]
fn hanging_qstat_and_failing_qsub() {
    let dir = tempfile::tempdir().unwrap();
    let qsub = fake(
        dir.path(),
        "qsub",
        "echo 'qsub: Unknown queue' >&2; exit 170",
    );
    let p = PbsScheduler::new(
        PbsConfig {
            qstat: fake(dir.path(), "qstat", "sleep 30"),
            qsub,
            flavor: PbsFlavor::Torque,
            ..PbsConfig::default()
        },
        policy(),
    );
    assert!(matches!(
        p.poll(&[handle("1")]),
        Err(SchedulerError::CommandTimedOut { attempts: 3, .. })
    ));
    let err = p.submit(&job().workdir(dir.path())).unwrap_err();
    assert!(
        matches!(err, SchedulerError::InvalidJob { .. })
            && err.to_string().contains("queue `debug`"),
        "{err}"
    );
    assert_eq!(calls(dir.path(), "qsub").len(), 1);
}

#[test]
fn lagging_sacct_does_not_override_a_final_squeue_state() {
    let dir = tempfile::tempdir().unwrap();
    // slurmctld says FAILED; slurmdbd has not caught up (RUNNING, FAILED without exit code).
    let squeue = fake(
        dir.path(),
        "squeue",
        "echo '6|FAILED|gpu|NonZeroExitCode|b'; echo '7|FAILED|gpu|NonZeroExitCode|c'",
    );
    let sacct = fake(
        dir.path(),
        "sacct",
        "echo '6|RUNNING|0:0|None'; echo '7|FAILED|0:0|None'",
    );
    let scontrol = fake(
        dir.path(),
        "scontrol",
        "echo \"JobId=$4 JobName=x JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0\"",
    );
    let s = slurm(SlurmConfig {
        squeue,
        sacct,
        scontrol,
        ..SlurmConfig::default()
    });
    let st = s.poll(&[handle("6"), handle("7")]).unwrap();
    let failed3 = JobState::Failed {
        exit_code: Some(3),
        reason: "exit code 3".into(),
    };
    assert_eq!(st[&SchedulerJobId::new("6")], failed3);
    assert_eq!(st[&SchedulerJobId::new("7")], failed3);
    assert_eq!(calls(dir.path(), "scontrol").len(), 2);
}
