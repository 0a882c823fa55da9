//! The local backend: real child processes.

use std::path::Path;
use std::time::{Duration, Instant};

use embedfleet_orchestrator::scheduler::{
    Backend, JobHandle, JobScript, JobState, JobSubmission, LocalConfig, LocalScheduler, Scheduler,
    SchedulerError, SchedulerJobId,
};

/// Polls until `id` is terminal; a generous bound only so a broken backend fails instead of
/// hanging the test run.
fn wait_terminal(s: &dyn Scheduler, handle: &JobHandle) -> JobState {
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        let state = s.poll(std::slice::from_ref(handle)).unwrap()[&handle.id].clone();
        if state.is_terminal() || Instant::now() > give_up {
            return state;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(name: &str, script: &str) -> JobSubmission {
    JobSubmission::new(name, "local", JobScript::Text(script.to_string()))
}

fn sched(grace_secs: f64) -> LocalScheduler {
    LocalScheduler::new(LocalConfig {
        grace_secs,
        ..LocalConfig::default()
    })
}

#[test]
fn completed_and_failed_jobs_and_their_logs() {
    let dir = tempfile::tempdir().unwrap();
    let s = sched(5.0);
    assert_eq!(s.backend(), Backend::Local);
    let script = dir.path().join("ok.sh");
    std::fs::write(
        &script,
        "echo out-$EMBEDFLEET_JOB_NAME; echo err >&2; pwd\n",
    )
    .unwrap();
    let ok = JobSubmission::new("ok-job", "debug", JobScript::Path(script))
        .workdir(dir.path())
        .log(dir.path().join("ok.log"));
    let ok_id = s.submit(&ok).unwrap();
    let bad = text("bad-job", "sleep 0.2; exit 3").log(dir.path().join("bad.log"));
    let bad_id = s.submit(&bad).unwrap();
    assert_ne!(ok_id, bad_id);
    assert_eq!(wait_terminal(&s, &ok.handle(ok_id)), JobState::Completed);
    assert_eq!(
        wait_terminal(&s, &bad.handle(bad_id)),
        JobState::Failed {
            exit_code: Some(3),
            reason: "exit code 3".into()
        }
    );
    let log = std::fs::read_to_string(dir.path().join("ok.log")).unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    assert_eq!(log, format!("out-ok-job\nerr\n{}\n", cwd.display()));
}

#[test]
fn running_job_is_running_and_listed() {
    let s = sched(5.0);
    let job = text("sleeper", "sleep 30");
    let id = s.submit(&job).unwrap();
    assert_eq!(
        s.poll(&[job.handle(id.clone())]).unwrap()[&id],
        JobState::Running
    );
    let listed = s.list_jobs().unwrap();
    assert!(
        listed
            .iter()
            .any(|j| j.id == id && j.name == "sleeper" && j.state == JobState::Running),
        "{listed:?}"
    );
    s.cancel(&job.handle(id.clone())).unwrap();
    assert_eq!(wait_terminal(&s, &job.handle(id)), JobState::Cancelled);
}

/// Waits until the job script has created `path`: from then on its process shows its own
/// environment in /proc (just after a spawn returns, the new program may not have set it up
/// yet), which is how another scheduler instance recognises the job.
fn wait_started(path: &Path) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(Instant::now() < give_up, "the job never started");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
fn cancel_kills_the_whole_group_even_when_sigterm_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    // The script and its child both ignore SIGTERM; only the SIGKILL after the grace ends them.
    let script = format!(
        "trap '' TERM; (trap '' TERM; sleep 300) & echo $! > {p}.tmp; mv {p}.tmp {p}; wait",
        p = pidfile.display()
    );
    let s = sched(0.3);
    let job = text("stubborn", &script);
    let id = s.submit(&job).unwrap();
    let give_up = Instant::now() + Duration::from_secs(30);
    while !pidfile.exists() && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(10));
    }
    let grandchild: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(grandchild));
    s.cancel(&job.handle(id.clone())).unwrap();
    assert_eq!(
        wait_terminal(&s, &job.handle(id.clone())),
        JobState::Cancelled
    );
    let give_up = Instant::now() + Duration::from_secs(30);
    while alive(grandchild) && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !alive(grandchild),
        "process {grandchild} of the cancelled job survived"
    );
    // Cancelling again, or a finished job, is fine.
    s.cancel(&job.handle(id)).unwrap();
}

#[test]
fn cancel_after_exit_keeps_the_real_state() {
    let s = sched(1.0);
    let job = text("quick", "exit 0");
    let id = s.submit(&job).unwrap();
    assert_eq!(
        wait_terminal(&s, &job.handle(id.clone())),
        JobState::Completed
    );
    s.cancel(&job.handle(id.clone())).unwrap();
    assert_eq!(
        s.poll(&[job.handle(id.clone())]).unwrap()[&id],
        JobState::Completed
    );
}

