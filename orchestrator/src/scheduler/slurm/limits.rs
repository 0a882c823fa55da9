//! The limit of jobs Slurm states for the run's user over the run's partitions: `MaxSubmitJobs`
//! (jobs queued and running) of the user's association (and its `GrpSubmitJobs`), and
//! `MaxSubmitJobsPerUser` of the QOS its jobs run under — the association's default QOS, and a
//! partition QOS that every partition of the run shares — read with `sacctmgr` and
//! `scontrol`. Each counts the user's jobs over everything it covers, so the lowest is the
//! run's limit (the user's other jobs count too). `MaxJobs` (running at once) is said beside
//! it: it holds jobs back in the queue, it refuses none. Limits are enforced only where
//! `AccountingStorageEnforce` has `limits`; a stated one is read either way.

use std::collections::BTreeMap;

use super::SlurmScheduler;
use crate::scheduler::command::user_name;
use crate::scheduler::{Call, JobLimit, SchedulerResult};

/// `sacctmgr`'s `-P` fields of an association and a QOS, in this order.
const ASSOC_FORMAT: &str = "format=Partition,MaxSubmit,GrpSubmit,MaxJobs,DefaultQOS,QOS";
const QOS_FORMAT: &str = "format=Name,MaxSubmitPU,MaxJobsPU";

/// One association row of the user's.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Assoc {
    pub partition: String,
    pub max_submit: Option<u32>,
    pub grp_submit: Option<u32>,
    pub max_jobs: Option<u32>,
    pub default_qos: String,
    pub qos: Vec<String>,
}

/// A QOS's per-user limits.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Qos {
    pub max_submit_pu: Option<u32>,
    pub max_jobs_pu: Option<u32>,
}

fn number(field: &str) -> Option<u32> {
    field.trim().parse().ok()
}

pub(super) fn parse_assocs(text: &str) -> Vec<Assoc> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split('|').collect();
            let at = |i: usize| f.get(i).copied().unwrap_or("");
            Assoc {
                partition: at(0).trim().to_string(),
                max_submit: number(at(1)),
                grp_submit: number(at(2)),
                max_jobs: number(at(3)),
                default_qos: at(4).trim().to_string(),
                qos: at(5)
                    .split(',')
                    .map(str::trim)
                    .filter(|q| !q.is_empty())
                    .map(String::from)
                    .collect(),
            }
        })
        .collect()
}

pub(super) fn parse_qos(text: &str) -> BTreeMap<String, Qos> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split('|').collect();
            let name = f.first()?.trim();
            (!name.is_empty()).then(|| {
                let at = |i: usize| f.get(i).copied().unwrap_or("");
                (
                    name.to_string(),
                    Qos {
                        max_submit_pu: number(at(1)),
                        max_jobs_pu: number(at(2)),
                    },
                )
            })
        })
        .collect()
}

/// Each partition's QOS from `scontrol show partition -o` (`QoS=N/A`: none).
pub(super) fn parse_partition_qos(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let field = |key: &str| {
                line.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(key))
                    .map(str::to_string)
            };
            let name = field("PartitionName=")?;
            let qos = field("QoS=").filter(|q| q != "N/A" && !q.is_empty())?;
            Some((name, qos))
        })
        .collect()
}

