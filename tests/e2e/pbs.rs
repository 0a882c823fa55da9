//! `submit --backend pbs` through the real one-node OpenPBS 23.06.06 of
//! `.ci/pbs/start-local-pbs.sh` (PBS Professional's open source; queues `debug`, `preemptable`,
//! `urgent`; Polaris's custom resources): the study's caps, PBS's ids where a user reads them,
//! the checks before the first job (an unknown queue, root refused) and the Polaris job
//! template checked by PBS itself. The faults are in `pbs_faults.rs`.
//!
//! Without a reachable server these tests print why and pass, unless
//! `EMBEDFLEET_REQUIRE_PBS=1` (CI) makes them fail. The jobs run as root: the server's
//! `acl_roots` allows it (docs/testing.md says why).

use crate::pbs_util::{
    assert_exact, commands_table, db, finish, is_pbs_id, jobs, listed, pbs_ok, pbs_up, qmgr,
    qstat_job, run_config, spawn_submit,
};
use crate::util::TestDir;
use std::collections::BTreeMap;

/// The study's caps (`debug=1`, `preemptable=4`), ten batches: every queue holds no more
/// than its cap in run.db and in PBS's own listing at every look, the run ends exact, and the
/// ids PBS gave (`N.pbshost`) are what `status` shows of a running job, `report --trace` lists
/// and the HTML report holds.
#[test]
fn pbs_study_caps_end_exact_and_show_pbs_ids() {
    if !pbs_up("pbs_study_caps_end_exact_and_show_pbs_ids") {
        return;
    }
    let (batches, per) = (10, 4);
    let t = TestDir::new();
    t.plan_with_model(batches * per, per);
    std::fs::write(t.join("run.toml"), run_config("walltime = \"00:10:00\"")).unwrap();
    let caps = BTreeMap::from([("debug".to_string(), 1), ("preemptable".to_string(), 4)]);
    let child = spawn_submit(
        &t,
        &[
            "--queue",
            "debug=1",
            "--queue",
            "preemptable=4",
            "--route",
            "static",
        ],
    );
    let run_dir = std::path::absolute(t.join("run")).unwrap();
    let (mut looks, mut live_ids) = (0, Vec::<String>::new());
    let (code, err) = finish(child, 300, || {
        let mut by_queue: BTreeMap<String, u64> = BTreeMap::new();
        for (queue, _) in listed(&run_dir).values() {
            *by_queue.entry(queue.clone()).or_default() += 1;
        }
        for (queue, n) in by_queue {
            assert!(n <= caps[&queue], "PBS lists {n} jobs in {queue}");
        }
        let c = db(&t);
        let mut stmt = c
            .prepare(
                "SELECT queue, count(DISTINCT name) FROM jobs
                 WHERE state IN ('submitting', 'pending', 'running', 'unknown') GROUP BY queue",
            )
            .unwrap();
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?)))
            .unwrap();
        for (queue, n) in rows.map(Result::unwrap) {
            assert!(n <= caps[&queue], "run.db holds {n} open jobs in {queue}");
        }
        // `status` names a running job by its name and PBS's id.
        let out = t.run(&["status", "--run-dir", "run"], 0);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        live_ids.extend(
            text.lines()
                .filter(|l| l.contains(".pbshost)"))
                .map(str::to_string),
        );
        looks += 1;
    });
    assert_eq!(code, 0, "{err}");
    assert!(looks > 5, "the caps were looked at while the loop ran");
    assert_exact(&t, batches, batches * per);
    let all = jobs(&t);
    assert_eq!(all.len() as u64, batches, "one job per batch: {all:?}");
    assert!(
        all.iter().all(|j| is_pbs_id(&j.1) && j.3 == "completed"),
        "{all:?}"
    );
    let queues: Vec<&str> = all.iter().map(|j| j.2.as_str()).collect();
    assert!(
        queues.contains(&"debug") && queues.contains(&"preemptable"),
        "{queues:?}"
    );
    // PBS's own record agrees: each job finished (F), exit status 0, in its queue.
    for (_, id, queue, _, _) in &all {
        let job = qstat_job(id);
        assert_eq!(
            (job["job_state"].as_str(), job["Exit_status"].as_i64()),
            (Some("F"), Some(0)),
            "{id}"
        );
        assert_eq!(job["queue"].as_str(), Some(queue.as_str()), "{id}");
    }
    let seen: Vec<&String> = live_ids
        .iter()
        .filter(|l| {
            all.iter()
                .any(|j| l.contains(&format!("{} ({})", j.0, j.1)))
        })
        .collect();
    assert!(
        !seen.is_empty(),
        "status never showed a running job's PBS id: {live_ids:?}"
    );
    // report --trace: a row per job attempt, its native id PBS's; the HTML report shows them.
    t.run(
        &[
            "report",
            "--run-dir",
            "run",
            "--trace",
            "trace.tsv",
            "--html",
            "report.html",
        ],
        0,
    );
    let trace = std::fs::read_to_string(t.join("trace.tsv")).unwrap();
    let mut native: Vec<&str> = trace
        .lines()
        .skip(1)
        .map(|l| l.split('\t').nth(1).unwrap())
        .collect();
    native.sort();
    let mut ids: Vec<&str> = all.iter().map(|j| j.1.as_str()).collect();
    ids.sort();
    assert_eq!(native, ids, "{trace}");
    let html = std::fs::read_to_string(t.join("report.html")).unwrap();
    for id in ids {
        assert!(html.contains(id), "report.html lacks {id}");
    }
}

