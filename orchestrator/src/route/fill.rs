//! The static route: every queue filled up to its cap, in batch order, queues taking turns
//! (in name order), and no more jobs in all than the run's `max_jobs`. No I/O, so the cap
//! arithmetic is tested directly.

use super::Round;

/// One job to submit: its queue and its batches (one per node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedJob {
    pub queue: String,
    pub batches: Vec<i64>,
}

/// Fills every usable queue up to its cap with jobs of its `nodes` batches, in batch order;
/// queues take turns one job at a time (in the order given: name order), so work spreads over
/// queues rather than filling the first one and starving the rest. A queue's open jobs (queued,
/// running or being cancelled) count toward its cap, and every queue's toward `max_jobs`.
/// Also says whether it ran out of a cut `pending` list (the jobs are then not all there are).
pub fn fill_queues(round: &Round<'_>) -> (Vec<PlannedJob>, bool) {
    let mut room: Vec<(&str, usize, u32)> = round
        .queues
        .iter()
        .filter(|q| q.usable)
        .map(|q| {
            let left = q.cap.saturating_sub(q.jobs.len() as u32);
            (q.name.as_str(), q.nodes.max(1), left)
        })
        .filter(|(_, _, left)| *left > 0)
        .collect();
    let mut places = round.places();
    let mut next = 0;
    let mut jobs = Vec::new();
    while !room.is_empty() {
        for (queue, nodes, left) in room.iter_mut() {
            if places == 0 {
                return (jobs, false);
            }
            if next + *nodes > round.pending.batches.len() && round.pending.cut {
                return (jobs, true);
            }
            if next >= round.pending.batches.len() {
                return (jobs, false);
            }
            let end = (next + *nodes).min(round.pending.batches.len());
            jobs.push(PlannedJob {
                queue: queue.to_string(),
                batches: round.pending.batches[next..end].to_vec(),
            });
            next = end;
            places -= 1;
            *left -= 1;
        }
        room.retain(|(_, _, left)| *left > 0);
    }
    (jobs, false)
}

#[cfg(test)]
mod tests {
    use super::super::{OpenJob, Pending, QueueView};
    use super::*;

    fn view(name: &str, cap: u32, open: usize, nodes: usize) -> QueueView {
        QueueView {
            name: name.into(),
            cap,
            usable: true,
            nodes,
            jobs: (0..open)
                .map(|i| OpenJob {
                    name: format!("{name}{i}"),
                    batches: vec![1000 + i as i64],
                    submitted_s: 0.0,
                    started_s: None,
                    cancelling: false,
                })
                .collect(),
        }
    }

    fn fill(queues: &[QueueView], pending: &[i64], max_jobs: Option<u32>) -> Vec<PlannedJob> {
        fill_queues(&Round {
            now_s: 0.0,
            queues,
            pending: Pending::all(pending),
            speculate: false,
            max_jobs,
        })
        .0
    }

    fn count(jobs: &[PlannedJob], queue: &str) -> usize {
        jobs.iter().filter(|j| j.queue == queue).count()
    }

    #[test]
    fn never_exceeds_a_cap_and_takes_batches_in_order() {
        let queues = [view("debug", 1, 0, 1), view("gpu", 3, 1, 1)];
        let jobs = fill(&queues, &[4, 5, 6, 7, 8], None);
        assert_eq!(count(&jobs, "debug"), 1);
        assert_eq!(count(&jobs, "gpu"), 2);
        let order: Vec<i64> = jobs.iter().flat_map(|j| j.batches.clone()).collect();
        assert_eq!(order, vec![4, 5, 6]);
        // Queues take turns: debug (first by name) then gpu, then gpu again.
        assert_eq!(jobs[0].queue, "debug");
        assert_eq!(jobs[1].queue, "gpu");
    }

    #[test]
    fn full_zero_and_unusable_queues_get_nothing() {
        let mut queues = [view("a", 2, 2, 1), view("b", 0, 0, 1), view("c", 5, 0, 1)];
        queues[2].usable = false;
        assert!(fill(&queues, &[1, 2], None).is_empty());
        // An over-full queue (cap lowered below what it holds) is not an underflow.
        let queues = [view("a", 2, 7, 1), view("c", 5, 0, 1)];
        assert!(fill(&queues, &[1], None).iter().all(|j| j.queue == "c"));
    }

    #[test]
    fn each_queue_takes_its_own_batches_per_job_and_the_last_may_be_short() {
        let queues = [view("debug", 1, 0, 1), view("prod", 8, 0, 2)];
        let got: Vec<(String, Vec<i64>)> = fill(&queues, &[1, 2, 3, 4, 5, 6], None)
            .into_iter()
            .map(|j| (j.queue, j.batches))
            .collect();
        assert_eq!(
            got,
            vec![
                ("debug".to_string(), vec![1]),
                ("prod".to_string(), vec![2, 3]),
                ("prod".to_string(), vec![4, 5]),
                ("prod".to_string(), vec![6]),
            ]
        );
    }

    #[test]
    fn the_runs_job_limit_holds_over_all_queues_together() {
        // 24 places over two queues of cap 20: twelve each, taking turns.
        let queues = [view("fast", 20, 0, 1), view("slow", 20, 0, 1)];
        let pending: Vec<i64> = (1..=100).collect();
        let jobs = fill(&queues, &pending, Some(24));
        assert_eq!((count(&jobs, "fast"), count(&jobs, "slow")), (12, 12));
        // Open jobs anywhere, one being cancelled too, take places.
        let queues = [view("fast", 20, 3, 1), view("slow", 20, 18, 1)];
        let jobs = fill(&queues, &pending, Some(24));
        assert_eq!((count(&jobs, "fast"), count(&jobs, "slow")), (2, 1));
        assert!(fill(&queues, &pending, Some(20)).is_empty());
    }

    #[test]
    fn stops_when_batches_run_out() {
        let queues = [view("a", 10, 0, 1), view("b", 10, 0, 1)];
        assert_eq!(fill(&queues, &[1, 2, 3], None).len(), 3);
        assert!(fill(&queues, &[], None).is_empty());
    }
}
