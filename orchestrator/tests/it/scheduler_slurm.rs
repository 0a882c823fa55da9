//! Against a real Slurm (`.ci/slurm/start-local-slurm.sh`: one node, partitions `debug` and
//! `gpu`), and PBS through Slurm's `slurm-wlm-torque` `qsub`/`qstat`/`qdel`.
//!
//! Without a reachable Slurm these tests print why and pass, unless
//! `EMBEDFLEET_REQUIRE_SLURM=1` (CI) makes them fail.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use embedfleet_orchestrator::scheduler::{
    render_job_script, Backend, CommandConfig, JobHandle, JobScript, JobState, JobSubmission,
    PbsConfig, PbsFlavor, PbsScheduler, SacctMode, Scheduler, SchedulerError, SchedulerJobId,
    ScriptConfig, ScriptJob, SlurmConfig, SlurmScheduler,
};

/// Prints a skip note past libtest's output capture, so a skipped test is visible in the log.
fn skip_note(msg: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// True when a Slurm controller answers; otherwise explains, and panics if Slurm is required.
fn slurm_up(test: &str) -> bool {
    let ping = Command::new("scontrol").arg("ping").output();
    let up = matches!(&ping, Ok(o) if String::from_utf8_lossy(&o.stdout).contains("is UP"));
    if up {
        return true;
    }
    let why = match ping {
        Ok(o) => format!(
            "`scontrol ping` said: {}",
            String::from_utf8_lossy(&o.stdout).trim()
        ),
        Err(e) => format!("cannot run scontrol: {e}"),
    };
    if std::env::var("EMBEDFLEET_REQUIRE_SLURM").as_deref() == Ok("1") {
        panic!("{test}: no Slurm reachable ({why}) but EMBEDFLEET_REQUIRE_SLURM=1; start one with .ci/slurm/start-local-slurm.sh");
    }
    skip_note(format_args!("skipping {test}: no Slurm reachable ({why}); start one with .ci/slurm/start-local-slurm.sh (as root)"));
    false
}

fn policy() -> CommandConfig {
    CommandConfig {
        timeout_secs: 30.0,
        retries: 2,
        backoff_initial_secs: 0.2,
        backoff_max_secs: 1.0,
    }
}

fn slurm() -> SlurmScheduler {
    SlurmScheduler::new(SlurmConfig::default(), policy())
}

fn torque() -> PbsScheduler {
    PbsScheduler::new(
        PbsConfig {
            flavor: PbsFlavor::Torque,
            ..PbsConfig::default()
        },
        policy(),
    )
}

/// A run directory with a fake `embedfleet` whose `embed-job` sleeps, records its batch, and
/// exits with the code in `<run_dir>/exit-<batch>` (default 0).
struct Run {
    dir: tempfile::TempDir,
}

impl Run {
    fn new() -> Self {
        // Under /tmp: slurmd runs the job as root on this host, so any local path works.
        let dir = tempfile::Builder::new()
            .prefix("embedfleet-sched-")
            .tempdir()
            .unwrap();
        let fake = dir.path().join("embedfleet");
        std::fs::write(
            &fake,
            "#!/bin/bash\n# fake: embedfleet embed-job --run-dir DIR --batch N\nrun=$3; b=$5\n\
             sleep \"$(cat \"$run/sleep-$b\" 2>/dev/null || echo 2)\"\necho \"batch $b on $(hostname)\" > \"$run/did-$b\"\n\
             exit \"$(cat \"$run/exit-$b\" 2>/dev/null || echo 0)\"\n",
        )
        .unwrap();
        Command::new("chmod").arg("+x").arg(&fake).status().unwrap();
        std::fs::create_dir_all(dir.path().join("logs")).unwrap();
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Renders the backend's built-in template for `batch` and writes it under the run dir.
    fn job(&self, backend: Backend, queue: &str, batch: u64) -> JobSubmission {
        let name = format!("efsched-{}-b{batch}", backend.name());
        let marker = self.path().join(format!("done-{batch}"));
        let sj = ScriptJob {
            job_name: name.clone(),
            queue: queue.to_string(),
            run_dir: self.path().to_path_buf(),
            batches: vec![batch],
            output: self.path().join(format!("logs/{name}.log")),
            error: None,
            marker: Some(marker.clone()),
            embed_args: Vec::new(),
        };
        let cfg = ScriptConfig {
            embedfleet: Some(self.path().join("embedfleet").display().to_string()),
            walltime: Some("00:10:00".into()),
            ..ScriptConfig::default()
        };
        let text = render_job_script(backend, &cfg, &sj).unwrap();
        let script = self.path().join(format!("{name}.sh"));
        std::fs::write(&script, text).unwrap();
        JobSubmission::new(name, queue, JobScript::Path(script))
            .workdir(self.path())
            .marker(marker)
    }

    fn set(&self, what: &str, batch: u64, value: &str) {
        std::fs::write(self.path().join(format!("{what}-{batch}")), value).unwrap();
    }
}

/// Polls all `handles` together until each is terminal; returns, per job, every distinct
/// state seen, in order. The bound only turns a broken backend into a failure, not a hang.
fn follow_all(s: &dyn Scheduler, handles: &[JobHandle]) -> Vec<Vec<JobState>> {
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut seen: Vec<Vec<JobState>> = vec![Vec::new(); handles.len()];
    loop {
        let states = s.poll(handles).unwrap();
        for (h, seen) in handles.iter().zip(seen.iter_mut()) {
            let st = states[&h.id].clone();
            if seen.last() != Some(&st) {
                seen.push(st);
            }
        }
        let done = seen
            .iter()
            .all(|v| v.last().is_some_and(JobState::is_terminal));
        if done || Instant::now() > give_up {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn follow(s: &dyn Scheduler, h: &JobHandle) -> Vec<JobState> {
    follow_all(s, std::slice::from_ref(h)).remove(0)
}

fn wait_running(s: &dyn Scheduler, h: &JobHandle) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while s.poll(std::slice::from_ref(h)).unwrap()[&h.id] != JobState::Running {
        assert!(Instant::now() < give_up, "job {} never ran", h.id);
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn slurm_job_runs_and_completes_in_each_partition() {
    if !slurm_up("slurm_job_runs_and_completes_in_each_partition") {
        return;
    }
    let run = Run::new();
    let s = slurm();
    let jobs: Vec<(JobSubmission, JobHandle)> = [("debug", 1), ("gpu", 2)]
        .into_iter()
        .map(|(q, b)| {
            run.set("sleep", b, "3");
            let j = run.job(Backend::Slurm, q, b);
            let id = s.submit(&j).unwrap();
            let h = j.handle(id);
            (j, h)
        })
        .collect();
    let listed = s.list_jobs().unwrap();
    for (j, h) in &jobs {
        let mine = listed
            .iter()
            .find(|l| l.id == h.id)
            .unwrap_or_else(|| panic!("{} not in {listed:?}", h.id));
        assert_eq!(
            (mine.name.as_str(), mine.queue.as_str()),
            (j.name.as_str(), j.queue.as_str())
        );
        assert!(mine.state.is_active());
    }
    let handles: Vec<JobHandle> = jobs.iter().map(|(_, h)| h.clone()).collect();
    for ((j, _), seen) in jobs.iter().zip(follow_all(&s, &handles)) {
        assert!(seen.contains(&JobState::Running), "{}: {seen:?}", j.queue);
        assert_eq!(
            seen.last(),
            Some(&JobState::Completed),
            "{}: {seen:?}",
            j.queue
        );
        assert!(
            seen[..seen.len() - 1].iter().all(JobState::is_active),
            "{seen:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(run.path().join("done-1")).unwrap(),
        "0\n"
    );
    assert!(std::fs::read_to_string(run.path().join("did-2"))
        .unwrap()
        .starts_with("batch 2 on "));
    let part = Command::new("squeue")
        .args([
            "-h",
            "--states=all",
            "-o",
            "%P",
            "-j",
            jobs[1].1.id.as_str(),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&part.stdout).trim(), "gpu");
}

/// Waits until `squeue` lists no job of anyone's, for at most `limit`.
fn wait_for_an_empty_queue(limit: Duration) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        let out = Command::new("squeue").args(["-h", "-o", "%i"]).output();
        if matches!(&out, Ok(o) if o.status.success() && o.stdout.trim_ascii().is_empty()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn slurm_test_only_estimates_a_job_not_yet_sent_and_queues_nothing() {
    if !slurm_up("slurm_test_only_estimates_a_job_not_yet_sent_and_queues_nothing") {
        return;
    }
    let run = Run::new();
    let s = slurm();
    let job = run.job(Backend::Slurm, "debug", 7);
    // The idle one-node cluster would start it at once. Other tests' jobs (nextest runs them
    // beside this one) make Slurm put it after them: ask when the queue is empty, and again
    // if a job came in between (up to three times).
    let mut asked = Vec::new();
    for _ in 0..3 {
        wait_for_an_empty_queue(Duration::from_secs(120));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = s
            .new_job_start(&job)
            .unwrap()
            .expect("Slurm estimates a job it would queue");
        asked.push((start, now));
        if (start - now).abs() < 120.0 {
            break;
        }
    }
    assert!(
        asked.iter().any(|(start, now)| (start - now).abs() < 120.0),
        "estimates vs now: {asked:?}"
    );
    assert!(
        s.list_jobs().unwrap().iter().all(|j| j.name != job.name),
        "--test-only queues nothing"
    );
    // A partition that does not exist: no estimate, and no error for the loop.
    let nowhere = run.job(Backend::Slurm, "no-such-partition", 8);
    assert_eq!(s.new_job_start(&nowhere).unwrap(), None);
    // `squeue --start` of a job Slurm no longer knows: no estimate, and no error either (the
    // command is `squeue`, as configured: it was once looked up under a wrong name).
    let gone = JobHandle::new(SchedulerJobId::new("999999"));
    assert!(s.start_estimates(&[gone]).unwrap().is_empty());
}

#[test]
fn slurm_failed_job_reports_its_exit_code_with_and_without_sacct() {
    if !slurm_up("slurm_failed_job_reports_its_exit_code_with_and_without_sacct") {
        return;
    }
    let run = Run::new();
    run.set("sleep", 3, "0");
    run.set("exit", 3, "3");
    let s = slurm();
    let j = run.job(Backend::Slurm, "gpu", 3);
    let h = j.handle(s.submit(&j).unwrap());
    let expected = JobState::Failed {
        exit_code: Some(3),
        reason: "exit code 3".into(),
    };
    assert_eq!(follow(&s, &h).last(), Some(&expected));
    // Without sacct the exit code comes from scontrol while Slurm remembers the job.
    let no_sacct = SlurmScheduler::new(
        SlurmConfig {
            use_sacct: SacctMode::Never,
            ..SlurmConfig::default()
        },
        policy(),
    );
    assert_eq!(
        no_sacct.poll(std::slice::from_ref(&h)).unwrap()[&h.id],
        expected
    );
    assert_eq!(
        std::fs::read_to_string(run.path().join("done-3")).unwrap(),
        "3\n"
    );
}

#[test]
fn slurm_cancel_and_scancel_behind_our_back_are_cancelled() {
    if !slurm_up("slurm_cancel_and_scancel_behind_our_back_are_cancelled") {
        return;
    }
    let run = Run::new();
    let s = slurm();
    let mut handles = Vec::new();
    for (q, b) in [("debug", 4), ("gpu", 5)] {
        run.set("sleep", b, "300");
        let j = run.job(Backend::Slurm, q, b);
        handles.push(j.handle(s.submit(&j).unwrap()));
    }
    for h in &handles {
        wait_running(&s, h);
    }
    s.cancel(&handles[0]).unwrap();
    let out = Command::new("scancel")
        .arg(handles[1].id.as_str())
        .output()
        .unwrap();
    assert!(out.status.success());
    for h in &handles {
        assert_eq!(follow(&s, h).last(), Some(&JobState::Cancelled));
        // The fake embed-job was killed in its sleep, before it recorded its batch.
        let batch = if h == &handles[0] { 4 } else { 5 };
        assert!(!run.path().join(format!("did-{batch}")).exists());
    }
    // Cancelling a job that already ended is fine.
    s.cancel(&handles[0]).unwrap();
}

#[test]
fn slurm_unknown_partition_and_forgotten_jobs() {
    if !slurm_up("slurm_unknown_partition_and_forgotten_jobs") {
        return;
    }
    let run = Run::new();
    let s = slurm();
    let err = s
        .submit(&run.job(Backend::Slurm, "nosuchqueue", 6))
        .unwrap_err();
    assert!(matches!(err, SchedulerError::InvalidJob { .. }), "{err}");
    assert!(err.to_string().contains("nosuchqueue"), "{err}");
    // An id no Slurm component knows: Unknown without a marker, the marker's state with one.
    let marker = run.path().join("old-marker");
    std::fs::write(&marker, "0\n").unwrap();
    let ghost = JobHandle::new(embedfleet_orchestrator::scheduler::SchedulerJobId::new(
        "99999999",
    ));
    assert_eq!(
        s.poll(std::slice::from_ref(&ghost)).unwrap()[&ghost.id],
        JobState::Unknown
    );
    let ghost = ghost.with_marker(&marker);
    assert_eq!(
        s.poll(std::slice::from_ref(&ghost)).unwrap()[&ghost.id],
        JobState::Completed
    );
}

#[test]
fn pbs_through_slurm_wlm_torque() {
    if !slurm_up("pbs_through_slurm_wlm_torque") {
        return;
    }
    if Command::new("qsub").arg("--version").output().is_err() {
        if std::env::var("EMBEDFLEET_REQUIRE_SLURM").as_deref() == Ok("1") {
            panic!("qsub missing but EMBEDFLEET_REQUIRE_SLURM=1; install slurm-wlm-torque");
        }
        skip_note(format_args!(
            "skipping pbs_through_slurm_wlm_torque: no qsub (install slurm-wlm-torque)"
        ));
        return;
    }
    let run = Run::new();
    let p = torque();
    run.set("sleep", 7, "3");
    run.set("sleep", 8, "0");
    run.set("exit", 8, "5");
    run.set("sleep", 9, "300");
    let ok = run.job(Backend::Pbs, "gpu", 7);
    let bad = run.job(Backend::Pbs, "debug", 8);
    let long = run.job(Backend::Pbs, "gpu", 9);
    let hs: Vec<JobHandle> = [&ok, &bad, &long]
        .iter()
        .map(|j| j.handle(p.submit(j).unwrap()))
        .collect();
    let listed = p.list_jobs().unwrap();
    assert!(
        listed
            .iter()
            .any(|l| l.id == hs[0].id && l.name == ok.name && l.queue == "gpu"),
        "{listed:?}"
    );
    let seen = follow(&p, &hs[0]);
    assert!(seen.contains(&JobState::Running), "{seen:?}");
    assert_eq!(seen.last(), Some(&JobState::Completed));
    assert_eq!(
        follow(&p, &hs[1]).last(),
        Some(&JobState::Failed {
            exit_code: Some(5),
            reason: "exit code 5".into()
        })
    );
    wait_running(&p, &hs[2]);
    p.cancel(&hs[2]).unwrap();
    assert_eq!(follow(&p, &hs[2]).last(), Some(&JobState::Cancelled));
    // The PBS directives reached Slurm: job name and queue.
    let out = Command::new("squeue")
        .args(["-h", "--states=all", "-o", "%j|%P", "-j", hs[0].id.as_str()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{}|gpu", ok.name)
    );
}
