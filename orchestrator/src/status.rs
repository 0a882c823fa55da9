//! The human form of `embedfleet status` (the `--json` form is [`RunStatus`] itself).

use embedfleet_core::rundb::RunStatus;
use std::fmt::Write;

pub fn render(s: &RunStatus) -> String {
    let mut out = String::new();
    let plan = if s.plan_complete {
        "complete"
    } else {
        "incomplete (run `embedfleet plan` again to finish it)"
    };
    let _ = writeln!(out, "run        {}", s.run_dir);
    let _ = writeln!(
        out,
        "plan       {plan}: {}/{} corpus files",
        s.corpus_files_planned, s.corpus_files
    );
    let _ = writeln!(
        out,
        "papers     {} planned ({:.1} M chars), {} filtered out",
        s.papers_planned,
        s.chars_planned as f64 / 1e6,
        s.papers_filtered
    );
    let _ = writeln!(
        out,
        "quarantine {}{}",
        s.papers_quarantined,
        by(&s.quarantined_by_reason)
    );
    let _ = writeln!(out, "batches    {}{}", s.batches, by(&s.batches_by_state));
    for (queue, states) in &s.jobs_by_queue {
        let _ = writeln!(out, "jobs       {queue}:{}", by(states));
    }
    let _ = writeln!(out, "shards     {} ({} rows)", s.shards, s.rows_in_shards);
    if s.uploads_by_collection.is_empty() {
        let _ = writeln!(out, "uploaded   0 points");
    }
    for (collection, u) in &s.uploads_by_collection {
        let _ = write!(
            out,
            "uploaded   {collection}: {} of {} points",
            u.acked, s.rows_in_shards
        );
        if u.failed > 0 {
            let _ = write!(out, ", {} failed", u.failed);
        }
        if u.missing > 0 {
            let _ = write!(
                out,
                ", {} missing (run `embedfleet upload` again)",
                u.missing
            );
        }
        out.push('\n');
    }
    for (file, why) in &s.corrupt_files {
        let _ = writeln!(out, "corrupt    {file}: {why}");
    }
    out
}

fn by(counts: &std::collections::BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(" ({})", parts.join(", "))
}
