//! The run as Prometheus metrics, in the text exposition format: `metrics.prom` beside run.db
//! for node_exporter's textfile collector, and `submit --metrics-listen`'s answer. Names by
//! Prometheus's conventions (`embedfleet_` prefix, `_total` counters, seconds); labels are
//! queues, states and outcomes only — never a paper id, a host or anything else unbounded.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use embedfleet_core::rundb::RunStatus;
use embedfleet_core::status_snapshot::LoopState;

use super::escape::label_value;
use super::history::{AttemptHistory, Outcome};

/// What the metrics are made of.
pub struct MetricsInput<'a> {
    pub status: &'a RunStatus,
    pub history: &'a AttemptHistory,
    /// The submit loop's own counters, when a loop writes them.
    pub submit_loop: Option<&'a LoopState>,
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            let inner: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", label_value(v)))
                .collect();
            let _ = write!(self.0, "{{{}}}", inner.join(","));
        }
        let _ = writeln!(self.0, " {value}");
    }
    /// A counter with a sample per queue.
    fn per_queue(&mut self, name: &str, help: &str, counts: BTreeMap<&str, u64>) {
        self.family(name, "counter", help);
        for (queue, n) in counts {
            self.sample(name, &[("queue", queue)], n as f64);
        }
    }
    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, "gauge", help);
        self.sample(name, &[], value);
    }
}

/// The exposition text.
pub fn render(input: &MetricsInput<'_>) -> String {
    let s = input.status;
    let mut out = Out(String::new());
    out.gauge(
        "embedfleet_papers_planned",
        "Papers to embed in the run.",
        s.papers_planned as f64,
    );
    out.gauge(
        "embedfleet_papers_embedded",
        "Papers in the run's parquet shards.",
        s.rows_in_shards as f64,
    );
    out.gauge(
        "embedfleet_papers_quarantined",
        "Papers set aside (unreadable, too long, failed).",
        s.papers_quarantined as f64,
    );
    out.family("embedfleet_batches", "gauge", "Batches by state.");
    for (state, n) in &s.batches_by_state {
        out.sample("embedfleet_batches", &[("state", state)], *n as f64);
    }
    out.family(
        "embedfleet_jobs",
        "gauge",
        "Each batch's latest job by queue and state.",
    );
    for (queue, states) in &s.jobs_by_queue {
        for (state, n) in states {
            out.sample(
                "embedfleet_jobs",
                &[("queue", queue), ("state", state)],
                *n as f64,
            );
        }
    }
    attempts(&mut out, input.history);
    out.gauge(
        "embedfleet_points_uploaded",
        "Points acknowledged by the vector database, over every collection.",
        s.points_uploaded as f64,
    );
    out.gauge(
        "embedfleet_points_failed",
        "Points whose upload failed after every retry.",
        s.points_failed as f64,
    );
    if let Some(eta) = s.eta_seconds {
        out.gauge(
            "embedfleet_eta_seconds",
            "Seconds until every planned paper is embedded at the run's rate.",
            eta,
        );
    }
    if let Some(l) = input.submit_loop {
        out.family(
            "embedfleet_owner_cpu_seconds_total",
            "counter",
            "CPU time of the submit loop (the run's owner) since it started.",
        );
        out.sample("embedfleet_owner_cpu_seconds_total", &[], l.cpu_s);
        out.family(
            "embedfleet_owner_polls_total",
            "counter",
            "Polls of the submit loop since it started.",
        );
        out.sample("embedfleet_owner_polls_total", &[], l.polls as f64);
        if l.polls > 0 {
            out.gauge(
                "embedfleet_owner_poll_cpu_seconds",
                "Mean CPU time of the submit loop per poll.",
                l.cpu_s / l.polls as f64,
            );
        }
    }
    out.0
}

/// The status's time and age: the end of the text, written when it is served (the age of a
/// scrape is now's, not the poll's).
pub fn age(status_unix_s: f64, now_unix_s: f64) -> String {
    let mut out = Out(String::new());
    out.gauge(
        "embedfleet_status_snapshot_timestamp_seconds",
        "When the run's status was last read (unix time).",
        status_unix_s,
    );
    out.gauge(
        "embedfleet_status_snapshot_age_seconds",
        "Age of the run's status when these metrics were written or served.",
        (now_unix_s - status_unix_s).max(0.0),
    );
    out.0
}

/// Attempts by queue and outcome, and the failures and preemptions among them as counters.
fn attempts(out: &mut Out, history: &AttemptHistory) {
    out.family(
        "embedfleet_job_attempts",
        "gauge",
        "Job attempts by queue and outcome.",
    );
    let mut failures: BTreeMap<&str, u64> = BTreeMap::new();
    let mut preemptions: BTreeMap<&str, u64> = BTreeMap::new();
    for ((queue, outcome), n) in history.counts() {
        out.sample(
            "embedfleet_job_attempts",
            &[("queue", queue), ("outcome", outcome.as_str())],
            *n as f64,
        );
        if outcome.is_failure() {
            *failures.entry(queue).or_default() += n;
        }
        if *outcome == Outcome::Preempted {
            *preemptions.entry(queue).or_default() += n;
        }
        failures.entry(queue).or_default();
        preemptions.entry(queue).or_default();
    }
    out.per_queue(
        "embedfleet_job_failures_total",
        "Job attempts that failed, hit their walltime or were lost.",
        failures,
    );
    out.per_queue(
        "embedfleet_job_preemptions_total",
        "Job attempts preempted or cancelled.",
        preemptions,
    );
}
