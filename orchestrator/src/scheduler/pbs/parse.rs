/*!
Parsers for `qstat` output and the mapping of PBS states onto [`JobState`].

Formats:
- PBS Pro `qstat -f -F json` (and `-x` for finished jobs), as on Polaris: `{"timestamp",
  "pbs_version", "pbs_server", "Jobs": {ID: {...}}}` with nested `Resource_List`,
  `resources_used`, `Variable_List` and `estimated` objects, numbers as numbers, times as
  ctime text and booleans as `"True"`. For ids it does not know it prints no `Jobs` key at all
  (and exits 153, printing the ones it knows).
- The text `qstat -f` of PBS Pro (`Job Id: ID`, attributes indented four spaces, values wrapped
  at about 80 columns onto lines starting with a tab) and of Torque and Slurm's
  `slurm-wlm-torque` (attributes indented by a tab, lowercase `exit_status` when present).
- `qstat -Q -f -F json`: `{"Queue": {NAME: {"enabled": "True", "started": "True", ...}}}`.

What a real OpenPBS 23.06 prints (the fixtures of `tests/fixtures/scheduler/pbs-real/`, made
by `.ci/pbs/collect-fixtures.sh`) decides the mapping: states `Q H W T M U` wait, `R E B S` run
(`B` is an array that began), `F` (with `-x`) and `X` (a subjob done while its array runs) are
ends; there is no `C`, which only Torque prints. An `Exit_status` is not an end by itself: a job
PBS requeued (preempted, or rerun after its server and MOM restarted) keeps its last run's
status (`-11`, `-4`) while it waits and runs again. A queued job whose `comment` says "Can Never
Run" is never started by PBS, which keeps it queued forever: it is a failure with PBS's words.
*/

use std::collections::BTreeMap;

use crate::scheduler::JobState;

/// One job's attributes as `qstat -f` printed them; nested JSON objects are flattened to
/// `Resource_List.walltime` like the text format.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PbsJob {
    /// Job id (`1234.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov`, `11`).
    pub id: String,
    /// Attributes by name.
    pub attrs: BTreeMap<String, String>,
}

impl PbsJob {
    /// An attribute, matched without regard to case (`Exit_status` vs `exit_status`).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The job's exit status, when PBS recorded one (of its last run: see the module's doc).
    pub fn exit_status(&self) -> Option<i32> {
        self.get("Exit_status")?.trim().parse().ok()
    }

    /// PBS Pro's substate of a finished job says how it ended, where `Exit_status` may not: 91
    /// deleted (`qdel`, queued or running: a running one may show `Exit_status` 0), 92 finished,
    /// 93 failed.
    fn substate(&self) -> Option<u32> {
        self.get("substate")?.trim().parse().ok()
    }

    /// Why PBS will never start this queued job, in its words: the part of its `comment` after
    /// "Can Never Run: " (`Insufficient amount of resource: ncpus (R: 64 A: 16 T: 16)`).
    pub fn can_never_run(&self) -> Option<&str> {
        let comment = self.get("comment")?;
        let at = comment.find("Can Never Run")?;
        let why = comment[at + "Can Never Run".len()..].trim_start_matches([':', ' ']);
        Some(why.trim())
    }

    /// When PBS Pro's scheduler expects the queued job to start (`estimated.start_time`, set
    /// where the site computes it: strict ordering or backfill), in unix seconds: the text form
    /// `Thu Dec  3 22:40:00 2026` (this host's zone), or seconds as some JSON versions print.
    pub fn estimated_start_s(&self) -> Option<f64> {
        let text = self.get("estimated.start_time")?.trim();
        if let Ok(secs) = text.parse::<i64>() {
            return Some(secs as f64);
        }
        ctime_s(text)
    }
}

