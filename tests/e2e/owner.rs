//! One host owns a run (issue 22, item 1) and every other host sees it through files; the live
//! view per host and stalled jobs (item 6). Another login node is a process in its own UTS
//! namespace (`unshare -u`, as root) with another hostname: to embedfleet, another host.

use crate::util::{assert_same_tree, tree, wait_until, TestDir};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `embedfleet ARGS` as host `hostname` would run it; `None` where namespaces are not allowed.
fn on_host(t: &TestDir, hostname: &str, args: &[&str]) -> Option<Output> {
    let out = Command::new("unshare")
        .args([
            "-u",
            "sh",
            "-c",
            &format!("hostname {hostname} && exec \"$0\" \"$@\""),
        ])
        .arg(env!("CARGO_BIN_EXE_embedfleet"))
        .args(args)
        .current_dir(t.path())
        .env_remove("EMBEDFLEET_LOG")
        .output()
        .expect("unshare runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("unshare failed") {
        return None;
    }
    Some(out)
}

fn namespaces_allowed(t: &TestDir, test: &str) -> bool {
    let ok = on_host(t, "probe", &["--version"]).is_some_and(|o| o.status.success());
    if !ok {
        // CI runs as root; so does the one-node Slurm this suite needs.
        if std::env::var("EMBEDFLEET_REQUIRE_SLURM").as_deref() == Ok("1") {
            panic!("{test}: `unshare -u` is refused (not root?), but EMBEDFLEET_REQUIRE_SLURM=1");
        }
        eprintln!("skipping {test}: `unshare -u` needs root");
    }
    ok
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn submit_args<'a>(backend: &'a str, queue: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "submit",
        "--run-dir",
        "run",
        "--backend",
        backend,
        "--queue",
        queue,
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--shard-papers",
        "4",
        "--poll-interval",
        "0.3",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_second_login_node_is_refused_reads_the_snapshot_and_takes_over_only_when_the_owner_is_silent()
{
    let t = TestDir::new();
    if !namespaces_allowed(&t, "owner_second_login_node") {
        return;
    }
    let slurm = crate::util::slurm_up("owner_second_login_node");
    let (backend, queue) = if slurm {
        ("slurm", "debug=2")
    } else {
        ("local", "local=2")
    };
    t.plan_with_model(24, 8);
    t.run(&submit_args(backend, queue, &[]), 0);
    let me = this_host();
    let owner: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.join("run/owner.json")).unwrap()).unwrap();
    assert_eq!(owner["host"]["hostname"], me.as_str());
    assert_eq!(owner["how"], "created");

    let before = tree(&t.join("run"));
    for file in ["run.db", "owner.json", "status-snapshot.json"] {
        assert!(before.contains_key(Path::new(file)), "{file}");
    }
    // Every command that would open run.db refuses on login-2, saying where the owner is.
    for args in [
        vec!["pause", "--run-dir", "run"],
        vec!["resume", "--run-dir", "run"],
        vec!["queues", "set", "--run-dir", "run", "debug=5"],
        vec!["queues", "--run-dir", "run"],
        submit_args(backend, queue, &[]),
        vec!["report", "--run-dir", "run"],
        vec!["upload", "--run-dir", "run"],
        vec!["plan", "--corpus", "c.jsonl.gz", "--run-dir", "run"],
    ] {
        let out = on_host(&t, "login-2", &args).unwrap();
        let said = text(&out);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {said}");
        assert!(
            said.contains(&format!("belongs to host {me}")) && said.contains("take-over"),
            "{args:?}: {said}"
        );
    }
    // `status` there reads the owner's snapshot: the whole run, without run.db.
    let out = on_host(&t, "login-2", &["status", "--run-dir", "run"]).unwrap();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains(&format!("owner, host {me}")), "{said}");
    assert!(said.contains("batches    3 (done 3)"), "{said}");
    assert!(said.contains("loop       ended"), "{said}");
    let out = on_host(&t, "login-2", &["status", "--run-dir", "run", "--json"]).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["snapshot"]["host"], me.as_str());
    assert_eq!(json["batches_by_state"]["done"], 3);
    assert_eq!(json["rows_in_shards"], 24);
    // Nothing in the run directory changed: run.db, its WAL, the owner's files, the rest.
    assert_same_tree(&before, &t.join("run"));

    // take-over is refused while the owner is fresh, and works once it has been silent.
    let out = on_host(&t, "login-2", &["take-over", "--run-dir", "run"]).unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("still owned by host"), "{}", text(&out));
    std::thread::sleep(Duration::from_millis(2100));
    let out = on_host(
        &t,
        "login-2",
        &["take-over", "--run-dir", "run", "--stale-after", "2"],
    )
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("now belongs to login-2"),
        "{}",
        text(&out)
    );
    // Now this host is the other one: refused, and pointed at login-2.
    let out = t.run(&["pause", "--run-dir", "run"], 4);
    assert!(
        text(&out).contains("belongs to host login-2"),
        "{}",
        text(&out)
    );
    let out = on_host(&t, "login-2", &["status", "--run-dir", "run", "--json"]).unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // And back: login-2 never opened run.db, so its silence is already long enough.
    std::thread::sleep(Duration::from_millis(1100));
    t.run(&["take-over", "--run-dir", "run", "--stale-after", "1"], 0);
    t.run(&["pause", "--run-dir", "run"], 0);
    let status = t.status("run");
    assert_eq!(status["paused"], true);
    assert_eq!(status["batches_by_state"]["done"], 3);
}

