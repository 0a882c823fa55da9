//! A PBS site's first day on the one-node OpenPBS (issue 60, items 4-6): a misspelt queue is
//! refused before anything is stored, the dry run included; a failed first submit's bare
//! restart never falls back to local jobs; a CPU build named for GPU jobs is refused before
//! the dry run and the trial, and a job refused for its setup is no loss of the queue's.

use crate::pbs_util::{finish, jobs, pbs_up, run_config, spawn_submit, wait_for};
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

/// Every process under `pid` (its children, theirs, ...), read from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid ...`: the comm may hold spaces, so read after its `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parents.entry(ppid).or_default().push(child);
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        for &c in parents.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            out.push(c);
            stack.push(c);
        }
    }
    out
}

/// The pid of PBS's `daemon` (`pbs_mom`, `pbs_server.bin`), if it runs.
fn daemon_pid(daemon: &str) -> Option<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-x", daemon])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn in_pbs_namespace(program: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("ip")
        .args(["netns", "exec", crate::pbs_util::NS, program])
        .args(args)
        .output()
        .unwrap()
}

/// Waits until the node is free again (at most two minutes).
fn node_free() -> bool {
    node_state_within(|state| state == "free").is_ok()
}

/// Whether the node is up again within two minutes: free, or already running jobs (PBS reruns
/// the jobs the crash killed as soon as the MOM reports, which can fill the node at once);
/// else the state it was last seen in.
fn node_up() -> Result<(), String> {
    node_state_within(|state| {
        state
            .split(',')
            .all(|s| matches!(s.trim(), "free" | "job-busy" | "job-exclusive"))
    })
}

/// Polls `pbsnodes -a` for up to two minutes until its `state = ...` line passes `ok`; else
/// the last state seen.
fn node_state_within(ok: impl Fn(&str) -> bool) -> Result<(), String> {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut last = String::new();
    while std::time::Instant::now() < end {
        let out = in_pbs_namespace("/opt/pbs/bin/pbsnodes", &["-a"]);
        let text = String::from_utf8_lossy(&out.stdout);
        last = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("state = "))
            .unwrap_or("(no state line)")
            .to_string();
        if ok(&last) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    Err(last)
}

/// Starts what of PBS is not running (the init script starts only what is missing), and waits
/// until its node is free; runs also when the test fails part-way, and then deletes what the
/// run left in PBS (a held job would count against every later test's `max_queued`).
struct PbsBackUp(std::path::PathBuf);

impl Drop for PbsBackUp {
    fn drop(&mut self) {
        if daemon_pid("pbs_mom").is_none() {
            in_pbs_namespace("/opt/pbs/sbin/pbs_mom", &[]);
        }
        if daemon_pid("pbs_server.bin").is_none() {
            in_pbs_namespace("/etc/init.d/pbs", &["start"]);
        }
        node_free();
        for id in crate::pbs_util::listed(&self.0).keys() {
            let _ = crate::pbs_util::pbs("qdel")
                .args(["-W", "force", id])
                .output();
        }
    }
}