#[test]
fn jobs_of_an_earlier_process_are_read_from_markers() {
    let dir = tempfile::tempdir().unwrap();
    let s = sched(1.0);
    let marker = dir.path().join("marker");
    std::fs::write(&marker, "4\n").unwrap();
    // An id this scheduler never started, and a pid that cannot exist.
    let gone = SchedulerJobId::new("999999999");
    let with_marker = JobHandle::new(gone.clone()).with_marker(&marker);
    assert_eq!(
        s.poll(&[with_marker]).unwrap()[&gone],
        JobState::Failed {
            exit_code: Some(4),
            reason: "exit code 4".into()
        }
    );
    let missing = JobHandle::new(gone.clone()).with_marker(dir.path().join("none"));
    assert_eq!(s.poll(&[missing]).unwrap()[&gone], JobState::Unknown);
    assert!(matches!(
        s.cancel(&JobHandle::new(gone)),
        Err(SchedulerError::UnknownJob { .. })
    ));
}

#[test]
fn a_job_started_by_another_scheduler_instance_is_running_until_its_marker_appears() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("m");
    let started = dir.path().join("started");
    let first = sched(1.0);
    let script = format!(
        "touch {s}; sleep 2; echo 0 > {m}.tmp; mv {m}.tmp {m}",
        s = started.display(),
        m = marker.display()
    );
    let job = text("adopted", &script).marker(&marker);
    let id = first.submit(&job).unwrap();
    wait_started(&started);
    // A second instance (a restarted submit loop) has no child handle, only the id and marker.
    let second = sched(1.0);
    assert_eq!(
        second.poll(&[job.handle(id.clone())]).unwrap()[&id],
        JobState::Running
    );
    // ... and finds it by name, as a restarted loop does for a job whose id it never recorded.
    let listed = second.list_jobs().unwrap();
    let found = listed.iter().find(|j| j.name == "adopted");
    assert_eq!(found.map(|j| &j.id), Some(&id), "{listed:?}");
    assert_eq!(
        wait_terminal(&first, &job.handle(id.clone())),
        JobState::Completed
    );
    assert_eq!(
        second.poll(&[job.handle(id.clone())]).unwrap()[&id],
        JobState::Completed
    );
}

/// A process group leader this test starts itself, as a stranger that was given a recorded
/// job's pid would be; `job_name` is the `EMBEDFLEET_JOB_NAME` it carries, if any. Killed
/// when dropped.
struct Stranger(std::process::Child);

impl Stranger {
    fn start(job_name: Option<&str>) -> Self {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("60")
            .process_group(0)
            .env_remove("EMBEDFLEET_JOB_NAME");
        if let Some(name) = job_name {
            cmd.env("EMBEDFLEET_JOB_NAME", name);
        }
        Self(cmd.spawn().unwrap())
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_reused_pid_is_not_taken_for_the_job() {
    let dir = tempfile::tempdir().unwrap();
    // A restarted loop's scheduler, holding a recorded job whose pid now belongs to a stranger:
    // one with no job name, and one that is another job.
    for carried in [None, Some("efab-b000002-a1")] {
        let stranger = Stranger::start(carried);
        let job = text("efab-b000001-a1", "true").marker(dir.path().join("never-written"));
        let recorded = job.handle(SchedulerJobId::new(stranger.pid().to_string()));
        let s = sched(0.1);
        let state = s.poll(std::slice::from_ref(&recorded)).unwrap()[&recorded.id].clone();
        assert_eq!(state, JobState::Unknown, "stranger carrying {carried:?}");
        assert!(
            matches!(s.cancel(&recorded), Err(SchedulerError::UnknownJob { .. })),
            "stranger carrying {carried:?}"
        );
        // Give a signal, had one been sent, the time to land.
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            alive(stranger.pid()),
            "cancel signalled a process group that was not the job ({carried:?})"
        );
    }
}

#[test]
fn cancelling_by_name_ends_the_jobs_of_that_name_only() {
    let dir = tempfile::tempdir().unwrap();
    let started = |job: &str| dir.path().join(job);
    let script = |job: &str| format!("touch {}; sleep 30", started(job).display());
    let first = sched(0.1);
    let twin = text("cancel-by-name-twin", &script("twin"));
    let other = text("cancel-by-name-other", &script("other"));
    let twin_id = first.submit(&twin).unwrap();
    let other_id = first.submit(&other).unwrap();
    wait_started(&started("twin"));
    wait_started(&started("other"));
    // A restarted loop's scheduler, which never learnt the twin's id: it finds it by name.
    let second = sched(0.1);
    second.cancel_named("cancel-by-name-twin").unwrap();
    let ended = wait_terminal(&first, &twin.handle(twin_id));
    assert!(ended.is_terminal(), "{ended:?}");
    let other_handle = other.handle(other_id.clone());
    assert_eq!(
        first.poll(std::slice::from_ref(&other_handle)).unwrap()[&other_id],
        JobState::Running
    );
    first.cancel(&other_handle).unwrap();
}

#[test]
fn invalid_names_and_missing_shell() {
    let s = sched(1.0);
    let err = s.submit(&text("bad name", "true")).unwrap_err();
    assert!(matches!(err, SchedulerError::InvalidJob { .. }), "{err}");
    let s = LocalScheduler::new(LocalConfig {
        shell: "/nonexistent/bash".into(),
        grace_secs: 1.0,
    });
    let err = s.submit(&text("x", "true")).unwrap_err();
    assert!(
        matches!(err, SchedulerError::CommandNotFound { .. }),
        "{err}"
    );
}
