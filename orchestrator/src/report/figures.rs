//! What the HTML report shows, computed from the run's status and its attempt history (both
//! already in memory: the owner keeps them current, `report --html` reads them once): the
//! timeline's bars, per-queue and per-host figures, the Table 2 breakdown, progress over time.

use std::collections::BTreeMap;

use embedfleet_core::rundb::{CollectionUpload, JobAttempt, ReleaseStatus, RunStatus};
use serde::Serialize;

use super::history::{AttemptHistory, Outcome};

/// At most this many points in a progress curve: a week's run stays a few KB.
const MAX_CURVE_POINTS: usize = 400;

/// One job attempt on the timeline. Times are seconds after the figures' `t0`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bar {
    pub batch: i64,
    pub attempt: u32,
    pub job: String,
    pub native_id: Option<String>,
    pub queue: String,
    pub host: Option<String>,
    pub outcome: Outcome,
    pub submit: Option<f64>,
    pub start: Option<f64>,
    pub end: Option<f64>,
}

/// One queue's attempts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueueFigures {
    pub queue: String,
    pub attempts: u64,
    pub done: u64,
    pub failed: u64,
    pub preempted: u64,
    pub walltime: u64,
    pub lost: u64,
    /// Seconds from submit to start of each attempt that started, sorted.
    pub start_delays_s: Vec<f64>,
    /// Mean seconds from start to end of the attempts that ended.
    pub mean_run_s: Option<f64>,
}

/// One host's finished embed runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HostFigures {
    pub host: String,
    pub runs: u64,
    pub papers: u64,
    pub tokens: u64,
    pub seconds: f64,
    pub papers_per_s: f64,
    pub tokens_per_s: f64,
}

/// The study's Table 2: mean seconds per finished run of a batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Breakdown {
    pub runs: u64,
    pub model_load_s: f64,
    pub io_s: f64,
    pub tokenize_s: f64,
    pub inference_s: f64,
    pub total_s: f64,
}

/// A failed attempt, with the first error line of its log (read by the caller).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    pub batch: i64,
    pub attempt: u32,
    pub job: String,
    pub outcome: Outcome,
    pub exit: String,
    pub first_error: Option<String>,
    pub log: Option<String>,
}

/// Everything the page draws.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub run_dir: String,
    pub generated_unix_s: f64,
    /// Unix seconds of the earliest submit: the timeline's zero.
    pub t0: f64,
    pub papers_planned: u64,
    pub papers_embedded: u64,
    /// Papers the newest release serves, and the rows later releases withheld (superseded or
    /// withdrawn; still in `papers_planned` and, once embedded, in `papers_embedded`).
    pub papers_live: u64,
    pub rows_withheld: u64,
    pub batches_by_state: BTreeMap<String, u64>,
    pub eta_s: Option<f64>,
    pub node_hours_to_go: Option<f64>,
    /// The run directory's filesystem: free space against what the rest writes.
    pub disk: Option<embedfleet_core::space::DiskStatus>,
    pub bars: Vec<Bar>,
    pub queues: Vec<QueueFigures>,
    pub hosts: Vec<HostFigures>,
    pub breakdown: Option<Breakdown>,
    /// (seconds after t0, papers embedded so far, attempts running).
    pub progress: Vec<(f64, u64, u64)>,
    pub failures: Vec<Failure>,
    pub quarantined: Vec<(String, String, String)>,
    pub papers_quarantined: u64,
    pub uploads: BTreeMap<String, CollectionUpload>,
    pub points_uploaded: u64,
    pub releases: Vec<ReleaseStatus>,
    /// The run's latest `eval`, when it has one (set by the caller, who reads the file).
    pub eval: Option<embedfleet_core::eval_tables::EvalReport>,
    /// The run's latest `eval --compare-postgres`, when it has one (set by the caller).
    pub compare: Option<embedfleet_core::eval_tables::CompareReport>,
    /// The upload's rate, `tune`'s trials and the query workload (set by the caller).
    pub activity: super::activity::Activity,
}

/// The figures of a run. `first_error` finds an attempt's first error line (its log is read
/// by the caller, who may cache it).
pub fn compute(
    status: &RunStatus,
    history: &AttemptHistory,
    quarantined: Vec<(String, String, String)>,
    mut first_error: impl FnMut(&JobAttempt) -> Option<String>,
) -> Figures {
    let t0 = history
        .attempts()
        .filter_map(|a| a.submit_s.or(a.start_s))
        .fold(f64::INFINITY, f64::min);
    let t0 = if t0.is_finite() { t0 } else { 0.0 };
    let rel = |t: Option<f64>| t.map(|t| ((t - t0) * 10.0).round() / 10.0);
    let bars = history
        .attempts()
        .map(|a| Bar {
            batch: a.batch,
            attempt: a.attempt,
            job: a.name.clone(),
            native_id: a.native_id.clone(),
            queue: a.queue.clone(),
            host: a.host.clone(),
            outcome: Outcome::of(a),
            submit: rel(a.submit_s),
            start: rel(a.start_s),
            end: rel(a.end_s),
        })
        .collect();
    let failures = history
        .attempts()
        .filter(|a| Outcome::of(a).is_failure())
        .map(|a| Failure {
            batch: a.batch,
            attempt: a.attempt,
            job: a.name.clone(),
            outcome: Outcome::of(a),
            exit: a.exit_reason.clone().unwrap_or_else(|| a.state.to_string()),
            first_error: first_error(a),
            log: a.log.clone(),
        })
        .collect();
    let breakdown = breakdown(history);
    let node_hours_to_go = breakdown.as_ref().and_then(|b| {
        let papers: u64 = history.attempts().filter_map(done_papers).sum();
        let to_go = status.papers_planned.saturating_sub(status.rows_in_shards);
        (papers > 0).then(|| to_go as f64 * b.total_s * b.runs as f64 / papers as f64 / 3600.0)
    });
    Figures {
        run_dir: status.run_dir.clone(),
        generated_unix_s: embedfleet_core::owner::unix_now(),
        t0,
        papers_planned: status.papers_planned,
        papers_embedded: status.rows_in_shards,
        papers_live: status.papers_live,
        rows_withheld: status.rows_withheld.total(),
        batches_by_state: status.batches_by_state.clone(),
        eta_s: status.eta_seconds,
        disk: status.disk.clone(),
        node_hours_to_go,
        bars,
        queues: queues(history),
        hosts: hosts(history),
        breakdown,
        progress: progress(history, t0),
        failures,
        quarantined,
        papers_quarantined: status.papers_quarantined,
        uploads: status.uploads_by_collection.clone(),
        points_uploaded: status.points_uploaded,
        releases: status.releases.clone(),
        eval: None,
        compare: None,
        activity: Default::default(),
    }
}

