//! The PBS parsers against what a real OpenPBS 23.06.06 printed: the fixtures of
//! `tests/fixtures/scheduler/pbs-real/`, made by `.ci/pbs/collect-fixtures.sh` driving the
//! one-node server of `.ci/pbs/` through every job state (index.tsv: each file's case, qstat's
//! exit code, the ids asked for, qstat's stderr). No scheduler needed.

use std::path::PathBuf;

use embedfleet_orchestrator::scheduler::{
    parse_acl_roots, parse_qstat_json, parse_qstat_text, parse_queues_json, pbs_state, JobState,
    PbsJob,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/scheduler/pbs-real")
}

fn read(file: &str) -> String {
    let path = dir().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// One line of index.tsv.
struct Entry {
    case: String,
    file: String,
    exit: i32,
    ids: Vec<String>,
    stderr: String,
}

fn index() -> Vec<Entry> {
    read("index.tsv")
        .lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            Entry {
                case: f[0].to_string(),
                file: f[1].to_string(),
                exit: f[2].parse().unwrap(),
                ids: f[3].split_whitespace().map(str::to_string).collect(),
                stderr: f.get(4).unwrap_or(&"").to_string(),
            }
        })
        .collect()
}

fn entry(file: &str) -> Entry {
    index()
        .into_iter()
        .find(|e| e.file == file)
        .unwrap_or_else(|| panic!("{file} is not in index.tsv"))
}

/// The `n`th id case `case` asked `qstat` about (index.tsv): the fixtures' ids are the real
/// server's, and a new collection gives others.
fn id(case: &str, n: usize) -> String {
    entry(&format!("{case}.json")).ids[n].clone()
}

/// The jobs of case `case`'s JSON.
fn jobs(case: &str) -> Vec<PbsJob> {
    parse_qstat_json(&read(&format!("{case}.json"))).unwrap()
}

fn job(case: &str, id: &str) -> PbsJob {
    jobs(case)
        .into_iter()
        .find(|j| j.id == id)
        .unwrap_or_else(|| panic!("{case}: no job {id}"))
}

fn state(case: &str, id: &str) -> JobState {
    pbs_state(&job(case, id), false, None)
}

fn failed(code: Option<i32>, reason: &str) -> JobState {
    JobState::Failed {
        exit_code: code,
        reason: reason.to_string(),
    }
}

#[test]
fn every_case_reads_the_same_from_json_and_from_wrapped_text() {
    let cases: Vec<Entry> = index()
        .into_iter()
        .filter(|e| e.file.ends_with(".json") && e.ids.iter().any(|i| i.contains(".pbshost")))
        .collect();
    assert!(cases.len() >= 15, "{} cases", cases.len());
    for e in cases {
        let json = parse_qstat_json(&read(&e.file)).unwrap();
        if json.is_empty() {
            continue; // unknown ids only: `unknown_ids_...` below
        }
        let text_file = e.file.replace(".json", ".txt");
        let text = read(&text_file);
        let from_text = parse_qstat_text(&text).unwrap();
        let ids = |jobs: &[PbsJob]| {
            let mut ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
            ids.sort();
            ids
        };
        assert_eq!(ids(&json), ids(&from_text), "{}", e.case);
        for a in &json {
            let b = from_text.iter().find(|b| b.id == a.id).unwrap();
            for key in [
                "job_state",
                "Exit_status",
                "comment",
                "run_count",
                "substate",
            ] {
                assert_eq!(a.get(key), b.get(key), "{} {}: {key}", e.case, a.id);
            }
            // A value wrapped onto TAB-led lines reads whole (JSON flattens Variable_List
            // to one attribute per variable; text keeps it one comma-separated value).
            let workdir = a.get("Variable_List.PBS_O_WORKDIR").unwrap();
            let vars = b.get("Variable_List").unwrap();
            assert!(
                vars.contains(&format!("PBS_O_WORKDIR={workdir}")),
                "{}: {vars}",
                e.case
            );
            assert_eq!(
                pbs_state(a, false, None),
                pbs_state(b, false, None),
                "{} {}",
                e.case,
                a.id
            );
        }
        // The text really was wrapped: long values continue on lines that start with a TAB.
        assert!(text.lines().any(|l| l.starts_with('\t')), "{text_file}");
    }
}