/// Issue 60, 5b: a node crash (the MOM and its jobs SIGKILLed, the MOM started again), an
/// operator's `qhold` of a queued job and `qrerun` of a running one, then the loop SIGKILLed
/// while the server is down (`qterm -t quick`) and started again bare before it is back. The
/// restarted loop neither stalls on queues it found unanswering nor takes a handful of losses
/// for an unusable queue: the run ends exact, with nothing of its own left queued or held.
/// Runs alone (.config/nextest.toml): it stops the server and the node for everyone.
#[test]
fn pbs_a_node_crash_a_hold_a_rerun_and_a_restart_while_the_server_is_down_end_exact() {
    let test = "pbs_a_node_crash_a_hold_a_rerun_and_a_restart_while_the_server_is_down_end_exact";
    if !pbs_up(test) {
        return;
    }
    let (batches, per) = (16, 3);
    let t = TestDir::new();
    let _back_up = PbsBackUp(std::path::absolute(t.join("run")).unwrap());
    t.plan_with_model(batches * per, per);
    // Two jobs run at once on the 16-CPU node; each job takes a few seconds and its first run
    // lingers, so that jobs are running when the node crashes and when the operator reruns
    // one, and others wait in their queues for the operator's hold.
    let marks = t.join("first-runs");
    std::fs::create_dir(&marks).unwrap();
    let setup = format!(
        "setup = [\"sleep 6; if mkdir {}/$PBS_JOBID 2>/dev/null; then sleep 8; fi\"]",
        marks.display()
    );
    std::fs::write(
        t.join("run.toml"),
        run_config(&format!(
            "walltime = \"00:10:00\"\nselect_extra = \"ncpus=8\"\n{setup}"
        )),
    )
    .unwrap();
    let mut child = spawn_submit(&t, &["--queue", "debug=2", "--queue", "preemptable=2"]);
    let running = |t: &TestDir| -> Vec<String> {
        jobs(t)
            .into_iter()
            .filter(|j| j.3 == "running")
            .map(|j| j.1)
            .collect()
    };
    wait_for(&mut child, "two jobs run", 120, || running(&t).len() == 2);
    // An operator holds a queued job.
    let mut held = None;
    wait_for(&mut child, "a job waits in its queue", 60, || {
        held = jobs(&t)
            .into_iter()
            .find(|j| j.3 == "pending" && !j.1.is_empty())
            .map(|j| j.1);
        held.is_some()
    });
    crate::pbs_util::pbs_ok("qhold", &[&held.unwrap()]);
    // A node crash: the MOM and every job session under it killed, the MOM started again.
    let mom = daemon_pid("pbs_mom").expect("the MOM runs");
    let pids: Vec<String> = std::iter::once(mom)
        .chain(descendants(mom))
        .map(|p| p.to_string())
        .collect();
    std::process::Command::new("kill")
        .arg("-KILL")
        .args(&pids)
        .status()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    in_pbs_namespace("/opt/pbs/sbin/pbs_mom", &[]);
    if let Err(state) = node_up() {
        panic!("the node is not back two minutes after its MOM restarted: state = {state}");
    }
    // A job PBS runs (run.db's view lags a poll behind), rerun as soon as one takes it.
    wait_for(&mut child, "an operator reruns a running job", 180, || {
        running(&t).iter().any(|id| {
            let out = crate::pbs_util::pbs("qrerun").arg(id).output().unwrap();
            out.status.success()
        })
    });
    std::thread::sleep(std::time::Duration::from_secs(3));
    // The loop killed while the server is down, then started again bare before it is back.
    let _ = child.kill();
    let _ = child.wait();
    let out = in_pbs_namespace("/opt/pbs/bin/qterm", &["-t", "quick"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bare = t
        .cmd(&["submit", "--run-dir", "run", "--poll-interval", "0.5"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(8));
    in_pbs_namespace("/etc/init.d/pbs", &["start"]);
    let (code, err) = finish(bare, 420, || {});
    assert_eq!(code, 0, "{err}");
    crate::pbs_util::assert_exact(&t, batches, batches * per);
    // Nothing of the run's own is left queued or held in PBS.
    let run_dir = std::path::absolute(t.join("run")).unwrap();
    let left = crate::pbs_util::listed(&run_dir);
    assert!(left.is_empty(), "left in PBS: {left:?}");
    // No queue is taken for unusable from a handful of losses.
    for queue in ["debug", "preemptable"] {
        let q = crate::pbs_util::route_of(&t, queue);
        assert_ne!(q["state"], "unusable", "{q}");
    }
}

/// The number of points of table `table` as PostgreSQL itself counts them.
fn pg_rows(url: &str, table: &str) -> u64 {
    let mut client =
        embedfleet_vectordb::pg::client(&embedfleet_vectordb::PgConfig::new(url)).expect("connect");
    let n: i64 = client
        .query_one(&format!("SELECT count(*) FROM \"{table}\""), &[])
        .unwrap()
        .get(0);
    n as u64
}

/// The number of points of the run's embedded Qdrant collection, as the engine counts them.
fn edge_points(run: &std::path::Path) -> u64 {
    use embedfleet_vectordb::Sink;
    let sink = embedfleet_vectordb::QdrantEdge::open(run.join("qdrant")).unwrap();
    sink.count(embedfleet_vectordb::CountRequest::new("papers"))
        .unwrap()
}

/// Every exact row of `eval` reads 1.0, in each database (`eval`'s own exact row) and in their
/// comparison (the rows that searched exactly: a collection with no index).
fn assert_exact_rows_are_one(t: &TestDir, url: &str, table: &str) {
    let eval = |extra: &[&str]| -> serde_json::Value {
        let args = [
            &["eval", "--run-dir", "run", "--sample", "30", "--json"][..],
            extra,
        ]
        .concat();
        serde_json::from_slice(&t.run(&args, 0).stdout).unwrap()
    };
    for report in [eval(&[]), eval(&["--postgres", url, "--collection", table])] {
        let exact = &report["rows"][0];
        assert_eq!(exact["search"], "exact", "{report}");
        assert_eq!(exact["recall"], 1.0, "{report}");
    }
    let report = eval(&["--compare-postgres", url, "--compare-table", table]);
    let rows = report["rows"].as_array().unwrap();
    assert!(!rows.is_empty(), "{report}");
    for row in rows.iter().filter(|r| r["index"] == "none (exact search)") {
        assert_eq!(row["recall"], 1.0, "{row}");
    }
}

/// `status`'s count of each collection (`holds`) against the database's own count.
fn assert_status_counts_each_database(t: &TestDir, url: &str, table: &str) {
    let status = t.status("run");
    let uploads = status["uploads_by_collection"].as_object().unwrap();
    let holds = |prefix: &str| {
        uploads
            .iter()
            .find(|(key, _)| key.starts_with(prefix))
            .map(|(_, u)| u["holds"].as_u64().expect("holds known after an upload"))
            .unwrap_or_else(|| panic!("no {prefix}: {status}"))
    };
    assert_eq!(
        holds("papers@edge:"),
        edge_points(&t.join("run")),
        "{status}"
    );
    assert_eq!(
        holds(&format!("{table}@postgres:")),
        pg_rows(url, table),
        "{status}"
    );
}

/// The walk-through as a new user does it, on the one-node OpenPBS and the PostgreSQL of
/// `.ci/pgvector`: the PBS recipe with a trial, the whole run, the load into both databases,
/// their comparison, a delete from one, then release 2 to both. Every `eval` exact row reads
/// 1.0000, and `status` counts what each database holds by its own count.
#[test]
fn pbs_and_pgvector_first_day_walk_through_ends_exact_in_both_databases() {
    let test = "pbs_and_pgvector_first_day_walk_through_ends_exact_in_both_databases";
    if !pbs_up(test) {
        return;
    }
    let Some(url) = crate::pgvector::pg_url(test) else {
        return;
    };
    let table = format!("e2e_walk_{}", std::process::id());
    let t = TestDir::new();
    crate::update::make_releases(
        &t,
        &crate::update::Shape {
            release_1: 60,
            withdrawn: 4,
            changed: 3,
            new: 10,
        },
    );
    t.run(
        &[
            "plan",
            "--corpus",
            "r1.jsonl",
            "--run-dir",
            "run",
            "--papers-per-job",
            "30",
        ],
        0,
    );
    t.run(&["make-tiny-model", "--out", "model"], 0);
    let exe = env!("CARGO_BIN_EXE_embedfleet");
    std::fs::write(
        t.join("run.toml"),
        run_config(&format!("embedfleet = \"{exe}\"\nwalltime = \"00:10:00\"")),
    )
    .unwrap();
    let first = [
        "submit",
        "--run-dir",
        "run",
        "--config",
        "run.toml",
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--poll-interval",
        "0.5",
    ];
    let out = t.run(&[&first[..], &["--trial", "debug"]].concat(), 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("set `walltime"));
    // The restart README documents: the stored config, queues given.
    let submit = [
        "submit",
        "--run-dir",
        "run",
        "--queue",
        "debug=2",
        "--poll-interval",
        "0.5",
    ];
    t.run(&submit, 0);
    let pg = ["--postgres", url.as_str(), "--collection", table.as_str()];
    let _drop = DropTable(url.clone(), table.clone());
    t.run(&["upload", "--run-dir", "run"], 0);
    t.run(&[&["upload", "--run-dir", "run"][..], &pg].concat(), 0);
    assert_exact_rows_are_one(&t, &url, &table);
    assert_status_counts_each_database(&t, &url, &table);
    // A paper deleted from the table only: the embedded Qdrant still holds it, and says so;
    // each database's exact truth is what it holds.
    t.run(
        &[&["delete", "--run-dir", "run"][..], &pg, &["W00011"]].concat(),
        0,
    );
    assert_status_counts_each_database(&t, &url, &table);
    let human =
        String::from_utf8_lossy(&t.run(&["status", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(human.contains("1 deleted paper is still in it"), "{human}");
    assert!(human.contains(" at postgresql://"), "as typed: {human}");
    assert_exact_rows_are_one(&t, &url, &table);
    // Release 2 to both.
    t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    t.run(&submit, 0);
    t.run(&["upload", "--run-dir", "run"], 0);
    t.run(&[&["upload", "--run-dir", "run"][..], &pg].concat(), 0);
    assert_status_counts_each_database(&t, &url, &table);
    assert_exact_rows_are_one(&t, &url, &table);
    let status = t.status("run");
    assert_eq!(status["papers_live"], 60 - 4 + 10 - 1, "{status}");
    for (key, u) in status["uploads_by_collection"].as_object().unwrap() {
        assert_eq!(u["deletes_pending"], 0, "{key}: {u}");
        assert_eq!(u["release"], 2, "{key}: {u}");
    }
}

/// Drops a test's table when dropped.
struct DropTable(String, String);

impl Drop for DropTable {
    fn drop(&mut self) {
        if let Ok(mut c) =
            embedfleet_vectordb::pg::client(&embedfleet_vectordb::PgConfig::new(&self.0))
        {
            let _ = c.batch_execute(&format!("DROP TABLE IF EXISTS \"{}\"", self.1));
        }
    }
}

/// `--precision fp8` where one queue's GPUs have no FP8 tensor cores: the embed jobs there exit
/// 5 (their device's refusal, as on an A100), so the loop sets that queue aside at its first
/// such job and retries its batch on the other queue; the run ends with every batch done, not
/// paused, and the queue's refusal said once. (A stand-in binary refuses as the model load does
/// on an A100, in the jobs of the `preemptable` queue only: PBS_QUEUE, as PBS sets it.)
#[test]
fn pbs_a_queue_whose_gpus_refuse_is_set_aside_at_its_first_job_and_the_run_ends_on_the_other() {
    let test =
        "pbs_a_queue_whose_gpus_refuse_is_set_aside_at_its_first_job_and_the_run_ends_on_the_other";
    if !pbs_up(test) {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(24, 8);
    let real = env!("CARGO_BIN_EXE_embedfleet");
    let binary = t.join("embedfleet-on-the-nodes");
    std::fs::write(
        &binary,
        format!(
            "#!/bin/bash\nif [ \"$1\" = embed-job ] && [ \"${{PBS_QUEUE:-}}\" = preemptable ]; then\n\
             echo 'error: --precision fp8 needs FP8 tensor cores (compute capability 8.9 or newer); \
             this GPU has 8.0 (an A100)' >&2; exit 5; fi\nexec {real} \"$@\"\n"
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&binary)
        .status()
        .unwrap();
    let config = format!("embedfleet = \"{}\"", binary.display());
    std::fs::write(t.join("run.toml"), run_config(&config)).unwrap();
    let child = spawn_submit(
        &t,
        &[
            "--queue",
            "preemptable=1",
            "--queue",
            "debug=1",
            "--route",
            "static",
        ],
    );
    let (code, err) = finish(child, 400, || {});
    assert_eq!(code, 0, "{err}");
    let status = t.status("run");
    assert_eq!(status["batches_by_state"]["done"], 3, "{status}");
    assert_eq!(status["paused"], false, "{status}");
    let all = jobs(&t);
    let refused: Vec<_> = all.iter().filter(|j| j.2 == "preemptable").collect();
    assert_eq!(refused.len(), 1, "one job there, then set aside: {all:?}");
    assert!(refused[0].4.contains("exit code 5"), "{all:?}");
    assert!(
        all.iter()
            .filter(|j| j.2 == "debug")
            .all(|j| j.3 == "completed"),
        "{all:?}"
    );
    assert!(
        err.contains("queue preemptable: set aside by the breaker")
            && err.contains("was refused by its node's device"),
        "{err}"
    );
}
