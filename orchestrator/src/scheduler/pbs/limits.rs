//! The limits of jobs PBS Professional states for the run's user: `max_queued` (jobs queued
//! and running) and `max_run` (running at once) of the server (`qstat -B -f`) and of each queue
//! (`qstat -Q -f`), both readable by any user. Each attribute is a list of entries such as
//! `[u:PBS_GENERIC=30]` (every user), `[u:alice=12]` (one user: it replaces the generic entry
//! for her) and `[o:PBS_ALL=100]` (all users' jobs together, so others' jobs count too). The
//! server's limit counts the user's jobs in every queue, so it is the run's; a queue's counts
//! that queue's jobs only, so it caps that queue (and is the run's when the run has no other).
//! Group and project entries (`g:`, `p:`) are not read: which group or project a job is
//! charged to is the site's, not the loop's to know. The text form is read, not `-F json`:
//! the JSON repeats the key `max_queued` once per entry, which a JSON object cannot hold.

use std::collections::BTreeMap;

use super::PbsScheduler;
use crate::scheduler::command::user_name;
use crate::scheduler::{Call, JobLimit, SchedulerResult};

/// `max_queued` and `max_run` entries of one server or queue, as printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Limits {
    pub max_queued: Vec<Entry>,
    pub max_run: Vec<Entry>,
}

/// One `[kind:name=N]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub kind: char,
    pub name: String,
    pub n: u32,
}

/// Every `[k:name=N]` in an attribute's value (one entry a line, or several joined by commas).
fn entries(value: &str) -> Vec<Entry> {
    value
        .split('[')
        .filter_map(|part| {
            let inner = part.split(']').next()?.trim();
            let (kind, rest) = inner.split_once(':')?;
            let (name, n) = rest.split_once('=')?;
            Some(Entry {
                kind: kind.trim().chars().next()?,
                name: name.trim().to_string(),
                n: n.trim().parse().ok()?,
            })
        })
        .collect()
}

/// The limits of each object in `qstat -B -f` or `qstat -Q -f` text (`Server: NAME` or
/// `Queue: NAME`, attributes indented four spaces, a long value wrapped onto lines starting
/// with a tab), by the object's name.
pub(super) fn parse_limits(text: &str) -> BTreeMap<String, Limits> {
    let mut found: BTreeMap<String, Limits> = BTreeMap::new();
    let mut object: Option<String> = None;
    let mut attr: Option<(String, String)> = None;
    let mut flush = |object: &Option<String>, attr: &mut Option<(String, String)>| {
        let (Some(name), Some((key, value))) = (object, attr.take()) else {
            return;
        };
        let limits = found.entry(name.clone()).or_default();
        match key.as_str() {
            "max_queued" => limits.max_queued.extend(entries(&value)),
            "max_run" => limits.max_run.extend(entries(&value)),
            _ => {}
        }
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix('\t') {
            if let Some((_, value)) = attr.as_mut() {
                value.push_str(rest);
            }
            continue;
        }
        flush(&object, &mut attr);
        let header = line
            .strip_prefix("Server:")
            .or_else(|| line.strip_prefix("Queue:"));
        if let Some(name) = header {
            object = Some(name.trim().to_string());
        } else if let Some((key, value)) = line.trim().split_once(" = ") {
            attr = Some((key.trim().to_string(), value.to_string()));
        }
    }
    flush(&object, &mut attr);
    found
}

/// What `entries` allow `user`: their own entry, else the generic one; and all users'
/// together. The lowest, with where it is stated.
fn for_user(entries: &[Entry], user: &str) -> Option<(u32, String)> {
    let own = entries.iter().find(|e| e.kind == 'u' && e.name == user);
    let user_limit = own.or_else(|| {
        entries
            .iter()
            .find(|e| e.kind == 'u' && e.name == "PBS_GENERIC")
    });
    let overall = entries
        .iter()
        .find(|e| e.kind == 'o' && e.name == "PBS_ALL");
    [user_limit, overall]
        .into_iter()
        .flatten()
        .map(|e| (e.n, format!("[{}:{}={}]", e.kind, e.name, e.n)))
        .min_by_key(|(n, _)| *n)
}

/// The run's limits for `user` over `queues`: the server's, each queue's own, and where they
/// are stated. None when nothing applies.
pub(super) fn lowest(
    server: &BTreeMap<String, Limits>,
    queue_limits: &BTreeMap<String, Limits>,
    queues: &[String],
    user: &str,
) -> Option<JobLimit> {
    let mut said = Vec::new();
    let mut jobs: Option<u32> = None;
    let mut running: Option<u32> = None;
    let lower = |slot: &mut Option<u32>, n: u32| *slot = Some(slot.map_or(n, |s| s.min(n)));
    for limits in server.values() {
        if let Some((n, entry)) = for_user(&limits.max_queued, user) {
            lower(&mut jobs, n);
            said.push(format!("server max_queued {entry}"));
        }
        if let Some((n, entry)) = for_user(&limits.max_run, user) {
            lower(&mut running, n);
            said.push(format!("server max_run {entry}"));
        }
    }
    let mut per_queue = BTreeMap::new();
    for q in queues {
        let Some(limits) = queue_limits.get(q) else {
            continue;
        };
        if let Some((n, entry)) = for_user(&limits.max_queued, user) {
            per_queue.insert(q.clone(), n);
            said.push(format!("queue {q} max_queued {entry}"));
        }
        if let Some((n, entry)) = for_user(&limits.max_run, user) {
            said.push(format!("queue {q} max_run {entry}"));
            // A queue's running limit holds the whole run back only when it is the run's one.
            if queues.len() == 1 {
                lower(&mut running, n);
            }
        }
    }
    // A queue's own limit is the run's when the run has no other queue.
    if let [only] = queues {
        if let Some(n) = per_queue.get(only) {
            lower(&mut jobs, *n);
        }
    }
    (jobs.is_some() || running.is_some() || !per_queue.is_empty()).then(|| JobLimit {
        jobs,
        running,
        queues: per_queue,
        said: format!("PBS: {}", said.join(", ")),
    })
}

