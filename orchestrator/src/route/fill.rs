//! The static route: every queue filled up to its cap, in batch order, queues taking turns. No
//! I/O, so the cap arithmetic is tested directly.

use std::collections::{BTreeMap, BTreeSet};

/// One job to submit: its queue and its batches (one per node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedJob {
    pub queue: String,
    pub batches: Vec<i64>,
}

/// Fills every queue up to its cap with jobs of `nodes` batches, in batch order; queues take
/// turns one job at a time (in name order), so work spreads over queues rather than filling the
/// first one and starving the rest. `active` is the jobs each queue holds now (queued or
/// running); queues in `disabled` (a scheduler refused them this run) get nothing.
pub fn fill_queues(
    caps: &BTreeMap<String, u32>,
    active: &BTreeMap<String, u32>,
    disabled: &BTreeSet<String>,
    pending: &[i64],
    nodes: usize,
) -> Vec<PlannedJob> {
    let nodes = nodes.max(1);
    let mut room: Vec<(&String, u32)> = caps
        .iter()
        .filter(|(q, _)| !disabled.contains(*q))
        .map(|(q, cap)| (q, cap.saturating_sub(active.get(q).copied().unwrap_or(0))))
        .filter(|(_, room)| *room > 0)
        .collect();
    let mut batches = pending.chunks(nodes);
    let mut jobs = Vec::new();
    while !room.is_empty() {
        for (queue, left) in room.iter_mut() {
            let Some(chunk) = batches.next() else {
                return jobs;
            };
            jobs.push(PlannedJob {
                queue: queue.to_string(),
                batches: chunk.to_vec(),
            });
            *left -= 1;
        }
        room.retain(|(_, left)| *left > 0);
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn count(jobs: &[PlannedJob], queue: &str) -> usize {
        jobs.iter().filter(|j| j.queue == queue).count()
    }

    #[test]
    fn never_exceeds_a_cap_and_takes_batches_in_order() {
        let caps = map(&[("debug", 1), ("gpu", 3)]);
        let active = map(&[("gpu", 1)]);
        let jobs = fill_queues(&caps, &active, &BTreeSet::new(), &[4, 5, 6, 7, 8], 1);
        assert_eq!(count(&jobs, "debug"), 1);
        assert_eq!(count(&jobs, "gpu"), 2);
        let order: Vec<i64> = jobs.iter().flat_map(|j| j.batches.clone()).collect();
        assert_eq!(order, vec![4, 5, 6]);
        // Queues take turns: debug (first by name) then gpu, then gpu again.
        assert_eq!(jobs[0].queue, "debug");
        assert_eq!(jobs[1].queue, "gpu");
    }

    #[test]
    fn full_zero_and_disabled_queues_get_nothing() {
        let caps = map(&[("a", 2), ("b", 0), ("c", 5)]);
        let active = map(&[("a", 2)]);
        let disabled: BTreeSet<String> = ["c".to_string()].into();
        assert!(fill_queues(&caps, &active, &disabled, &[1, 2], 1).is_empty());
        // An over-full queue (cap lowered below what it holds) is not an underflow.
        let active = map(&[("a", 7)]);
        assert!(fill_queues(&caps, &active, &BTreeSet::new(), &[1], 1)
            .iter()
            .all(|j| j.queue == "c"));
    }

    #[test]
    fn multi_node_jobs_take_several_batches_and_the_last_may_be_short() {
        let caps = map(&[("prod", 8)]);
        let jobs = fill_queues(
            &caps,
            &BTreeMap::new(),
            &BTreeSet::new(),
            &[1, 2, 3, 4, 5],
            2,
        );
        let got: Vec<Vec<i64>> = jobs.into_iter().map(|j| j.batches).collect();
        assert_eq!(got, vec![vec![1, 2], vec![3, 4], vec![5]]);
    }

    #[test]
    fn stops_when_batches_run_out() {
        let caps = map(&[("a", 10), ("b", 10)]);
        let jobs = fill_queues(&caps, &BTreeMap::new(), &BTreeSet::new(), &[1, 2, 3], 1);
        assert_eq!(jobs.len(), 3);
        assert!(fill_queues(&caps, &BTreeMap::new(), &BTreeSet::new(), &[], 1).is_empty());
    }
}