fn spawn(t: &TestDir, args: &[&str]) -> Child {
    t.cmd(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("submit starts")
}

fn stderr_of(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn one_loop_per_run_and_a_killed_loop_is_reported_when_started_again() {
    let t = TestDir::new();
    t.plan_with_model(60, 3);
    let config = notify_config(&t);
    let mut args = submit_args("local", "local=1", &[]);
    args.extend(["--config", config.as_str()]);
    let mut first = spawn(&t, &args);
    wait_until("the loop has polled", 60, || {
        t.join("run/status-snapshot.json").exists()
    });
    let out = t.run(&args, 4);
    assert!(
        text(&out).contains("is already running for"),
        "{}",
        text(&out)
    );
    let out = t.run(&["status", "--run-dir", "run"], 0);
    assert!(
        text(&out).contains("loop       polling every"),
        "{}",
        text(&out)
    );
    first.kill().unwrap();
    first.wait().unwrap();
    let pid = first.id();
    // Started again as after a reboot, without the scheduler options: the run keeps them.
    let again = [
        "submit",
        "--run-dir",
        "run",
        "--model-dir",
        "model",
        "--shard-papers",
        "4",
        "--poll-interval",
        "0.3",
    ];
    let out = t.run(&again, 0);
    let said = text(&out);
    assert!(
        said.contains(&format!(
            "restart: the previous submit loop (pid {pid}) stopped without ending"
        )),
        "{said}"
    );
    let events = events(&t);
    let restarted = events
        .iter()
        .find(|e| e["EMBEDFLEET_EVENT"] == "owner_restarted")
        .unwrap_or_else(|| panic!("no owner_restarted event: {events:?}"));
    assert_eq!(restarted["EMBEDFLEET_HOST"], this_host());
    assert!(restarted["EMBEDFLEET_REASON"].contains(&format!("pid {pid}")));
    assert!(
        events.iter().any(|e| e["EMBEDFLEET_EVENT"] == "finished"),
        "{events:?}"
    );
    assert_eq!(t.status("run")["batches_by_state"]["done"], 20);
    let out = t.run(&["status", "--run-dir", "run"], 0);
    assert!(text(&out).contains("loop       ended"), "{}", text(&out));
}

/// A run config whose notify hook appends each event's variables to `events.txt`, one
/// event a block; returns its path.
fn notify_config(t: &TestDir) -> String {
    let events = std::path::absolute(t.join("events.txt")).unwrap();
    let config = format!(
        "[scheduler]\nbackend = \"local\"\n[notify]\ncommand = \"(env | grep ^EMBEDFLEET_ | sort; echo --) >> {}\"\n",
        events.display()
    );
    std::fs::write(t.join("run.toml"), config).unwrap();
    "run.toml".into()
}

/// The events the notify hook of [`notify_config`] received, each as its variables.
fn events(t: &TestDir) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(t.join("events.txt")).unwrap_or_default();
    text.split("--\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            block
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// Pids of the embed jobs of the run in `run_dir`.
fn embed_jobs(run_dir: &Path) -> Vec<i32> {
    let run_dir = run_dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<String> = c
                    .split(|&b| b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                args.iter().any(|a| a == "embed-job")
                    && args.iter().any(|a| a.contains(run_dir.as_str()))
            })
        })
        .collect()
}

