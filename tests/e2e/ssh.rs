//! The ssh backend against real OpenSSH servers (`sshd.rs`): three "hosts" run a 300-paper
//! run to exact counts through a host lost mid-run (its sshd and jobs killed: its batches
//! finish elsewhere), a host whose sshd comes back while its job still runs (adopted, not run
//! twice) and an owner restarted with `--run-dir` alone; and the checks before the first job
//! refuse an unknown host key, a missing binary and a run directory that is not shared.

use crate::sshd::Fleet;
use crate::util::{planned_ids, python, wait_until, TestDir};
use std::process::{Child, Stdio};
use std::time::Duration;

fn db(t: &TestDir) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(t.join("run/run.db")).unwrap();
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c
}

/// `papers` short sample papers (the tiny model's time goes with their tokens) planned into
/// `run`, `per_batch` a batch, and a tiny model in `model`.
fn plan_short_papers(t: &TestDir, papers: u64, per_batch: u64) {
    let (papers, per_batch) = (papers.to_string(), per_batch.to_string());
    t.run(
        &[
            "sample-corpus",
            "--papers",
            &papers,
            "--mean-chars",
            "200",
            "--out",
            "c.jsonl.gz",
        ],
        0,
    );
    t.run(
        &[
            "plan",
            "--corpus",
            "c.jsonl.gz",
            "--run-dir",
            "run",
            "--papers-per-job",
            &per_batch,
        ],
        0,
    );
    t.run(&["make-tiny-model", "--out", "model"], 0);
}