/// The papers of an attempt whose run finished its work.
fn done_papers(a: &JobAttempt) -> Option<u64> {
    (a.run_error.is_none() && Outcome::of(a) == Outcome::Done)
        .then_some(a.papers)
        .flatten()
}

fn queues(history: &AttemptHistory) -> Vec<QueueFigures> {
    let mut by_queue: BTreeMap<&str, (QueueFigures, f64, u64)> = BTreeMap::new();
    for a in history.attempts() {
        let (q, run_sum, runs) = by_queue.entry(&a.queue).or_insert_with(|| {
            let q = QueueFigures {
                queue: a.queue.clone(),
                ..QueueFigures::default()
            };
            (q, 0.0, 0)
        });
        q.attempts += 1;
        match Outcome::of(a) {
            Outcome::Done => q.done += 1,
            Outcome::Failed => q.failed += 1,
            Outcome::Preempted => q.preempted += 1,
            Outcome::Walltime => q.walltime += 1,
            Outcome::Lost => q.lost += 1,
            Outcome::Pending | Outcome::Running => {}
        }
        if let (Some(s), Some(t)) = (a.submit_s, a.start_s) {
            q.start_delays_s
                .push(((t - s).max(0.0) * 10.0).round() / 10.0);
        }
        if let (Some(t), Some(e)) = (a.start_s, a.end_s) {
            *run_sum += (e - t).max(0.0);
            *runs += 1;
        }
    }
    by_queue
        .into_values()
        .map(|(mut q, sum, n)| {
            q.start_delays_s.sort_by(f64::total_cmp);
            q.mean_run_s = (n > 0).then(|| sum / n as f64);
            q
        })
        .collect()
}

fn hosts(history: &AttemptHistory) -> Vec<HostFigures> {
    let mut by_host: BTreeMap<&str, HostFigures> = BTreeMap::new();
    for a in history.attempts() {
        let (Some(host), Some(papers)) = (a.host.as_deref(), done_papers(a)) else {
            continue;
        };
        let h = by_host.entry(host).or_insert_with(|| HostFigures {
            host: host.to_string(),
            ..HostFigures::default()
        });
        h.runs += 1;
        h.papers += papers;
        h.tokens += a.tokens.unwrap_or(0);
        h.seconds += a.run_s.unwrap_or(0.0);
    }
    let mut out: Vec<HostFigures> = by_host.into_values().collect();
    for h in &mut out {
        if h.seconds > 0.0 {
            h.papers_per_s = h.papers as f64 / h.seconds;
            h.tokens_per_s = h.tokens as f64 / h.seconds;
        }
    }
    out
}

fn breakdown(history: &AttemptHistory) -> Option<Breakdown> {
    let mut b = Breakdown::default();
    for a in history.attempts().filter(|a| done_papers(a).is_some()) {
        b.runs += 1;
        b.model_load_s += a.model_load_s.unwrap_or(0.0);
        b.io_s += a.io_s.unwrap_or(0.0);
        b.tokenize_s += a.tokenize_s.unwrap_or(0.0);
        b.inference_s += a.inference_s.unwrap_or(0.0);
        b.total_s += a.run_s.unwrap_or(0.0);
    }
    if b.runs == 0 {
        return None;
    }
    let n = b.runs as f64;
    for v in [
        &mut b.model_load_s,
        &mut b.io_s,
        &mut b.tokenize_s,
        &mut b.inference_s,
        &mut b.total_s,
    ] {
        *v /= n;
    }
    Some(b)
}

/// Papers embedded and attempts running over time: a step at each start and end, thinned to
/// [`MAX_CURVE_POINTS`].
fn progress(history: &AttemptHistory, t0: f64) -> Vec<(f64, u64, u64)> {
    // (time, papers done at it, running +1/-1)
    let mut events: Vec<(f64, u64, i64)> = Vec::new();
    for a in history.attempts() {
        if let Some(s) = a.start_s {
            events.push((s - t0, 0, 1));
            if let Some(e) = a.end_s {
                events.push((e - t0, done_papers(a).unwrap_or(0), -1));
            }
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut papers, mut running) = (0u64, 0i64);
    let mut curve: Vec<(f64, u64, u64)> = events
        .into_iter()
        .map(|(t, p, r)| {
            papers += p;
            running += r;
            ((t * 10.0).round() / 10.0, papers, running.max(0) as u64)
        })
        .collect();
    if curve.len() > MAX_CURVE_POINTS {
        let step = curve.len().div_ceil(MAX_CURVE_POINTS);
        let last = *curve.last().expect("not empty");
        curve = curve.into_iter().step_by(step).collect();
        curve.push(last);
    }
    curve
}

#[cfg(test)]
mod tests;
