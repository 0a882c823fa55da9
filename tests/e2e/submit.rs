//! The submit loop end to end: caps held (sampled from run.db, and from `squeue` on Slurm),
//! pause, resume, re-cap, the loop killed and restarted (no double submission), a job killed
//! behind its back (retried), and every batch embedded in the end. Against the local backend
//! always; against the one-node Slurm of `.ci/slurm/start-local-slurm.sh` and its Torque
//! wrappers when they run (required in CI by EMBEDFLEET_REQUIRE_SLURM=1).

use crate::submit_setup::submit_args;
use crate::util::{slurm_up, TestDir};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) const BATCHES: u64 = 8;
pub(crate) const PER_BATCH: u64 = 8;

struct Scenario {
    backend: &'static str,
    /// Queues and caps at the start.
    caps: Vec<(&'static str, u64)>,
    /// The queue raised by one after the resume.
    raise: &'static str,
    lost_after: &'static str,
    /// Run config text, if any.
    config: Option<&'static str>,
}

fn spawn_submit(t: &TestDir, s: &Scenario, with_caps: bool) -> Child {
    let mut args = vec![
        "submit",
        "--run-dir",
        "run",
        "--backend",
        s.backend,
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--shard-papers",
        "4",
        "--poll-interval",
        "0.3",
        "--lost-after",
        s.lost_after,
    ];
    let caps: Vec<String> = s.caps.iter().map(|(q, c)| format!("{q}={c}")).collect();
    if with_caps {
        for c in &caps {
            args.extend(["--queue", c]);
        }
        // What is tested here is every queue kept filled to its cap, one job per batch: the
        // static route. The restart (no options) must keep it from run.db.
        args.extend(["--route", "static"]);
    }
    if let Some(config) = s.config {
        std::fs::write(t.join("run.toml"), config).unwrap();
        args.extend(["--config", "run.toml"]);
    }
    t.cmd(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("submit starts")
}

fn db(t: &TestDir) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(t.join("run/run.db")).unwrap();
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c
}

/// Open jobs per queue, from run.db.
fn active_in_db(t: &TestDir) -> BTreeMap<String, u64> {
    let c = db(t);
    let mut stmt = c
        .prepare(
            "SELECT queue, count(DISTINCT name) FROM jobs
             WHERE state IN ('submitting', 'pending', 'running', 'unknown') GROUP BY queue",
        )
        .unwrap();
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    rows.map(Result::unwrap).collect()
}

/// This run's jobs per partition as `squeue` sees them.
fn active_in_squeue(t: &TestDir) -> BTreeMap<String, u64> {
    let out = Command::new("squeue")
        .args(["-h", "-o", "%P|%j"])
        .output()
        .unwrap();
    let mut by = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((part, name)) = line.trim().split_once('|') else {
            continue;
        };
        if t.join(&format!("run/jobs/{name}.sh")).exists() {
            *by.entry(part.to_string()).or_insert(0) += 1;
        }
    }
    by
}