/// A queue the server does not have is refused before anything is stored or sent (exit code
/// 4), naming the server's queues as `qstat -Q -f -F json` lists them; `doctor --run-dir`
/// says the same.
#[test]
fn pbs_unknown_queue_is_refused_before_any_job_and_doctor_lists_the_servers_queues() {
    let test = "pbs_unknown_queue_is_refused_before_any_job_and_doctor_lists_the_servers_queues";
    if !pbs_up(test) {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(8, 4);
    std::fs::write(t.join("run.toml"), run_config("")).unwrap();
    let (code, err) = finish(spawn_submit(&t, &["--queue", "nosuchqueue=2"]), 120, || {});
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("the PBS server has no queue `nosuchqueue`")
            && err.contains("debug")
            && err.contains("preemptable")
            && err.contains("embedfleet queues set"),
        "{err}"
    );
    assert!(
        jobs(&t).iter().all(|j| j.1.is_empty()),
        "no job reached PBS"
    );
    // The refused submit kept no run config and no queues: doctor is given the config, and
    // reads the queues a user set by hand.
    t.run(&["queues", "set", "--run-dir", "run", "nosuchqueue=2"], 0);
    let out = t
        .cmd(&["doctor", "--run-dir", "run", "--config", "run.toml"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "problem: queue nosuchqueue: the PBS server has no queue `nosuchqueue` (its queues: "
        ) && text.contains("urgent"),
        "{text}"
    );
}

/// Sets the server's `acl_roots` back to root when dropped, however the test ends.
struct RootsRestored;

impl Drop for RootsRestored {
    fn drop(&mut self) {
        qmgr("set server acl_roots = root");
    }
}

/// The server refuses root's jobs unless its `acl_roots` names root (exit 175, "Bad UID for
/// job execution"): the preflight finds it before any job and says so in words, and `qsub`'s
/// own refusal is said the same way. Runs alone (.config/nextest.toml): while root is refused,
/// no other test's job could be submitted.
#[test]
fn pbs_root_refused_by_the_server_is_said_in_words() {
    use embedfleet_orchestrator::scheduler::{
        CommandConfig, JobScript, JobSubmission, PbsConfig, PbsScheduler, Scheduler,
    };
    if !pbs_up("pbs_root_refused_by_the_server_is_said_in_words") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping pbs_root_refused_by_the_server_is_said_in_words: not root");
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(8, 4);
    std::fs::write(t.join("run.toml"), run_config("")).unwrap();
    let _restore = RootsRestored;
    qmgr("unset server acl_roots");
    let (code, err) = finish(spawn_submit(&t, &["--queue", "debug=1"]), 120, || {});
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("this loop runs as root, and the PBS server does not run jobs as root unless its acl_roots names root")
            && err.contains("set server acl_roots = root"),
        "{err}"
    );
    assert!(
        jobs(&t).iter().all(|j| j.1.is_empty()),
        "no job reached PBS"
    );
    // qsub's own refusal: 175 and three words, said as what to do.
    let table: toml::Table = toml::from_str(&commands_table(&[])).unwrap();
    let config: PbsConfig = table["scheduler"]["pbs"].clone().try_into().unwrap();
    let pbs = PbsScheduler::new(config, CommandConfig::default());
    let script = t.join("true.sh");
    std::fs::write(&script, "#!/bin/bash\ntrue\n").unwrap();
    let job = JobSubmission::new("efroot", "debug", JobScript::Path(script)).workdir(t.path());
    let e = pbs.submit(&job).expect_err("root is refused").to_string();
    assert!(
        e.contains("acl_roots") && e.contains("qsub said: qsub: Bad UID for job execution"),
        "{e}"
    );
    assert!(!e.contains("exit status 175"), "{e}");
}