/// `Thu Dec  3 22:40:00 2026` (ctime's form) in this host's zone, as unix seconds.
fn ctime_s(text: &str) -> Option<f64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [_weekday, month, day, time, year] = parts.as_slice() else {
        return None;
    };
    let month = MONTHS.iter().position(|m| m.eq_ignore_ascii_case(month))? as i32 + 1;
    let t: Vec<i32> = time.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let [h, m, s] = t.as_slice() else {
        return None;
    };
    crate::scheduler::state::local_unix_s(year.parse().ok()?, month, day.parse().ok()?, *h, *m, *s)
}

/// Parses `qstat -f -F json` output.
pub fn parse_qstat_json(text: &str) -> Result<Vec<PbsJob>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    let Some(jobs) = value.get("Jobs") else {
        // qstat prints no "Jobs" key when none of the asked-for jobs exists.
        return match value.is_object() {
            true => Ok(Vec::new()),
            false => Err("expected a JSON object".to_string()),
        };
    };
    let jobs = jobs.as_object().ok_or("`Jobs` is not an object")?;
    Ok(jobs
        .iter()
        .map(|(id, v)| {
            let mut attrs = BTreeMap::new();
            flatten("", v, &mut attrs);
            PbsJob {
                id: id.clone(),
                attrs,
            }
        })
        .collect())
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::String(s) => {
            out.insert(prefix.to_string(), s.clone());
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// Parses text `qstat -f` output (PBS Pro, Torque, `slurm-wlm-torque`).
pub fn parse_qstat_text(text: &str) -> Result<Vec<PbsJob>, String> {
    let mut jobs: Vec<PbsJob> = Vec::new();
    let mut indent: Option<String> = None;
    let mut last_key: Option<String> = None;
    for line in text.lines() {
        if let Some(id) = line.strip_prefix("Job Id:") {
            jobs.push(PbsJob {
                id: id.trim().to_string(),
                attrs: BTreeMap::new(),
            });
            indent = None;
            last_key = None;
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let Some(job) = jobs.last_mut() else {
            return Err(format!("attribute before any `Job Id:` line: {line:?}"));
        };
        let lead = &line[..line.len() - line.trim_start().len()];
        let ind = indent.get_or_insert_with(|| lead.to_string());
        match line.trim_start().split_once(" = ") {
            // An attribute line has the job's attribute indentation; PBS Pro continues long
            // values on lines starting with a tab, which may contain " = " themselves.
            Some((k, v)) if lead == ind.as_str() => {
                job.attrs.insert(k.trim().to_string(), v.to_string());
                last_key = Some(k.trim().to_string());
            }
            _ => match &last_key {
                Some(k) => {
                    let v = job
                        .attrs
                        .get_mut(k)
                        .expect("last key was inserted. This is a bug.");
                    v.push_str(line.trim_start_matches('\t'));
                }
                None => return Err(format!("continuation line without an attribute: {line:?}")),
            },
        }
    }
    Ok(jobs)
}

/// PBS Pro `JOB_EXEC_*` exit statuses that are not the script's own (src/include/job.h).
fn exec_code_state(code: i32) -> JobState {
    match code {
        -29 => JobState::Timeout,
        -26 | -27 => JobState::OutOfMemory,
        // Mother superior or sister node failed; JOB_EXEC_RETRY: failed before it could run;
        // JOB_EXEC_INITABT/INITRST/INITRMG: its MOM restarted under it (a job that may not be
        // rerun ends so).
        -20 | -14 | -3 | -4 | -5 | -6 => JobState::NodeFail,
        // JOB_EXEC_RERUN as an end: requeued for a preemption, and then not run again.
        -11 => JobState::Preempted,
        _ => JobState::Failed {
            exit_code: Some(code),
            reason: format!("PBS could not run the job (JOB_EXEC code {code})"),
        },
    }
}

/// Maps a `qstat -f` job onto [`JobState`]. `cancelled` says whether this process asked PBS to
/// delete the job; `marker` is the state from the job's completion marker, if it left one.
pub fn pbs_state(job: &PbsJob, cancelled: bool, marker: Option<JobState>) -> JobState {
    let state = job.get("job_state").unwrap_or("").trim();
    match state {
        // PBS keeps a job it can never run queued forever; the backend deletes it.
        "Q" => match job.can_never_run() {
            Some(why) => JobState::Failed {
                exit_code: None,
                reason: format!("PBS can never run it: {why}"),
            },
            None => JobState::Pending,
        },
        "H" | "W" | "T" | "M" | "U" => JobState::Pending,
        // Whatever `Exit_status` says: a running job's is its last run's.
        "R" | "E" | "B" | "S" => JobState::Running,
        "F" | "X" | "C" => finished(job, cancelled, marker),
        other => JobState::Failed {
            exit_code: None,
            reason: format!("unrecognised PBS job_state {other:?}"),
        },
    }
}

fn finished(job: &PbsJob, cancelled: bool, marker: Option<JobState>) -> JobState {
    let comment = job.get("comment").unwrap_or("").to_lowercase();
    let walltime = comment.contains("walltime") && comment.contains("exceeded");
    // A real OpenPBS says "... and terminated" (queued) or "... and terminated by USER@HOST"
    // (running), with substate 91; others have said "deleted ... via qdel".
    let deleted = job.substate() == Some(91)
        || comment.contains("terminated")
        || comment.contains("qdel")
        || comment.contains("deleted");
    match job.exit_status() {
        // A running job deleted may end with status 0 (its shell killed first): the marker
        // says whether its script got to the end.
        Some(0) if (cancelled || deleted) && marker != Some(JobState::Completed) => {
            JobState::Cancelled
        }
        Some(0) => JobState::Completed,
        Some(code) if code < 0 => exec_code_state(code),
        _ if walltime => JobState::Timeout,
        Some(_) if cancelled || deleted => JobState::Cancelled,
        Some(code) if code > 256 => JobState::Failed {
            exit_code: None,
            reason: format!("killed by signal {}", code - 256),
        },
        Some(code) => JobState::from_exit_code(code),
        // No exit status: deleted while queued (PBS Pro), or Slurm's Torque wrapper, which
        // never prints one: the marker knows. A cancelled job's script may still record the
        // signal's 143 in its marker.
        None => match marker {
            Some(JobState::Completed) => JobState::Completed,
            _ if cancelled || deleted => JobState::Cancelled,
            Some(m) => m,
            None => JobState::Failed {
                exit_code: None,
                reason: "the job finished but qstat shows no exit status and the job left no \
                         completion marker"
                    .to_string(),
            },
        },
    }
}

/// One queue of `qstat -Q -f -F json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PbsQueue {
    /// Its name.
    pub name: String,
    /// `enabled`: it takes new jobs.
    pub enabled: bool,
    /// `started`: its jobs are scheduled.
    pub started: bool,
}

/// Parses `qstat -Q -f -F json` (PBS Pro): the server's queues, in its order.
pub fn parse_queues_json(text: &str) -> Result<Vec<PbsQueue>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    let Some(queues) = value.get("Queue") else {
        return Ok(Vec::new());
    };
    let queues = queues.as_object().ok_or("`Queue` is not an object")?;
    let yes = |q: &serde_json::Value, key: &str| {
        q.get(key)
            .and_then(|v| v.as_str())
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    };
    Ok(queues
        .iter()
        .map(|(name, q)| PbsQueue {
            name: name.clone(),
            enabled: yes(q, "enabled"),
            started: yes(q, "started"),
        })
        .collect())
}

/// The users a PBS Pro server runs jobs of root for (`acl_roots` of `qstat -B -f -F json`);
/// `None` when the answer has no server in it.
pub fn parse_acl_roots(text: &str) -> Result<Option<Vec<String>>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    let Some(server) = value
        .get("Server")
        .and_then(|s| s.as_object())
        .and_then(|s| s.values().next())
    else {
        return Ok(None);
    };
    let roots = server.get("acl_roots").and_then(|v| v.as_str()).unwrap_or("");
    Ok(Some(
        roots
            .split(',')
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .collect(),
    ))
}