/// The first column of every row `sql` selects.
fn column(c: &rusqlite::Connection, sql: &str) -> Vec<String> {
    c.prepare(sql)
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A running job on `queue`: its name and scheduler id.
fn running_on(t: &TestDir, queue: &str) -> Option<(String, String)> {
    db(t)
        .query_row(
            "SELECT name, scheduler_id FROM jobs WHERE queue = ?1 AND state = 'running' LIMIT 1",
            [queue],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .ok()
}

fn spawn(t: &TestDir, args: &[&str], log: &str) -> Child {
    let out = std::fs::File::create(t.join(log)).unwrap();
    t.cmd(args)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("submit starts")
}

fn finish(t: &TestDir, mut child: Child, log: &str) -> String {
    let status = child.wait().unwrap();
    let said = std::fs::read_to_string(t.join(log)).unwrap();
    assert!(status.success(), "{log}:\n{said}");
    said
}

/// Kills the process group an ssh job id (`HOST:SLOT:PID:START`) leads.
fn kill_job(id: &str) {
    let pid: i32 = id.split(':').nth(2).unwrap().parse().unwrap();
    // SAFETY: killpg only sends a signal.
    unsafe { libc::killpg(pid, libc::SIGKILL) };
}

/// The returning host's job `kept` was adopted (it ended well and its batch ran once); the
/// lost host's job `lost` had its batch done by another host.
fn assert_adopted_and_redone(c: &rusqlite::Connection, kept_job: &str, lost_job: &str) {
    let count = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
    let (state, batch): (String, i64) = c
        .query_row(
            "SELECT state, batch_id FROM jobs WHERE name = ?1",
            [&kept_job],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(state, "completed", "{kept_job}");
    assert_eq!(
        count(&format!(
            "SELECT count(*) FROM jobs WHERE batch_id = {batch}"
        )),
        1,
        "batch {batch} ran once"
    );
    // The lost host's batch was done by another host.
    let lost_batch: i64 = c
        .query_row(
            "SELECT batch_id FROM jobs WHERE name = ?1",
            [&lost_job],
            |r| r.get(0),
        )
        .unwrap();
    let redone: String = c
        .query_row(
            "SELECT queue FROM jobs WHERE batch_id = ?1 AND state = 'completed'",
            [lost_batch],
            |r| r.get(0),
        )
        .unwrap();
    assert_ne!(redone, "h2");
}

/// Exact, by readers that are not ours: pyarrow over the accepted shards, sqlite3 over run.db.
fn assert_exact(t: &TestDir) {
    let expected = planned_ids(&t.join("run")).len();
    let code = format!(
        "import sqlite3, pyarrow.parquet as pq\n\
         db = sqlite3.connect({run:?} + '/run.db')\n\
         paths = [p for (p,) in db.execute('SELECT path FROM shards')]\n\
         ids = [i for p in paths for i in pq.read_table({run:?} + '/' + p, columns=['id']).column('id').to_pylist()]\n\
         done = db.execute(\"SELECT count(*) FROM batches WHERE state = 'done'\").fetchone()[0]\n\
         total = db.execute('SELECT count(*) FROM batches').fetchone()[0]\n\
         print(len(ids), len(set(ids)), done == total)",
        run = t.join("run").display().to_string()
    );
    if let Some(out) = python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW") {
        assert_eq!(out, format!("{expected} {expected} True"));
    }
}

#[test]
fn three_ssh_hosts_embed_300_papers_exactly_through_a_lost_host_a_returning_one_and_a_restart() {
    let test = "three_ssh_hosts_embed_300_papers_exactly_through_a_lost_host_a_returning_one_and_a_restart";
    let Some(mut fleet) = Fleet::start(test, "h", 3) else {
        return;
    };
    let t = TestDir::new();
    plan_short_papers(&t, 300, 50);
    // Every job waits a little first, h2's and h3's longer (their own environment), so that
    // their jobs still run when h2 is killed and when h3's sshd comes back.
    let mut config = fleet.run_config(&[
        "slots = [\"cpu\", \"cpu\"]",
        "slots = [\"cpu\", \"cpu\"]\nenv = { EMBEDFLEET_TEST_WAIT = \"8\" }",
        "slots = [\"cpu\", \"cpu\"]\nenv = { EMBEDFLEET_TEST_WAIT = \"8\" }",
    ]);
    config.push_str("\n[scheduler.script]\nsetup = [\"sleep ${EMBEDFLEET_TEST_WAIT:-1}\"]\n");
    std::fs::write(t.join("run.toml"), config).unwrap();
    let args = [
        "submit",
        "--run-dir",
        "run",
        "--config",
        "run.toml",
        "--model-dir",
        "model",
        "--shard-papers",
        "10",
        "--poll-interval",
        "0.5",
        "--lost-after",
        "6",
    ];
    let submit = spawn(&t, &args, "submit1.log");

    // h2 is lost mid-run: its sshd and its jobs killed, for good.
    wait_until("h2 runs a job", 120, || running_on(&t, "h2").is_some());
    fleet.down(1);
    let (lost_job, _) = running_on(&t, "h2").unwrap();
    for id in column(
        &db(&t),
        "SELECT scheduler_id FROM jobs WHERE queue = 'h2' AND state IN ('running', 'pending', 'unknown')",
    ) {
        kill_job(&id);
    }

    // h3's sshd goes down and comes back while its job still runs.
    wait_until("h3 runs a job", 120, || running_on(&t, "h3").is_some());
    let (kept_job, _) = running_on(&t, "h3").unwrap();
    fleet.down(2);
    std::thread::sleep(Duration::from_secs(2));
    fleet.up(2);

    // The owner is killed and started again with the run directory alone.
    wait_until("h2's job is lost", 120, || {
        db(&t)
            .query_row("SELECT state FROM jobs WHERE name = ?1", [&lost_job], |r| {
                r.get::<_, String>(0)
            })
            .is_ok_and(|s| s == "lost")
    });
    let mut submit = submit;
    submit.kill().unwrap();
    submit.wait().unwrap();
    let restarted = spawn(&t, &["submit", "--run-dir", "run"], "submit2.log");
    let said = finish(&t, restarted, "submit2.log");
    assert!(
        said.contains("queue h2:"),
        "the lost host is named:\n{said}"
    );

    let c = db(&t);
    let count = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM batches WHERE state != 'done'"),
        0
    );
    assert_eq!(count("SELECT count(*) FROM jobs WHERE backend != 'ssh'"), 0);
    assert_adopted_and_redone(&c, &kept_job, &lost_job);
    if fleet.named() {
        let hosts = column(&c, "SELECT DISTINCT host FROM attempts ORDER BY host");
        // (h2's killed jobs may have written no result.)
        assert!(
            hosts
                .iter()
                .all(|h| ["h1", "h2", "h3"].contains(&h.as_str()))
                && hosts.contains(&"h1".to_string())
                && hosts.contains(&"h3".to_string()),
            "the jobs ran on the hosts: {hosts:?}"
        );
    }
    drop(c);

    assert_exact(&t);
}

#[test]
fn ssh_preflight_refuses_an_unknown_host_key_a_missing_binary_and_an_unshared_run_dir() {
    let test = "ssh_preflight_refuses_an_unknown_host_key_a_missing_binary_and_an_unshared_run_dir";
    let Some(mut fleet) = Fleet::start(test, "p", 4) else {
        return;
    };
    let t = TestDir::new();
    plan_short_papers(&t, 20, 20);
    // h4 sees another directory at the run directory's path: its sshd rewrites the path in
    // everything it is sent.
    let run = t.join("run").display().to_string();
    let elsewhere = t.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    fleet.write_config(
        3,
        &format!(
            "ForceCommand sed 's#{run}#{}#g' | bash -s",
            elsewhere.display()
        ),
    );
    fleet.down(3);
    fleet.up(3);
    let empty = fleet.path().join("empty_known_hosts");
    std::fs::write(&empty, "").unwrap();
    let config = fleet
        .run_config(&[
            "slots = [\"cpu\"]",
            "slots = [\"cpu\"]",
            "slots = [\"cpu\"]\nembedfleet = \"/nonexistent/embedfleet\"",
            "slots = [\"cpu\"]",
        ])
        // h2's key is in no known_hosts file it is checked against.
        .replacen(
            &format!(
                "port = {}\nidentity = \"{}\"\nknown_hosts = \"{}\"",
                fleet.hosts[1].port,
                fleet.path().join("user_key").display(),
                fleet.known_hosts().display()
            ),
            &format!(
                "port = {}\nidentity = \"{}\"\nknown_hosts = \"{}\"",
                fleet.hosts[1].port,
                fleet.path().join("user_key").display(),
                empty.display()
            ),
            1,
        );
    std::fs::write(t.join("run.toml"), config).unwrap();
    let out = t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--config",
            "run.toml",
            "--model-dir",
            "model",
            "--poll-interval",
            "0.5",
        ],
        0,
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "queue p2: ssh refused the host key",
        "ssh-keyscan -p",
        "queue p3: the embedfleet binary /nonexistent/embedfleet is not there",
        "queue p4: the run directory",
        "is not this one",
    ] {
        assert!(said.contains(needle), "{needle}:\n{said}");
    }
    assert!(!said.contains("queue p1:"), "{said}");
    let c = db(&t);
    let queues = column(&c, "SELECT DISTINCT queue FROM jobs");
    assert_eq!(queues, ["p1"], "no job went to a refused host");
    // `doctor` runs the same checks for the run's stored config.
    let out = t.cmd(&["doctor", "--run-dir", "run"]).output().unwrap();
    let doctor = String::from_utf8_lossy(&out.stdout);
    assert!(
        doctor.contains("queue p2: ssh refused the host key"),
        "{doctor}"
    );
    assert!(doctor.contains("queue p4: the run directory"), "{doctor}");
}