/// examples/run-pbs-polaris.toml's job, as `submit` sends it, accepted by the real `qsub` with
/// Polaris's resources defined on the server: PBS itself checks `-l select=1:ngpus=4:
/// system=polaris`, `-l filesystems=home:eagle`, `-A`, `-l walltime` and `-l place=scatter`.
/// Only the binary the job runs and the wrapped commands differ (and `-h`: the job is held,
/// never run, then deleted).
#[test]
fn pbs_the_polaris_example_is_accepted_by_a_real_qsub() {
    if !pbs_up("pbs_the_polaris_example_is_accepted_by_a_real_qsub") {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(8, 4);
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/run-pbs-polaris.toml");
    let mut config: toml::Table =
        toml::from_str(&std::fs::read_to_string(example).unwrap()).unwrap();
    let scheduler = config["scheduler"].as_table_mut().unwrap();
    let site_qsub: Vec<String> = scheduler["pbs"]["qsub"]["extra_args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let mut qsub_extra = vec!["-h"];
    qsub_extra.extend(site_qsub.iter().map(String::as_str));
    let commands: toml::Table = toml::from_str(&commands_table(&qsub_extra)).unwrap();
    let pbs = scheduler["pbs"].as_table_mut().unwrap();
    for (k, v) in commands["scheduler"]["pbs"].as_table().unwrap() {
        pbs.insert(k.clone(), v.clone());
    }
    scheduler["script"]
        .as_table_mut()
        .unwrap()
        .insert("embedfleet".into(), env!("CARGO_BIN_EXE_embedfleet").into());
    std::fs::write(t.join("run.toml"), toml::to_string(&config).unwrap()).unwrap();
    let child = spawn_submit(&t, &["--queue", "debug=1"]);
    let mut id = String::new();
    let (code, err) = finish_when_submitted(child, &t, &mut id);
    assert!(is_pbs_id(&id), "no job was accepted (exit {code}): {err}");
    let job = qstat_job(&id);
    pbs_ok("qdel", &[&id]);
    let res = &job["Resource_List"];
    assert_eq!(job["job_state"], "H", "{job}");
    assert_eq!(job["Account_Name"], "MyProject", "{job}");
    assert_eq!(res["select"], "1:ngpus=4:system=polaris", "{job}");
    assert_eq!(res["ngpus"], 4, "{job}");
    assert_eq!(res["filesystems"], "home:eagle", "{job}");
    assert_eq!(res["walltime"], "01:05:00", "{job}");
    assert_eq!(res["place"], "scatter", "{job}");
    assert_eq!(job["Rerunable"], "True", "{job}");
}

/// Waits until the loop's first job has PBS's id, then stops the loop (its job is held and
/// would never end); the loop's exit code and stderr.
fn finish_when_submitted(
    mut child: std::process::Child,
    t: &TestDir,
    id: &mut String,
) -> (i32, String) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::time::Instant::now() < end && child.try_wait().unwrap().is_none() {
        if let Some(j) = jobs(t).into_iter().find(|j| !j.1.is_empty()) {
            *id = j.1;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = child.kill();
    finish(child, 30, || {})
}