#[test]
fn waiting_and_running_jobs_whatever_their_exit_status() {
    assert_eq!(state("queued", &id("queued", 0)), JobState::Pending);
    assert_eq!(state("held", &id("held", 0)), JobState::Pending);
    assert_eq!(job("held", &id("held", 0)).get("job_state"), Some("H"));
    assert_eq!(state("released", &id("released", 0)), JobState::Running);
    assert_eq!(state("running", &id("running", 0)), JobState::Running);
    // Preempted by requeue (preempt_order R): back in its queue with the killed run's
    // Exit_status -11, then running again with it still there. Neither is an end.
    let victim = job("preempted", &id("preempted", 0));
    assert_eq!(
        (victim.get("job_state"), victim.exit_status()),
        (Some("Q"), Some(-11))
    );
    assert_eq!(state("preempted", &id("preempted", 0)), JobState::Pending);
    assert_eq!(state("preempted", &id("preempted", 1)), JobState::Running);
    let again = job("preempted_running_again", &id("preempted_running_again", 0));
    assert_eq!(
        (again.exit_status(), again.get("run_count")),
        (Some(-11), Some("2"))
    );
    assert_eq!(
        state("preempted_running_again", &id("preempted_running_again", 0)),
        JobState::Running
    );
    // The server and its MOM restarted under a rerunnable job: PBS ran it again.
    assert_eq!(
        job("restarted_rerun", &id("restarted_rerun", 0)).get("run_count"),
        Some("2")
    );
    assert_eq!(
        state("restarted_rerun", &id("restarted_rerun", 0)),
        JobState::Running
    );
}

#[test]
fn arrays_began_subjobs_done_and_arrays_finished() {
    // Ids as PBS prints them: the array `N[]`, its subjobs `N[i]`.
    let ids: Vec<String> = parse_qstat_text(&read("array_running.txt"))
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, entry("array_running.json").ids);
    assert!(
        ids[0].ends_with("[].pbshost") && ids[1].ends_with("[0].pbshost"),
        "{ids:?}"
    );
    assert_eq!(
        job("array_running", &id("array_running", 0)).get("job_state"),
        Some("B")
    );
    assert_eq!(
        state("array_running", &id("array_running", 0)),
        JobState::Running
    );
    // A subjob done while its array runs is `X`.
    assert_eq!(
        job("array_running", &id("array_running", 1)).get("job_state"),
        Some("X")
    );
    assert_eq!(
        state("array_running", &id("array_running", 1)),
        JobState::Completed
    );
    assert_eq!(
        state("array_running", &id("array_running", 2)),
        JobState::Running
    );
    assert_eq!(
        state("array_queued", &id("array_queued", 0)),
        JobState::Pending
    );
    assert_eq!(
        state("array_finished", &id("array_finished", 0)),
        JobState::Completed
    );
    assert_eq!(
        state("array_finished", &id("array_finished", 1)),
        JobState::Completed
    );
}

#[test]
fn how_finished_jobs_ended() {
    assert_eq!(
        state("finished_0", &id("finished_0", 0)),
        JobState::Completed
    );
    assert_eq!(
        state("finished_3", &id("finished_3", 0)),
        failed(Some(3), "exit code 3")
    );
    let wall = job("walltime_exceeded", &id("walltime_exceeded", 0));
    assert_eq!(wall.exit_status(), Some(-29));
    assert_eq!(
        state("walltime_exceeded", &id("walltime_exceeded", 0)),
        JobState::Timeout
    );
    // qdel of a queued job: no Exit_status at all.
    let queued = job("deleted_queued", &id("deleted_queued", 0));
    assert_eq!(
        (queued.get("job_state"), queued.exit_status()),
        (Some("F"), None)
    );
    assert_eq!(
        state("deleted_queued", &id("deleted_queued", 0)),
        JobState::Cancelled
    );
    // qdel of a running job: this server said Exit_status 0, "terminated by root@pbshost".
    let running = job("deleted_running", &id("deleted_running", 0));
    assert_eq!(running.exit_status(), Some(0));
    assert_eq!(
        state("deleted_running", &id("deleted_running", 0)),
        JobState::Cancelled
    );
    // ... unless the job's own marker says its script ran to its end.
    assert_eq!(
        pbs_state(&running, false, Some(JobState::Completed)),
        JobState::Completed
    );
    assert_eq!(pbs_state(&running, true, None), JobState::Cancelled);
}