fn live(t: &TestDir) -> Vec<serde_json::Value> {
    t.status("run")["live"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits for the loop to end (killing it after `timeout_s`), and returns what it said.
fn loop_said(mut child: Child, timeout_s: u64) -> String {
    let end = Instant::now() + Duration::from_secs(timeout_s);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            child.kill().unwrap();
            panic!(
                "the loop did not end in {timeout_s} s: {}",
                stderr_of(child)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stderr_of(child)
}

/// Whether an attempt that has not finished lists a shard in its manifest.
fn running_attempt_has_a_shard(run_dir: &Path) -> bool {
    let Ok(batches) = std::fs::read_dir(run_dir.join("results")) else {
        return false;
    };
    batches
        .filter_map(|b| std::fs::read_dir(b.ok()?.path()).ok())
        .flatten()
        .filter_map(|m| {
            let path = m.ok()?.path();
            (path.extension()? == "json").then_some(path)
        })
        .filter_map(|p| serde_json::from_slice::<serde_json::Value>(&std::fs::read(p).ok()?).ok())
        .any(|m| {
            m["finished_unix_s"].is_null() && m["shards"].as_array().is_some_and(|s| !s.is_empty())
        })
}

/// Starts the loop of a fresh run of two batches of 12 papers, a shard per paper, and stops
/// (SIGSTOP) its first embed job once it has written a shard: a job hung mid-batch, with a
/// shard time of its own. Returns the loop and the stopped pid.
fn hang_a_job(t: &TestDir, extra: &[&str]) -> (Child, i32) {
    t.plan_with_model(24, 12);
    let run_dir = std::path::absolute(t.join("run")).unwrap();
    let mut args = submit_args("local", "local=1", extra);
    // A shard per paper: a job's shards come every few hundred milliseconds.
    let at = args.iter().position(|a| *a == "--shard-papers").unwrap();
    args[at + 1] = "1";
    let child = spawn(t, &args);
    let mut pid = None;
    wait_until("an embed job has written a shard", 120, || {
        let jobs = embed_jobs(&run_dir);
        pid = jobs
            .first()
            .copied()
            .filter(|_| running_attempt_has_a_shard(&run_dir));
        pid.is_some()
    });
    let pid = pid.unwrap();
    // SAFETY: stops the test's own embed-job process, found by its command line.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    (child, pid)
}

#[test]
fn a_hung_job_is_shown_stalled_per_host_and_cancelled_only_when_asked() {
    // Stalled after 2 of its shard times, and 4 s at least (the model load before a job's
    // first shard gets 3 x 4 s: a busy CI machine loads even the tiny model slowly).
    let stall = ["--stalled-min", "4", "--stalled-after-shards", "2"];

    // Without --kill-stalled: shown and said, never cancelled.
    let t = TestDir::new();
    let config = notify_config(&t);
    let mut extra = stall.to_vec();
    extra.extend(["--config", config.as_str()]);
    let (loop1, pid) = hang_a_job(&t, &extra);
    let run_dir = std::path::absolute(t.join("run")).unwrap();
    let mut stalled = serde_json::Value::Null;
    wait_until("status shows the job stalled", 60, || {
        stalled = live(&t)
            .into_iter()
            .find(|a| a["stalled"] == true)
            .unwrap_or_default();
        !stalled.is_null()
    });
    assert_eq!(stalled["host"], this_host().as_str());
    assert_eq!(stalled["has_shard"], true);
    assert!(stalled["shards_done"].as_u64().unwrap() >= 1);
    let out = t.run(&["status", "--run-dir", "run"], 0);
    assert!(text(&out).contains("STALLED"), "{}", text(&out));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        embed_jobs(&run_dir),
        vec![pid],
        "a stalled job is not killed unasked"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let said = loop_said(loop1, 240);
    assert!(said.contains("is stalled: nothing written for"), "{said}");
    assert!(said.contains("--kill-stalled"), "{said}");
    assert_eq!(t.status("run")["batches_by_state"]["done"], 2);
    let events = events(&t);
    // (Only the hung job's events: on a loaded machine another job's slow start may count too.)
    let stalled_events: Vec<_> = events
        .iter()
        .filter(|e| {
            e["EMBEDFLEET_EVENT"] == "job_stalled"
                && e["EMBEDFLEET_JOB"] == stalled["job"].as_str().unwrap()
        })
        .collect();
    assert_eq!(stalled_events.len(), 1, "said once: {events:?}");
    assert_eq!(stalled_events[0]["EMBEDFLEET_HOST"], this_host());
    assert!(stalled_events[0]["EMBEDFLEET_REASON"].contains("no shard for"));

    // With --kill-stalled: the hung job is cancelled and its batch retried.
    let t = TestDir::new();
    let mut extra = stall.to_vec();
    extra.push("--kill-stalled");
    let (loop2, _) = hang_a_job(&t, &extra);
    let said = loop_said(loop2, 240);
    assert!(said.contains("cancelled stalled job"), "{said}");
    let status = t.status("run");
    assert_eq!(status["batches_by_state"]["done"], 2, "{said}");
    assert_eq!(status["rows_in_shards"], 24);
}

/// Makes the run's heartbeat file a non-empty directory: every beat fails (as a full quota or
/// a stale handle would make it, even for root) until it is removed.
fn block_heartbeat(run: &Path) -> std::path::PathBuf {
    let beat = run.join("owner-heartbeat.json");
    let _ = std::fs::remove_file(&beat);
    std::fs::create_dir(&beat).unwrap();
    std::fs::write(beat.join("x"), b"").unwrap();
    beat
}

#[test]
fn take_over_is_refused_while_an_upload_that_lost_its_heartbeat_for_a_while_still_runs() {
    let t = TestDir::new();
    if !namespaces_allowed(&t, "take_over_is_refused_while_an_upload_...") {
        return;
    }
    t.small_run("run", 40, 10, &[]);
    let run = t.join("run");
    // An upload into a second collection, slowed to take a while (20 requests of 2 points,
    // 300 ms each), its heartbeat every 0.3 s (so its grace is 0.7 s).
    let upload = |collection: &str| {
        t.cmd(&[
            "upload",
            "--run-dir",
            "run",
            "--collection",
            collection,
            "--batch-size",
            "2",
            "--in-flight",
            "1",
        ])
        .env(embedfleet_vectordb::TEST_DELAY_ENV, "300")
        .env("EMBEDFLEET_HEARTBEAT_INTERVAL_S", "0.3")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let mut first = upload("second");
    std::thread::sleep(Duration::from_millis(1500));
    // Its heartbeat cannot be written for a moment (shorter than the grace), then can again.
    let beat = block_heartbeat(&run);
    std::thread::sleep(Duration::from_millis(400));
    std::fs::remove_dir_all(&beat).unwrap();
    // The heartbeat thread did not die: the heartbeat is fresh again...
    wait_until("a fresh heartbeat", 10, || {
        std::fs::read(&beat)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["unix_s"].as_f64())
            .is_some_and(|s| embedfleet_core::owner::unix_now() - s < 1.0)
    });
    // ... so another host is refused, though more than --stale-after passed since the gap.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(first.try_wait().unwrap().is_none(), "the upload still runs");
    let out = on_host(
        &t,
        "login-2",
        &["take-over", "--run-dir", "run", "--stale-after", "1"],
    )
    .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("still owned by host"), "{}", text(&out));
    let status = first.wait().unwrap();
    assert!(status.success(), "the upload finished its work");

    // A heartbeat that stays unwritable past the grace: the upload stops writing run.db and
    // says why, instead of writing on while another host could take the run.
    let mut second = upload("third");
    std::thread::sleep(Duration::from_millis(1500));
    let beat = block_heartbeat(&run);
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < end,
            "the upload went on without a heartbeat"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    std::fs::remove_dir_all(&beat).unwrap();
    let mut said = String::new();
    std::io::Read::read_to_string(second.stderr.as_mut().unwrap(), &mut said).unwrap();
    assert!(!status.success());
    assert!(said.contains("has not written its heartbeat"), "{said}");
    // Run again with its heartbeat back, it finishes exactly.
    t.run(&["upload", "--run-dir", "run", "--collection", "third"], 0);
    let st = t.status("run");
    let collections = st["uploads_by_collection"].as_object().unwrap();
    let third = collections
        .iter()
        .find(|(k, _)| k.starts_with("third@"))
        .unwrap()
        .1;
    assert_eq!(third["acked"], 40, "{st}");
    assert_eq!(third["missing"], 0, "{st}");
}
