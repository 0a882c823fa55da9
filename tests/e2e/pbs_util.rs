//! The one-node OpenPBS of `.ci/pbs/start-local-pbs.sh` as the PBS tests use it: its commands
//! (run inside its network namespace), whether it answers, a run config naming them, the
//! submit loop through it, and the exact counts of a run read by readers that are not ours
//! (pyarrow for the shards, Python's sqlite3 for run.db).

use crate::util::{python, TestDir};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The network namespace the server and every PBS command run in.
pub const NS: &str = "embedfleet-pbs";

/// PBS's own `tool` (`qstat`, `qmgr`...), run inside its namespace (`/usr/bin/qsub` may be
/// Slurm's Torque wrapper).
pub fn pbs(tool: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", NS, &format!("/opt/pbs/bin/{tool}")]);
    cmd
}

/// Runs PBS's `tool` with `args`, asserting it succeeds; its stdout.
pub fn pbs_ok(tool: &str, args: &[&str]) -> String {
    let out = pbs(tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `qmgr -c COMMAND`.
pub fn qmgr(command: &str) {
    pbs_ok("qmgr", &["-c", command]);
}

/// Whether the one-node OpenPBS answers; a missing one fails the test where
/// EMBEDFLEET_REQUIRE_PBS=1 (CI), and skips it elsewhere.
pub fn pbs_up(test: &str) -> bool {
    let out = pbs("qstat").arg("-B").output();
    if out.as_ref().is_ok_and(|o| o.status.success()) {
        return true;
    }
    let why = match out {
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => format!("cannot run ip netns exec: {e}"),
    };
    if std::env::var("EMBEDFLEET_REQUIRE_PBS").as_deref() == Ok("1") {
        panic!("{test}: no PBS server answers ({why}) but EMBEDFLEET_REQUIRE_PBS=1; start one with .ci/pbs/start-local-pbs.sh (as root)");
    }
    eprintln!("skipping {test}: no PBS server answers ({why}); start one with .ci/pbs/start-local-pbs.sh (as root)");
    false
}

/// The run config's `[scheduler.pbs]` commands: PBS's own, inside its namespace; `qsub_extra`
/// goes after `qsub`.
pub fn commands_table(qsub_extra: &[&str]) -> String {
    let wrapped = |tool: &str, extra: &[&str]| {
        let mut args = vec![
            "netns".to_string(),
            "exec".into(),
            NS.into(),
            format!("/opt/pbs/bin/{tool}"),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
        format!(
            "{tool} = {{ path = \"ip\", extra_args = [{}] }}\n",
            args.join(", ")
        )
    };
    format!(
        "[scheduler.pbs]\n{}{}{}",
        wrapped("qsub", qsub_extra),
        wrapped("qstat", &[]),
        wrapped("qdel", &[])
    )
}

/// A run config for the test server: backend pbs, its commands, and `script` (the lines of
/// `[scheduler.script]`).
pub fn run_config(script: &str) -> String {
    format!(
        "[scheduler]\nbackend = \"pbs\"\n{}\n[scheduler.script]\n{script}\n",
        commands_table(&[])
    )
}

/// The arguments of `submit` of the run `plan_with_model` made, through PBS with `run.toml`,
/// on this CPU, polling every `poll_s` seconds.
pub fn submit_args(poll_s: &'static str) -> Vec<&'static str> {
    vec![
        "submit",
        "--run-dir",
        "run",
        "--backend",
        "pbs",
        "--config",
        "run.toml",
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--shard-papers",
        "4",
        "--poll-interval",
        poll_s,
        "--lost-after",
        "60",
    ]
}

/// `submit` of the run `plan_with_model` made, through PBS with `run.toml`, on this CPU; its
/// stdout goes to `submit.out`.
pub fn spawn_submit(t: &TestDir, extra: &[&str]) -> Child {
    let mut args = submit_args("0.5");
    args.extend(extra);
    let stdout = std::fs::File::create(t.join("submit.out")).unwrap();
    t.cmd(&args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("submit starts")
}

/// Waits for the loop to exit (at most `timeout_s`), calling `meanwhile` about every 200 ms;
/// its exit code and stderr.
pub fn finish(mut child: Child, timeout_s: u64, mut meanwhile: impl FnMut()) -> (i32, String) {
    let end = Instant::now() + Duration::from_secs(timeout_s);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            panic!("the submit loop did not end in {timeout_s} s:\n{err}");
        }
        meanwhile();
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status.code().unwrap_or(-1), err)
}

pub fn db(t: &TestDir) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(t.join("run/run.db")).unwrap();
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c
}

/// `(name, scheduler id, queue, state, exit reason)` of every job of the run, in order.
pub fn jobs(t: &TestDir) -> Vec<(String, String, String, String, String)> {
    let c = db(t);
    let mut stmt = c
        .prepare(
            "SELECT name, coalesce(scheduler_id, ''), coalesce(queue, ''), state,
                    coalesce(exit_reason, '') FROM jobs ORDER BY id",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

/// The jobs PBS lists now (`qstat -f -F json`, no history) whose submission names `run_dir`:
/// id -> (queue, job_state).
pub fn listed(run_dir: &Path) -> BTreeMap<String, (String, String)> {
    let out = pbs("qstat").args(["-f", "-F", "json"]).output().unwrap();
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let run = run_dir.display().to_string();
    let mut found = BTreeMap::new();
    if let Some(jobs) = value.get("Jobs").and_then(|j| j.as_object()) {
        for (id, job) in jobs {
            let field = |k: &str| {
                job.get(k)
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string()
            };
            if field("Submit_arguments").contains(&run) {
                found.insert(id.clone(), (field("queue"), field("job_state")));
            }
        }
    }
    found
}

/// One job's attributes from `qstat -x -f -F json ID`.
pub fn qstat_job(id: &str) -> serde_json::Value {
    let out = pbs("qstat")
        .args(["-x", "-f", "-F", "json", id])
        .output()
        .unwrap();
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    value["Jobs"]
        .as_object()
        .and_then(|jobs| jobs.values().next().cloned())
        .unwrap_or_else(|| panic!("qstat does not know {id}: {value}"))
}

/// Asserts the run ended exact: every batch done, and the shards hold each planned paper once
/// (read by pyarrow, their list by Python's sqlite3, where CI has them); `status` agrees.
pub fn assert_exact(t: &TestDir, batches: u64, papers: u64) {
    let st = t.status("run");
    assert_eq!(st["batches_by_state"]["done"], batches, "{st}");
    assert_eq!(st["rows_in_shards"], papers, "{st}");
    let code = format!(
        "import sqlite3, pyarrow.parquet as pq\n\
         run = {:?}\n\
         c = sqlite3.connect(f'file:{{run}}/run.db?mode=ro', uri=True)\n\
         ids = []\n\
         for (p,) in c.execute('SELECT path FROM shards'):\n    ids += pq.read_table(f'{{run}}/{{p}}', columns=['id']).column('id').to_pylist()\n\
         done = c.execute(\"SELECT count(*) FROM batches WHERE state = 'done'\").fetchone()[0]\n\
         print(len(ids), len(set(ids)), done)",
        t.join("run").display().to_string()
    );
    if let Some(out) = python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW") {
        assert_eq!(
            out,
            format!("{papers} {papers} {batches}"),
            "rows, ids, batches done"
        );
    }
}

/// True for an id as this server gives them: `N.pbshost`.
pub fn is_pbs_id(id: &str) -> bool {
    id.strip_suffix(".pbshost")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// Waits until `cond` holds (checked every 200 ms), failing after `timeout_s` seconds or when
/// the loop `child` exits first.
pub fn wait_for(child: &mut Child, what: &str, timeout_s: u64, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(timeout_s);
    while !cond() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            panic!("the submit loop ended ({status}) before {what}:\n{err}");
        }
        assert!(Instant::now() < end, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The state run.db records for the job PBS knows as `id`.
pub fn state_of(t: &TestDir, id: &str) -> Option<String> {
    jobs(t).into_iter().find(|j| j.1 == id).map(|j| j.3)
}

/// The routing line of `status --json` for `queue`.
pub fn route_of(t: &TestDir, queue: &str) -> serde_json::Value {
    let st = t.status("run");
    st["routing"]["queues"]
        .as_array()
        .and_then(|qs| qs.iter().find(|q| q["queue"] == queue).cloned())
        .unwrap_or_else(|| panic!("no routing line for {queue}: {st}"))
}

/// A queue of the test's own, `PREFIX<pid>`: it takes jobs (enabled) but starts none until
/// [`StoppedQueue::start`]; deleted with its jobs when dropped.
pub struct StoppedQueue(pub String);

impl StoppedQueue {
    pub fn create(prefix: &str) -> Self {
        let name = format!("{prefix}{}", std::process::id() % 100_000);
        qmgr(&format!("create queue {name} queue_type=execution"));
        qmgr(&format!("set queue {name} enabled = True"));
        Self(name)
    }

    pub fn start(&self) {
        qmgr(&format!("set queue {} started = True", self.0));
    }
}

impl Drop for StoppedQueue {
    fn drop(&mut self) {
        let left = pbs("qselect").args(["-q", &self.0]).output();
        let left = left.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        for id in left.unwrap_or_default().split_whitespace() {
            let _ = pbs("qdel").args(["-W", "force", id]).output();
        }
        let _ = pbs("qmgr")
            .args(["-c", &format!("delete queue {}", self.0)])
            .output();
    }
}