/// The lowest limit of the user's associations and QOS over `queues`, and where it is stated.
pub(super) fn lowest(
    assocs: &[Assoc],
    qos: &BTreeMap<String, Qos>,
    partition_qos: &BTreeMap<String, String>,
    queues: &[String],
) -> Option<JobLimit> {
    let mut found: Vec<(u32, String)> = Vec::new();
    let mut running: Vec<u32> = Vec::new();
    // The user's associations that cover every partition (none named).
    for a in assocs.iter().filter(|a| a.partition.is_empty()) {
        found.extend(a.max_submit.map(|n| (n, format!("association MaxSubmitJobs={n}"))));
        found.extend(a.grp_submit.map(|n| (n, format!("association GrpSubmitJobs={n}"))));
        running.extend(a.max_jobs);
    }
    let mut job_qos: Vec<String> = assocs
        .iter()
        .filter(|a| a.partition.is_empty())
        .filter_map(|a| match (a.default_qos.as_str(), a.qos.as_slice()) {
            ("", [only]) => Some(only.clone()),
            ("", _) => None,
            (d, _) => Some(d.to_string()),
        })
        .collect();
    // A partition QOS counts over the run's partitions only if all of them share it.
    let shared: Vec<&String> = queues.iter().filter_map(|q| partition_qos.get(q)).collect();
    if !queues.is_empty() && shared.len() == queues.len() && shared.iter().all(|q| *q == shared[0]) {
        job_qos.push(shared[0].clone());
    }
    job_qos.sort();
    job_qos.dedup();
    for name in job_qos {
        let Some(q) = qos.get(&name) else { continue };
        found.extend(
            q.max_submit_pu
                .map(|n| (n, format!("QOS {name} MaxSubmitJobsPerUser={n}"))),
        );
        running.extend(q.max_jobs_pu);
    }
    let (jobs, said) = found.into_iter().min_by_key(|(n, _)| *n)?;
    Some(JobLimit {
        jobs: Some(jobs),
        running: running.into_iter().min(),
        queues: BTreeMap::new(),
        said: format!("Slurm: {said}"),
    })
}

impl SlurmScheduler {
    /// See [`crate::scheduler::Scheduler::job_limit`].
    pub(super) fn read_job_limit(&self, queues: &[String]) -> SchedulerResult<Option<JobLimit>> {
        let Some(user) = user_name() else {
            return Ok(None);
        };
        let sacctmgr = |args: Vec<String>| {
            self.runner
                .run(&self.config.sacctmgr, "sacctmgr", Call::new(args))
                .map(|o| o.stdout)
        };
        let assocs = parse_assocs(&sacctmgr(vec![
            "-n".into(),
            "-P".into(),
            "show".into(),
            "assoc".into(),
            "where".into(),
            format!("user={user}"),
            ASSOC_FORMAT.into(),
        ])?);
        let qos = parse_qos(&sacctmgr(vec![
            "-n".into(),
            "-P".into(),
            "show".into(),
            "qos".into(),
            QOS_FORMAT.into(),
        ])?);
        let partitions = self
            .runner
            .run(
                &self.config.scontrol,
                "scontrol",
                Call::new(["show", "partition", "-o"]),
            )
            .map(|o| parse_partition_qos(&o.stdout))
            .unwrap_or_default();
        Ok(lowest(&assocs, &qos, &partitions, queues))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_stated_limit_over_the_runs_partitions_is_the_runs() {
        let assocs = parse_assocs(
            "|40||8|normal|normal,rtq\ngpu|2||||normal\n",
        );
        assert_eq!(assocs[0].max_submit, Some(40));
        assert_eq!(assocs[0].max_jobs, Some(8));
        assert_eq!(assocs[1].partition, "gpu");
        let qos = parse_qos("normal|||\nrtq|3|2|\n");
        assert_eq!(qos["rtq"].max_submit_pu, Some(3));
        let parts = parse_partition_qos(
            "PartitionName=a Nodes=vm QoS=rtq State=UP\nPartitionName=b QoS=rtq\nPartitionName=c QoS=N/A\n",
        );
        assert_eq!(parts.len(), 2);
        let queues = |q: &[&str]| q.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // Both partitions share QOS rtq: its 3 is below the association's 40.
        let limit = lowest(&assocs, &qos, &parts, &queues(&["a", "b"])).unwrap();
        assert_eq!(limit.jobs, Some(3));
        assert_eq!(limit.running, Some(2));
        assert!(limit.said.contains("QOS rtq MaxSubmitJobsPerUser=3"), "{}", limit.said);
        // One of the run's partitions has no partition QOS: rtq covers only part of the run
        // (a cap of that queue, not the run's); the association's 40 holds. A partition's own
        // association row (gpu's 2) is that queue's, not the run's either.
        let limit = lowest(&assocs, &qos, &parts, &queues(&["a", "c"])).unwrap();
        assert_eq!(limit.jobs, Some(40));
        assert!(limit.said.contains("association MaxSubmitJobs=40"));
        // Nothing stated: no limit.
        assert_eq!(lowest(&[], &qos, &parts, &queues(&["c"])), None);
        let open = parse_assocs("||||normal|normal\n");
        assert_eq!(lowest(&open, &qos, &parts, &queues(&["c"])), None);
    }
}