#[test]
fn a_job_that_can_never_run_fails_with_pbs_words() {
    let never = job("can_never_run", &id("can_never_run", 0));
    assert_eq!(never.get("job_state"), Some("Q"));
    assert_eq!(
        never.can_never_run(),
        Some("Insufficient amount of resource: ncpus (R: 64 A: 16 T: 16)")
    );
    assert_eq!(
        state("can_never_run", &id("can_never_run", 0)),
        failed(
            None,
            "PBS can never run it: Insufficient amount of resource: ncpus (R: 64 A: 16 T: 16)"
        )
    );
    // Waiting for resources held by others is no such failure.
    assert_eq!(job("queued", &id("queued", 0)).can_never_run(), None);
}

#[test]
fn unknown_ids_finished_ids_without_x_and_unknown_queues() {
    // Unknown alone: no `Jobs` key, no trailing newline, exit 153.
    let unknown = entry("unknown.json");
    assert_eq!(unknown.exit, 153);
    assert!(unknown.stderr.contains("Unknown Job Id 999999.pbshost"));
    let raw = read("unknown.json");
    assert!(!raw.contains("\"Jobs\"") && !raw.ends_with('\n'), "{raw:?}");
    assert_eq!(parse_qstat_json(&raw).unwrap(), vec![]);
    assert_eq!(read("unknown.txt"), "");
    // With others: exit 153 still, and the known ones printed.
    let several = entry("several_one_unknown.json");
    assert_eq!(several.exit, 153);
    assert_eq!(several.ids.len(), 3);
    let mut found: Vec<String> = jobs("several_one_unknown")
        .into_iter()
        .map(|j| j.id)
        .collect();
    found.sort();
    let mut asked = several.ids.clone();
    asked.retain(|i| i != "999999.pbshost");
    asked.sort();
    assert_eq!(found, asked);
    assert_eq!(entry("several_one_unknown.txt").exit, 153);
    // A finished job without -x: exit 35, and its words.
    let no_x = entry("finished_without_x.json");
    assert_eq!(no_x.exit, 35);
    assert!(
        no_x.stderr.contains("Job has finished, use -x"),
        "{}",
        no_x.stderr
    );
    assert_eq!(entry("unknown_queue.json").exit, 170);
    assert!(entry("unknown_queue.json")
        .stderr
        .contains("Unknown queue nosuchqueue"));
}

#[test]
fn queues_from_qstat_q_json() {
    let queues = parse_queues_json(&read("queues.json")).unwrap();
    let names: Vec<&str> = queues.iter().map(|q| q.name.as_str()).collect();
    for name in ["debug", "preemptable", "urgent"] {
        assert!(names.contains(&name), "{names:?}");
    }
    assert!(queues.iter().all(|q| q.enabled && q.started), "{queues:?}");
    // An unknown queue's answer holds no `Queue` key.
    assert_eq!(
        parse_queues_json(&read("unknown_queue.json")).unwrap(),
        vec![]
    );
    let server = r#"{"Server":{"pbshost":{"server_state":"Active","acl_roots":"root,ops@login"}}}"#;
    assert_eq!(
        parse_acl_roots(server).unwrap(),
        Some(vec!["root".to_string(), "ops@login".to_string()])
    );
    assert_eq!(
        parse_acl_roots(r#"{"Server":{"s":{}}}"#).unwrap(),
        Some(vec![])
    );
}

#[test]
fn the_schedulers_estimated_start_from_real_qstat() {
    let queued = job("queued_estimated", &id("queued_estimated", 0));
    let from_text = parse_qstat_text(&read("queued_estimated.txt")).unwrap();
    let est = queued.estimated_start_s().expect("an estimate");
    assert_eq!(from_text[0].estimated_start_s(), Some(est));
    // Read in this host's zone like every ctime PBS prints: measured against the job's own
    // qtime, read the same way. The job waits for a blocker of 10 minutes' walltime.
    let mut qtime = PbsJob::default();
    qtime.attrs.insert(
        "estimated.start_time".into(),
        queued.get("qtime").unwrap().into(),
    );
    let wait = est - qtime.estimated_start_s().unwrap();
    assert!((0.0..=600.0).contains(&wait), "{wait} s");
    assert_eq!(job("queued", &id("queued", 0)).estimated_start_s(), None);
}
