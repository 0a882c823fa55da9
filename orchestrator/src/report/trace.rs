//! `report --trace`: one tab-separated line per job attempt, in Nextflow's trace field names
//! where they mean the same thing, then ours. Times are UTC (`YYYY-MM-DD HH:MM:SS.mmm`, as
//! Nextflow writes them); `duration` (submit to end) and `realtime` (start to end) are seconds;
//! a value not known is `-`, Nextflow's "none".

use std::fmt::Write as _;

use embedfleet_core::rundb::JobAttempt;
use embedfleet_core::state::JobStatus;

use super::clock::utc_millis;
use super::escape::tsv_field;
use super::history::AttemptHistory;

/// The header line's fields, in order.
pub const FIELDS: [&str; 16] = [
    "task_id",
    "native_id",
    "name",
    "status",
    "exit",
    "attempt",
    "queue",
    "submit",
    "start",
    "complete",
    "duration",
    "realtime",
    "batch",
    "host",
    "papers",
    "tokens",
];

/// The trace of every attempt in `history`, header first.
pub fn render(history: &AttemptHistory) -> String {
    let mut out = FIELDS.join("\t");
    out.push('\n');
    for a in history.attempts() {
        let time = |t: Option<f64>| t.map_or_else(|| "-".into(), utc_millis);
        let span = |from: Option<f64>, to: Option<f64>| match (from, to) {
            (Some(f), Some(t)) => format!("{:.3}", (t - f).max(0.0)),
            _ => "-".into(),
        };
        let opt = |v: Option<u64>| v.map_or_else(|| "-".into(), |v| v.to_string());
        let fields = [
            a.job_row.to_string(),
            tsv_field(a.native_id.as_deref().unwrap_or("")),
            tsv_field(&a.name),
            a.state.as_str().to_uppercase(),
            exit_code(a),
            a.attempt.to_string(),
            tsv_field(&a.queue),
            time(a.submit_s),
            time(a.start_s),
            time(a.end_s),
            span(a.submit_s, a.end_s),
            span(a.start_s, a.end_s),
            a.batch.to_string(),
            tsv_field(a.host.as_deref().unwrap_or("")),
            opt(a.papers),
            opt(a.tokens),
        ];
        let _ = writeln!(out, "{}", fields.join("\t"));
    }
    out
}

/// The exit code: 0 for a completed job, the number in "exit code N" of its exit reason, else
/// `-`.
fn exit_code(a: &JobAttempt) -> String {
    if a.state == JobStatus::Completed {
        return "0".into();
    }
    let code = a.exit_reason.as_deref().and_then(|r| {
        let rest = &r[r.find("exit code ")? + "exit code ".len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        (!digits.is_empty()).then_some(digits)
    });
    code.unwrap_or_else(|| "-".into())
}