fn batches_done(t: &TestDir) -> u64 {
    db(t)
        .query_row(
            "SELECT count(*) FROM batches WHERE state = 'done'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// Jobs the scheduler took (the rows of refused submissions stay, keeping their attempt
/// numbers, but have no scheduler id).
pub(crate) fn jobs_submitted(t: &TestDir) -> u64 {
    db(t)
        .query_row(
            "SELECT count(*) FROM jobs WHERE scheduler_id IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

struct Sampler<'a> {
    t: &'a TestDir,
    caps: BTreeMap<String, u64>,
    slurm: bool,
    samples: u64,
}

impl Sampler<'_> {
    /// Checks every queue holds no more than its cap, in run.db and in the scheduler.
    fn check(&mut self) {
        let mut seen = vec![active_in_db(self.t)];
        if self.slurm {
            seen.push(active_in_squeue(self.t));
        }
        for active in seen {
            for (queue, n) in active {
                let cap = self.caps.get(&queue).copied().unwrap_or(0);
                assert!(n <= cap, "queue {queue} holds {n} jobs, cap {cap}");
            }
        }
        self.samples += 1;
    }

    fn wait_until(&mut self, what: &str, timeout_s: u64, mut cond: impl FnMut(&TestDir) -> bool) {
        let end = Instant::now() + Duration::from_secs(timeout_s);
        while !cond(self.t) {
            self.check();
            assert!(Instant::now() < end, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn running_job(t: &TestDir) -> Option<(String, String)> {
    db(t)
        .query_row(
            "SELECT name, scheduler_id FROM jobs WHERE state = 'running' ORDER BY id LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .ok()
}

/// Kills job `id` behind the loop's back; false where the scheduler refused because the job
/// had just ended by itself (the torque `qdel` wrapper then exits non-zero), so the caller
/// picks another running job.
fn kill_behind_its_back(backend: &str, id: &str) -> bool {
    let output = match backend {
        "slurm" => Command::new("scancel").arg(id).output().unwrap(),
        "pbs" => Command::new("qdel").arg(id).output().unwrap(),
        _ => {
            let pid: i32 = id.parse().unwrap();
            // SAFETY: signals the job's own process group, which the test found in run.db.
            return unsafe { libc::kill(-pid, libc::SIGKILL) } == 0;
        }
    };
    if !output.status.success() {
        eprintln!(
            "killing {id} failed (it may have just ended), picking another: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output.status.success()
}

fn scenario(s: Scenario) {
    let t = TestDir::new();
    t.plan_with_model(BATCHES * PER_BATCH, PER_BATCH);
    let mut sampler = Sampler {
        t: &t,
        caps: s.caps.iter().map(|(q, c)| (q.to_string(), *c)).collect(),
        slurm: s.backend != "local",
        samples: 0,
    };
    let mut submit = spawn_submit(&t, &s, true);
    sampler.wait_until("a batch is done", 180, |t| batches_done(t) >= 1);

    // Pause: what runs finishes, nothing new starts.
    t.run(&["pause", "--run-dir", "run"], 0);
    std::thread::sleep(Duration::from_secs(1));
    let before = jobs_submitted(&t);
    sampler.wait_until("paused jobs drain", 180, |t| {
        active_in_db(t).values().sum::<u64>() == 0
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        jobs_submitted(&t),
        before,
        "nothing is submitted while paused"
    );
    assert!(
        batches_done(&t) < BATCHES,
        "pause came too late to test anything"
    );
    assert!(t.status("run")["paused"].as_bool().unwrap());

    // Resume with a higher cap.
    let raised = sampler.caps[s.raise] + 1;
    let cap = format!("{}={raised}", s.raise);
    t.run(&["queues", "set", "--run-dir", "run", &cap], 0);
    sampler.caps.insert(s.raise.to_string(), raised);
    t.run(&["resume", "--run-dir", "run"], 0);

    // Kill the loop while jobs run, restart it (stored caps), and kill one job behind its back.
    sampler.wait_until("a job runs", 120, |t| running_job(t).is_some());
    submit.kill().unwrap();
    submit.wait().unwrap();
    let mut submit = spawn_submit(&t, &s, false);
    let deadline = Instant::now() + Duration::from_secs(180);
    let (name, killed_at) = loop {
        if let Some((name, id)) = running_job(&t) {
            if kill_behind_its_back(s.backend, &id) {
                break (name, std::time::SystemTime::now());
            }
        }
        sampler.check();
        assert!(Instant::now() < deadline, "no running job could be killed");
        std::thread::sleep(Duration::from_millis(100));
    };
    let end = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = submit.try_wait().unwrap() {
            break status;
        }
        sampler.check();
        assert!(Instant::now() < end, "the submit loop did not finish");
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(submit.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "submit failed: {stderr}");
    assert!(
        stderr.contains("adopting"),
        "the restarted loop adopts: {stderr}"
    );

    let st = t.status("run");
    assert_eq!(st["batches_by_state"]["done"], BATCHES, "{st}");
    assert_eq!(st["rows_in_shards"], BATCHES * PER_BATCH, "{st}");
    let c = db(&t);
    let (killed_state, killed_reason): (String, Option<String>) = c
        .query_row(
            "SELECT state, exit_reason FROM jobs WHERE name = ?1",
            [&name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let per_batch: Vec<(i64, u64)> = {
        let mut stmt = c
            .prepare("SELECT batch_id, count(*) FROM jobs GROUP BY batch_id")
            .unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.map(Result::unwrap).collect()
    };
    let batch_of_killed: i64 = c
        .query_row("SELECT batch_id FROM jobs WHERE name = ?1", [&name], |r| {
            r.get(0)
        })
        .unwrap();
    // The scheduler's signal lands a moment after its command returns: a shard written by
    // then was the killed job's own work, finished before the kill could stop it.
    let shard_paths: Vec<String> = {
        let mut stmt = c
            .prepare("SELECT path FROM shards WHERE batch_id = ?1")
            .unwrap();
        let rows = stmt.query_map([batch_of_killed], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    };
    let signal_landed_by = killed_at + Duration::from_secs(2);
    let finished_before_the_kill = !shard_paths.is_empty()
        && shard_paths.iter().all(|p| {
            let written = std::fs::metadata(t.join("run").join(p))
                .and_then(|m| m.modified())
                .unwrap();
            written <= signal_landed_by
        });
    for (batch, n) in per_batch {
        // One job per batch; two for the one killed behind the loop's back, unless that job had
        // already written its batch when the signal came (it may then end `failed` all the same,
        // its result kept and nothing sent again).
        let allowed: &[u64] = if batch != batch_of_killed || killed_state == "completed" {
            &[1]
        } else if finished_before_the_kill {
            &[1, 2]
        } else {
            &[2]
        };
        assert!(
            allowed.contains(&n),
            "batch {batch}: {n} jobs (killed job {name} ended {killed_state}: {killed_reason:?})"
        );
    }
    assert!(
        sampler.samples > 10,
        "the caps were sampled while the loop ran"
    );
}

#[test]
fn submit_local_caps_pause_resume_restart_and_retry() {
    scenario(Scenario {
        backend: "local",
        caps: vec![("local", 2)],
        raise: "local",
        lost_after: "5",
        config: None,
    });
}

#[test]
fn submit_slurm_caps_pause_resume_restart_and_scancel() {
    if !slurm_up("submit_slurm_caps_pause_resume_restart_and_scancel") {
        return;
    }
    scenario(Scenario {
        backend: "slurm",
        caps: vec![("debug", 1), ("gpu", 2)],
        raise: "debug",
        lost_after: "60",
        config: None,
    });
}

#[test]
fn submit_pbs_through_torque_wrappers() {
    if !slurm_up("submit_pbs_through_torque_wrappers") {
        return;
    }
    scenario(Scenario {
        backend: "pbs",
        caps: vec![("debug", 1), ("gpu", 1)],
        raise: "gpu",
        lost_after: "60",
        // slurm-wlm-torque's qstat speaks Torque (no `-x`, no JSON).
        config: Some("[scheduler.pbs]\nflavor = \"torque\"\n"),
    });
}

#[test]
fn submit_multi_node_jobs_take_one_batch_per_node() {
    let t = TestDir::new();
    t.plan_with_model(16, 4);
    // Locally there is no launcher: a job of two "nodes" runs its two batches in turn.
    std::fs::write(t.join("run.toml"), "[scheduler.script]\nnodes = 2\n").unwrap();
    t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--config",
            "run.toml",
            "--queue",
            "local=1",
            "--poll-interval",
            "0.2",
        ],
        0,
    );
    let st = t.status("run");
    assert_eq!(st["batches_by_state"]["done"], 4, "{st}");
    assert_eq!(st["rows_in_shards"], 16, "{st}");
    let c = db(&t);
    let (rows, names): (u64, u64) = c
        .query_row("SELECT count(*), count(DISTINCT name) FROM jobs", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((rows, names), (4, 2), "two jobs of two batches each");
}

#[test]
fn submit_settles_jobs_a_crash_left_unrecorded() {
    let t = TestDir::new();
    t.plan_with_model(8, 4);
    // Batch 1 ran to its end but the loop died before recording the job's id; batch 2's job was
    // recorded but never reached the scheduler.
    t.run(&crate::util::embed_job_args(&[]), 0);
    std::fs::create_dir_all(t.join("run/jobs")).unwrap();
    let marker = t.join("run/jobs/crashed-b1.exit");
    std::fs::write(&marker, "0\n").unwrap();
    let c = db(&t);
    for (batch, name, marker) in [
        (1, "crashed-b1", marker.display().to_string()),
        (
            2,
            "crashed-b2",
            t.join("run/jobs/none.exit").display().to_string(),
        ),
    ] {
        c.execute(
            "INSERT INTO jobs (batch_id, attempt, backend, queue, name, marker, state)
             VALUES (?1, 1, 'local', 'local', ?2, ?3, 'submitting')",
            rusqlite::params![batch, name, marker],
        )
        .unwrap();
    }
    let out = t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--queue",
            "local=2",
            "--poll-interval",
            "0.2",
        ],
        0,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("crashed-b1 ran to its end unrecorded"),
        "{err}"
    );
    let jobs = |batch: i64| -> Vec<(String, String)> {
        let mut stmt = c
            .prepare("SELECT name, state FROM jobs WHERE batch_id = ?1 ORDER BY id")
            .unwrap();
        let rows = stmt
            .query_map([batch], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        rows.map(Result::unwrap).collect()
    };
    assert_eq!(
        jobs(1),
        vec![("crashed-b1".to_string(), "completed".to_string())]
    );
    let b2 = jobs(2);
    assert_eq!(
        b2.len(),
        2,
        "the unsubmitted record stays, as lost, beside one real job: {b2:?}"
    );
    assert_eq!(b2[0], ("crashed-b2".to_string(), "lost".to_string()));
    assert_ne!(b2[1].0, "crashed-b2", "the real job took a new name");
    assert_eq!(b2[1].1, "completed");
    assert_eq!(t.status("run")["batches_by_state"]["done"], 2);
}

#[test]
fn a_lost_job_is_cancelled_through_the_scheduler_before_its_batch_is_sent_again() {
    let test = "a_lost_job_is_cancelled_through_the_scheduler_before_its_batch_is_sent_again";
    if !slurm_up(test) {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(8, 8);
    // An squeue that stops seeing the first job (a slow controller, a job that fell out of
    // squeue's memory) while Slurm still runs it; the first job sleeps before it embeds, the
    // second does not.
    let hidden = t.join("hidden-ids");
    std::fs::write(&hidden, "").unwrap();
    let squeue = t.join("blind-squeue");
    std::fs::write(
        &squeue,
        format!(
            "#!/bin/bash\nsqueue \"$@\" | grep -v -w -F -f {} || true\n",
            hidden.display()
        ),
    )
    .unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(&squeue)
        .status()
        .unwrap();
    let first = t.join("first-job-started");
    std::fs::write(
        t.join("run.toml"),
        format!(
            "[scheduler.slurm]\nsqueue = {{ path = \"{}\" }}\nuse_sacct = \"never\"\n\
             [scheduler.script]\nsetup = [\"if mkdir {} 2>/dev/null; then sleep 300; fi\"]\n",
            squeue.display(),
            first.display()
        ),
    )
    .unwrap();
    let mut args = submit_args("slurm", "model");
    args.extend([
        "--config",
        "run.toml",
        "--devices",
        "cpu",
        "--queue",
        "debug=1",
        "--poll-interval",
        "0.3",
        "--lost-after",
        "2",
        "--max-attempts",
        "2",
    ]);
    let mut submit = t
        .cmd(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Hide the first job from squeue once it runs.
    let deadline = Instant::now() + Duration::from_secs(120);
    let id: String = loop {
        assert!(Instant::now() < deadline, "the first job never started");
        let id = db(&t)
            .query_row(
                "SELECT scheduler_id FROM jobs WHERE scheduler_id IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .ok();
        if let (Some(id), true) = (id, first.exists()) {
            break id;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    std::fs::write(&hidden, format!("{id}\n")).unwrap();
    let status = submit.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(submit.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    // The lost job was cancelled in Slurm, not left to race its replacement.
    let state = Command::new("squeue")
        .args(["-h", "-t", "all", "-j", &id, "-o", "%T"])
        .output()
        .unwrap();
    let state = String::from_utf8_lossy(&state.stdout).trim().to_string();
    assert_eq!(state, "CANCELLED", "job {id}");
    assert_eq!(jobs_submitted(&t), 2);
    let status = t.status("run");
    assert_eq!(status["rows_in_shards"], 8);
    assert_eq!(status["attempts_by_state"]["accepted"], 1, "{status}");
}
