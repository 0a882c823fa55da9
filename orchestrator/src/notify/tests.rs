use super::*;

fn notifier(command: &str, timeout_secs: f64) -> Notifier {
    Notifier::new(&NotifyConfig {
        command: Some(command.into()),
        timeout_secs,
    })
}

fn finished() -> Event {
    Event::Finished {
        batches_done: 1,
        batches_failed: 0,
    }
}

#[test]
fn what_a_hook_leaves_running_in_the_background_ends_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let n = notifier(
        &format!("sleep 300 & echo $! > {}", pid_file.display()),
        10.0,
    );
    n.send(dir.path(), &finished());
    assert!(n.wait(Duration::from_secs(10)));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Killed with its hook (the shell reaps nothing: `sleep` is init's zombie at most).
    let end = Instant::now() + Duration::from_secs(5);
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    while alive(pid) && Instant::now() < end {
        thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(pid), "the hook's background sleep {pid} outlived it");
}

#[test]
fn at_most_four_hooks_run_at_once_and_every_event_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let running = dir.path().join("running");
    std::fs::create_dir(&running).unwrap();
    let counts = dir.path().join("counts");
    let n = notifier(
        &format!(
            "touch {r}/$$; ls {r} | wc -l >> {c}; sleep 0.3; rm {r}/$$",
            r = running.display(),
            c = counts.display()
        ),
        10.0,
    );
    for _ in 0..10 {
        n.send(dir.path(), &finished());
    }
    assert!(n.wait(Duration::from_secs(20)));
    let seen: Vec<usize> = std::fs::read_to_string(&counts)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(seen.len(), 10, "{seen:?}");
    let most = seen.iter().max().copied().unwrap();
    assert!((2..=MAX_HOOKS_RUNNING).contains(&most), "{seen:?}");
}

#[test]
fn the_command_gets_the_event_in_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env.txt");
    let n = notifier(
        &format!("env | grep ^EMBEDFLEET_ | sort > {}", out.display()),
        10.0,
    );
    n.send(
        dir.path(),
        &Event::BatchFailed {
            batch: 7,
            job: "ef1-b000007-a3".into(),
            reason: "exit code 1\nafter 3 attempt(s)".into(),
            log: Some("/r/logs/ef1-b000007-a3.log".into()),
        },
    );
    assert!(n.wait(Duration::from_secs(10)));
    let env = std::fs::read_to_string(&out).unwrap();
    let run_dir = std::path::absolute(dir.path()).unwrap();
    for want in [
        "EMBEDFLEET_EVENT=batch_failed".to_string(),
        format!("EMBEDFLEET_RUN_DIR={}", run_dir.display()),
        "EMBEDFLEET_BATCH=7".into(),
        "EMBEDFLEET_JOB=ef1-b000007-a3".into(),
        // One line: the newline of the reason became a space.
        "EMBEDFLEET_REASON=exit code 1 after 3 attempt(s)".into(),
        "EMBEDFLEET_LOG=/r/logs/ef1-b000007-a3.log".into(),
        "EMBEDFLEET_MESSAGE=embedfleet: batch 7 failed: exit code 1 after 3 attempt(s)".into(),
    ] {
        assert!(env.lines().any(|l| l == want), "{want} not in:\n{env}");
    }
}

#[test]
fn a_run_directory_with_a_line_break_reaches_the_hook_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run\nEMBEDFLEET_EVENT=forged");
    std::fs::create_dir(&run).unwrap();
    let out = dir.path().join("env.txt");
    let n = notifier(
        &format!(
            "printf '%s|%s' \"$EMBEDFLEET_EVENT\" \"$EMBEDFLEET_RUN_DIR\" > {}",
            out.display()
        ),
        10.0,
    );
    n.send(
        &run,
        &Event::Finished {
            batches_done: 1,
            batches_failed: 0,
        },
    );
    assert!(n.wait(Duration::from_secs(10)));
    let got = std::fs::read_to_string(&out).unwrap();
    let (event, run_dir) = got.split_once('|').unwrap();
    assert_eq!(event, "finished");
    assert!(
        !run_dir.contains('\n') && run_dir.ends_with("run EMBEDFLEET_EVENT=forged"),
        "{run_dir:?}"
    );
}

#[test]
fn a_hanging_command_returns_at_once_and_is_killed_at_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let n = notifier(
        &format!("sleep 300 & echo $! > {}; wait", pid_file.display()),
        1.0,
    );
    let started = Instant::now();
    n.send(
        dir.path(),
        &Event::OwnerRestarted {
            host: "login2".into(),
            reason: "reboot".into(),
        },
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "send waited for the command"
    );
    assert!(!n.wait(Duration::from_millis(200)), "still running");
    assert!(n.wait(n.max_run_time()), "killed at its timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only asks whether the process exists.
    let deadline = Instant::now() + Duration::from_secs(5);
    while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert_ne!(
        unsafe { libc::kill(pid, 0) },
        0,
        "the hook's child survived"
    );
}

#[test]
fn a_failing_or_missing_command_is_only_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let n = notifier("echo boom >&2; exit 3", 5.0);
    n.send(
        dir.path(),
        &Event::Finished {
            batches_done: 2,
            batches_failed: 0,
        },
    );
    assert!(n.wait(Duration::from_secs(5)));
    let log = std::fs::read_to_string(notify_log(dir.path())).unwrap();
    assert!(log.contains("boom"), "{log}");
    let off = Notifier::disabled();
    assert!(!off.is_enabled());
    off.send(
        dir.path(),
        &Event::Finished {
            batches_done: 0,
            batches_failed: 0,
        },
    );
    assert!(off.wait(Duration::ZERO));
}

#[test]
fn every_event_has_its_name_and_a_one_line_message() {
    let events = [
        Event::Finished {
            batches_done: 5,
            batches_failed: 1,
        },
        Event::Paused {
            message: "3 jobs in a row failed the same way".into(),
            signature: "exit code 1; first error line: error: x".into(),
            job: "j3".into(),
            log: None,
        },
        Event::QueueSetAside {
            queue: "gpu-b".into(),
            message: "3 jobs in a row there failed the same way".into(),
            signature: "exit code 1; first error line: error: x".into(),
            job: "j3".into(),
            log: None,
        },
        Event::BatchFailed {
            batch: 1,
            job: "j".into(),
            reason: "r".into(),
            log: None,
        },
        Event::JobStalled {
            job: "j".into(),
            batch: Some(4),
            host: Some("nid0001".into()),
            reason: "no shard for 40m".into(),
        },
        Event::OwnerRestarted {
            host: "login1".into(),
            reason: "started again".into(),
        },
    ];
    let names: Vec<&str> = events.iter().map(Event::name).collect();
    assert_eq!(
        names,
        [
            "finished",
            "paused",
            "queue_set_aside",
            "batch_failed",
            "job_stalled",
            "owner_restarted"
        ]
    );
    for e in &events {
        assert!(!e.message().contains('\n'));
        assert!(e.message().starts_with("embedfleet: "), "{}", e.message());
    }
    assert!(events[2]
        .vars()
        .contains(&("EMBEDFLEET_QUEUE", "gpu-b".into())));
    assert!(events[4]
        .vars()
        .contains(&("EMBEDFLEET_HOST", "nid0001".into())));
    assert!(events[4].vars().contains(&("EMBEDFLEET_BATCH", "4".into())));
}