impl PbsScheduler {
    /// See [`crate::scheduler::Scheduler::job_limit`]. Torque states its limits otherwise
    /// (`max_user_queuable`): none read there.
    pub(super) fn read_job_limit(&self, queues: &[String]) -> SchedulerResult<Option<JobLimit>> {
        let Some(user) = user_name() else {
            return Ok(None);
        };
        if self.config.flavor != super::PbsFlavor::Pro {
            return Ok(None);
        }
        let qstat = |args: [&str; 2]| {
            self.runner
                .run(&self.config.qstat, "qstat", Call::new(args))
                .map(|o| parse_limits(&o.stdout))
        };
        let server = qstat(["-B", "-f"])?;
        let queue_limits = qstat(["-Q", "-f"])?;
        Ok(lowest(&server, &queue_limits, queues, &user))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_own_entry_replaces_the_generic_one_and_all_users_together_still_count() {
        let e = entries("[u:PBS_GENERIC=30], [u:alice=12],[o:PBS_ALL=100] [g:staff=2]");
        assert_eq!(e.len(), 4);
        assert_eq!(for_user(&e, "alice"), Some((12, "[u:alice=12]".into())));
        assert_eq!(for_user(&e, "bob"), Some((30, "[u:PBS_GENERIC=30]".into())));
        let e = entries("[u:PBS_GENERIC=300],[o:PBS_ALL=100]");
        assert_eq!(for_user(&e, "bob"), Some((100, "[o:PBS_ALL=100]".into())));
        // A group's entry is not the user's to know: nothing applies.
        assert_eq!(for_user(&entries("[g:staff=2]"), "bob"), None);
        assert!(entries("30").is_empty());
    }

    /// What a real OpenPBS 23.06.06 printed to an ordinary user (`pbsuser`) with these set by
    /// qmgr (.ci/pbs/collect-fixtures.sh): server `max_queued` `[o:PBS_ALL=100]`,
    /// `[u:PBS_GENERIC=30]`, `[u:pbsuser=12]` and `max_run` `[u:PBS_GENERIC=20]`; queue
    /// `preemptable` `max_queued` `[u:PBS_GENERIC=5]` and `max_run` `[u:pbsuser=3]`.
    #[test]
    fn the_real_servers_limits_are_read_for_its_user() {
        let server = parse_limits(include_str!(
            "../../../tests/fixtures/scheduler/pbs-real/limits_server.txt"
        ));
        let queues = parse_limits(include_str!(
            "../../../tests/fixtures/scheduler/pbs-real/limits_queues.txt"
        ));
        assert_eq!(server["pbshost"].max_queued.len(), 3);
        assert!(queues["debug"].max_queued.is_empty());
        let names = |q: &[&str]| q.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let run = names(&["debug", "preemptable"]);
        let limit = lowest(&server, &queues, &run, "pbsuser").unwrap();
        assert_eq!(limit.jobs, Some(12));
        assert_eq!(limit.running, Some(20));
        assert_eq!(limit.queues, BTreeMap::from([("preemptable".to_string(), 5)]));
        assert!(limit.said.contains("server max_queued [u:pbsuser=12]"), "{}", limit.said);
        assert!(limit.said.contains("queue preemptable max_run [u:pbsuser=3]"));
        // Another user gets the generic 30; the queue's `[u:pbsuser=3]` is not theirs.
        let other = lowest(&server, &queues, &names(&["preemptable"]), "bob").unwrap();
        assert_eq!((other.jobs, other.running), (Some(5), Some(20)));
        // The run's one queue: its own limits are the run's.
        let one = lowest(&server, &queues, &names(&["preemptable"]), "pbsuser").unwrap();
        assert_eq!((one.jobs, one.running), (Some(5), Some(3)));
    }

    #[test]
    fn a_wrapped_value_is_read_whole() {
        let text = "Queue: q\n    max_queued = [u:PBS_GENERIC=5], [u:a_very_long_user_na\n\tme=3]\n    enabled = True\n";
        let l = parse_limits(text);
        assert_eq!(l["q"].max_queued.len(), 2);
        assert_eq!(l["q"].max_queued[1].name, "a_very_long_user_name");
    }

    #[test]
    fn several_queues_each_keep_their_own_limit_and_one_queue_alone_is_the_runs() {
        let server = BTreeMap::new();
        let mut queues = BTreeMap::new();
        queues.insert(
            "a".to_string(),
            Limits {
                max_queued: entries("[u:PBS_GENERIC=5]"),
                max_run: entries("[u:PBS_GENERIC=2]"),
            },
        );
        let names = |q: &[&str]| q.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let two = lowest(&server, &queues, &names(&["a", "b"]), "bob").unwrap();
        assert_eq!((two.jobs, two.running), (None, None));
        assert_eq!(two.queues.get("a"), Some(&5));
        let one = lowest(&server, &queues, &names(&["a"]), "bob").unwrap();
        assert_eq!((one.jobs, one.running), (Some(5), Some(2)));
        assert_eq!(lowest(&server, &queues, &names(&["b"]), "bob"), None);
    }
}
