//! The human form of `embedfleet status` (the `--json` form is [`RunStatus`] itself).

use embedfleet_core::owner::describe_age;
use embedfleet_core::rundb::{CollectionUpload, PauseReason, RunStatus};
use embedfleet_core::state::BatchState;
use embedfleet_core::status_snapshot::LoopState;
use std::fmt::Write;

/// One line on the submit loop, from the snapshot it keeps; a loop that ended with the run
/// complete says so (nothing is left to start it for). `here`: the status is read on the host
/// the loop ran on, whose processes can be looked at.
pub fn loop_line(state: &LoopState, s: &RunStatus, here: bool) -> String {
    let now = embedfleet_core::owner::unix_now();
    let last = describe_age(now - state.last_poll_unix_s);
    match state.ended_unix_s {
        // Polled a moment ago, but its process is gone (killed, or its terminal closed).
        None if here && !state.process_runs_here() => format!(
            "loop       STOPPED: its process (pid {}) no longer runs, last poll {last} ago; \
             `embedfleet submit` (or `run`) starts it again and adopts its jobs",
            state.pid
        ),
        Some(ended) if is_complete(s) => format!(
            "loop       ended {} ago (pid {}): the run is complete",
            describe_age(now - ended),
            state.pid
        ),
        Some(ended) => format!(
            "loop       ended {} ago (pid {}); `embedfleet submit` starts it again",
            describe_age(now - ended),
            state.pid
        ),
        None if state.is_polling(now) => format!(
            "loop       polling every {}, last poll {last} ago (pid {}, up {})",
            duration(state.poll_interval_s),
            state.pid,
            duration(now - state.started_unix_s)
        ),
        None => format!(
            "loop       SILENT: last poll {last} ago and never ended (pid {} killed, or its host down); \
             start `embedfleet submit` again on the owner host",
            state.pid
        ),
    }
}

/// The loop's routing as of its last round: the route and where the next batch goes, then one
/// line per queue with what was learned of it.
pub fn routing_lines(r: &embedfleet_core::status_snapshot::RoutingState) -> String {
    let mut out = String::new();
    let tail = if r.route == "adaptive" && r.speculate {
        ", speculative tail"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "routing    {}{tail}: {} twins ({:.1} node-hours on the slower ones), {} jobs moved",
        r.route, r.twins, r.twin_node_hours, r.moves
    );
    if r.max_jobs.is_some() || r.scheduler_limit.is_some() {
        let held = r.max_jobs.map_or("no limit".to_string(), |n| {
            format!("at most {n} jobs over all queues")
        });
        let stated = r
            .scheduler_limit
            .as_ref()
            .map(|s| format!("; the scheduler states {s}"))
            .unwrap_or_default();
        let _ = writeln!(out, "           limit: {held}{stated}");
    }
    if let Some(next) = &r.next {
        let _ = writeln!(out, "           next: {next}");
    }
    let opt = |s: Option<f64>| s.map(duration).unwrap_or_else(|| "?".into());
    for q in &r.queues {
        let _ = writeln!(
            out,
            "  {:<14} {:<8} start ~{} (longest wait now {}{}), run ~{}, {:.0} % lost, done in ~{}; {} started: {} finished, {} preempted, {} at walltime, {} failed",
            q.queue,
            q.state,
            opt(q.expected_start_s),
            duration(q.longest_wait_s),
            q.scheduler_start_s
                .map(|e| format!("; the scheduler says ~{} for a job sent now", duration(e)))
                .unwrap_or_default()
                + &q.estimate_error_s
                    .map(|e| format!("; its estimates off by ~{}", duration(e)))
                    .unwrap_or_default(),
            opt(q.run_time_s),
            100.0 * q.loss_share,
            opt(q.expected_finish_s),
            q.jobs_started,
            q.finished,
            q.preempted,
            q.walltime,
            q.failed
        );
        if let Some(why) = &q.unusable_why {
            let _ = writeln!(out, "  {:<14} {:<8} why: {why}", "", "");
        }
    }
    out
}

/// One line per queue the breaker set aside, with why.
pub fn set_aside_lines(state: &LoopState) -> String {
    let mut out = String::new();
    for (queue, why) in &state.set_aside {
        let _ = writeln!(out, "set aside  {queue}: {why}");
    }
    out
}

/// Every batch of a fully planned run embedded: nothing is left for a submit loop.
pub fn is_complete(s: &RunStatus) -> bool {
    let done = s.batches_by_state.get(BatchState::Done.as_str());
    s.plan_complete && s.batches > 0 && done == Some(&s.batches)
}

/// The run in a few words, on its first line: complete, or how far its batches are.
pub fn headline(s: &RunStatus) -> String {
    let count = |state: BatchState| s.batches_by_state.get(state.as_str()).copied();
    let done = count(BatchState::Done).unwrap_or(0);
    let batches = if s.batches == 1 { "batch" } else { "batches" };
    let mut line = format!("{done}/{} {batches} embedded", s.batches);
    if is_complete(s) {
        return format!("complete: {line}");
    }
    if let Some(failed) = count(BatchState::Failed) {
        let _ = write!(line, ", {failed} failed");
    }
    if !s.plan_complete {
        line.push_str(", planning unfinished");
    }
    line
}

pub fn render(s: &RunStatus) -> String {
    let mut out = String::new();
    let plan = if s.plan_complete {
        "complete"
    } else {
        "incomplete (run `embedfleet plan` again to finish it)"
    };
    let _ = writeln!(out, "run        {}: {}", s.run_dir, headline(s));
    let _ = writeln!(
        out,
        "plan       {plan}: {}/{} corpus files",
        s.corpus_files_planned, s.corpus_files
    );
    let _ = writeln!(
        out,
        "papers     {} ({:.1} M chars), {} filtered out",
        papers_line(s),
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
    // A run never updated has one release: nothing to tell apart.
    if s.releases.len() > 1 {
        for r in &s.releases {
            let _ = writeln!(out, "{}", release_line(r));
        }
    }
    if s.paused {
        let _ = writeln!(
            out,
            "submit     paused (`embedfleet resume` lets the loop submit again)"
        );
        if let Some(reason) = &s.pause_reason {
            render_pause_reason(&mut out, reason);
        }
    }
    if let Some(disk) = &s.disk {
        let _ = writeln!(out, "disk       {}", disk.line());
    }
    render_queues(&mut out, s);
    render_results(&mut out, s);
    out.push('\n');
    render_live(&mut out, s);
    for (file, why) in &s.corrupt_files {
        let _ = writeln!(out, "corrupt    {file}: {why}");
    }
    out
}

/// The papers planned; after an update, the live papers of the newest release first, and the
/// rows withheld apart (still in their shards, in no collection or dataset).
pub fn papers_line(s: &RunStatus) -> String {
    let w = &s.rows_withheld;
    if w.total() == 0 {
        return format!("{} planned", s.papers_planned);
    }
    let release = s.releases.last().map_or(1, |r| r.release);
    format!(
        "{} live in release {release}, of {} rows planned ({} withheld: {} superseded, {} withdrawn)",
        s.papers_live,
        s.papers_planned,
        w.total(),
        w.superseded,
        w.withdrawn
    )
}

/// A line per queue: its cap and its jobs by state.
fn render_queues(out: &mut String, s: &RunStatus) {
    let mut queues: std::collections::BTreeSet<&String> = s.jobs_by_queue.keys().collect();
    queues.extend(s.queue_caps.keys());
    for queue in queues {
        let cap = match s.queue_caps.get(queue) {
            Some(cap) => format!(" cap {cap}"),
            None => String::new(),
        };
        let states = s.jobs_by_queue.get(queue).map(by).unwrap_or_default();
        let _ = writeln!(out, "jobs       {queue}{cap}:{states}");
    }
}

/// What the run made: shards, attempts when some was not taken, points uploaded.
fn render_results(out: &mut String, s: &RunStatus) {
    let _ = writeln!(out, "shards     {} ({} rows)", s.shards, s.rows_in_shards);
    let others: u64 = s
        .attempts_by_state
        .iter()
        .filter(|(state, _)| state.as_str() != "accepted")
        .map(|(_, n)| n)
        .sum();
    if others > 0 {
        // Only worth a line when some attempt was not the one taken.
        let total: u64 = s.attempts_by_state.values().sum();
        let _ = writeln!(out, "attempts   {total}{}", by(&s.attempts_by_state));
    }
    if s.uploads_by_collection.is_empty() {
        let _ = writeln!(out, "uploaded   0 rows");
    }
    for (collection, u) in &s.uploads_by_collection {
        let _ = write!(
            out,
            "uploaded   {}: {} of {} rows sent",
            shown_target(collection),
            u.acked,
            s.rows_in_shards
        );
        out.push_str(&release_held(s, u));
        if u.deletes_pending > 0 {
            let _ = write!(
                out,
                "; {} deleted {} still in it (deleted from another database): `embedfleet upload` to it, or `embedfleet delete` with its target, deletes {}",
                u.deletes_pending,
                if u.deletes_pending == 1 { "paper is" } else { "papers are" },
                if u.deletes_pending == 1 { "it" } else { "them" },
            );
        }
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
}

/// A progress key as the user typed its target: `postgresql://`, the scheme the docs and
/// libpq's own examples use, where run.db keys PostgreSQL targets as `postgres://`.
fn shown_target(key: &str) -> String {
    key.replacen("@postgres:postgres://", " at postgresql://", 1)
        .replacen("@edge:", " at ", 1)
        .replacen("@server:", " at ", 1)
}

/// What a collection holds of the run's releases, from the release its last complete upload
/// brought it to: a release planned since is not in it until `upload` applies it (its
/// withdrawals are deleted, its changed papers sent once embedded). The papers it holds are
/// counted per collection: a delete may have reached one database and not another.
fn release_held(s: &RunStatus, upload: &CollectionUpload) -> String {
    let held = upload.release;
    let newest = s
        .releases
        .iter()
        .filter(|r| r.planned)
        .map(|r| r.release)
        .max()
        .unwrap_or(1);
    if s.rows_withheld.total() == 0 && newest <= 1 {
        return match upload.holds {
            Some(holds) if s.papers_deleted > 0 => {
                format!(" (the collection holds {holds} papers)")
            }
            _ => String::new(),
        };
    }
    let Some(held) = held else {
        return format!(
            " (no complete upload recorded: the collection may still hold some of the {} rows later releases withheld; `embedfleet upload` deletes them)",
            s.rows_withheld.total()
        );
    };
    let holds = upload.holds.unwrap_or(s.papers_live);
    if held >= newest {
        return format!(
            " (the collection holds release {newest}: the {holds} live papers, not the {} withheld rows)",
            s.rows_withheld.total()
        );
    }
    let later = s.releases.iter().filter(|r| r.planned && r.release > held);
    let (withdrawn, to_embed, embedded) = later.fold((0, 0, 0), |(w, e, d), r| {
        let to_embed = r.counts.to_embed();
        (
            w + r.counts.withdrawn,
            e + to_embed.saturating_sub(r.papers_embedded),
            d + r.papers_embedded.min(to_embed),
        )
    });
    let mut line = format!(
        " (the collection holds release {held}, not {newest}: {withdrawn} withdrawals not yet applied: `embedfleet upload`"
    );
    if to_embed > 0 {
        let _ = write!(
            line,
            "; {to_embed} new or changed papers to embed, then upload"
        );
    } else if embedded > 0 {
        let _ = write!(
            line,
            " also sends the {embedded} new or changed papers embedded since"
        );
    }
    line.push(')');
    line
}

/// The rate, and the running jobs with their progress.
fn render_live(out: &mut String, s: &RunStatus) {
    if let (Some(rate), Some(eta)) = (s.papers_per_second, s.eta_seconds) {
        if eta > 0.0 {
            let _ = writeln!(
                out,
                "rate       {rate:.2} papers/s; {} to go at this rate",
                duration(eta)
            );
        }
    }
    // Each column as wide as its widest cell: a job's label with the scheduler's id
    // (`ef-…-b000001-a1 (1234.pbshost)`) is longer than any fixed width.
    let rows: Vec<[String; 5]> = s
        .live
        .iter()
        .map(|a| {
            let rate = a
                .papers_per_second
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into());
            [
                a.host.clone(),
                a.batch.to_string(),
                a.label(),
                format!("{}/{}", a.shards_done, a.parts),
                rate,
            ]
        })
        .collect();
    let header = ["host", "batch", "job", "shards", "papers/s"].map(String::from);
    let mut width = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String; 5]| {
        format!(
            "{:<w0$} {:>w1$} {:<w2$} {:>w3$} {:>w4$}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
            w3 = width[3],
            w4 = width[4]
        )
    };
    if !rows.is_empty() {
        let _ = writeln!(out, "running    {}  last shard", line(&header));
    }
    for (a, row) in s.live.iter().zip(&rows) {
        let last = if a.has_shard {
            format!("{} ago", duration(a.idle_s))
        } else {
            format!("none yet (started {} ago)", duration(a.idle_s))
        };
        let _ = write!(out, "           {}  {last}", line(row));
        if a.stalled {
            let _ = write!(
                out,
                "  STALLED (allowed {}; `submit --kill-stalled` cancels it)",
                duration(a.allowed_idle_s)
            );
        }
        out.push('\n');
    }
}

fn by(counts: &std::collections::BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(" ({})", parts.join(", "))
}

/// `3h 05m`, `12m 30s`, `45s`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        s if s >= 3600 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m {:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// Why the loop paused itself, indented under the `submit paused` line: the signature, the
/// failed jobs' logs and what to check.
fn render_pause_reason(out: &mut String, r: &PauseReason) {
    let _ = writeln!(out, "           by the {}: {}", r.by, r.message);
    let _ = writeln!(out, "           failure: {}", r.signature);
    for log in &r.logs {
        let _ = writeln!(out, "           log: {log}");
    }
    for item in &r.check {
        let _ = writeln!(out, "           check: {item}");
    }
}

/// One corpus release: what it changed and what embedding it cost.
pub fn release_line(r: &embedfleet_core::rundb::ReleaseStatus) -> String {
    let what = if !r.planned {
        "being planned (`embedfleet plan --update` again finishes it)".to_string()
    } else if r.release == 1 {
        format!("{} papers", r.counts.added)
    } else {
        let restamped = match r.counts.restamped {
            0 => String::new(),
            n => format!(" ({n} with new metadata)"),
        };
        format!(
            "{} added, {} changed, {} withdrawn, {} unchanged{restamped}",
            r.counts.added, r.counts.changed, r.counts.withdrawn, r.counts.unchanged
        )
    };
    format!(
        "release {:<3} {what}; {}/{} batches embedded, {} papers in {:.2} node-hours",
        r.release, r.batches_done, r.batches, r.papers_embedded, r.embed_node_hours
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(45.2), "45s");
        assert_eq!(duration(750.0), "12m 30s");
        assert_eq!(duration(11_100.0), "3h 05m");
    }

    #[test]
    fn queues_show_caps_states_pause_and_eta() {
        let mut s = RunStatus {
            paused: true,
            papers_per_second: Some(2.0),
            eta_seconds: Some(90.0),
            ..RunStatus::default()
        };
        s.queue_caps.insert("debug".into(), 1);
        s.queue_caps.insert("gpu".into(), 2);
        s.jobs_by_queue
            .entry("gpu".into())
            .or_default()
            .insert("running".into(), 2);
        let text = render(&s);
        assert!(text.contains("jobs       debug cap 1:\n"), "{text}");
        assert!(text.contains("jobs       gpu cap 2: (running 2)"), "{text}");
        assert!(text.contains("paused"), "{text}");
        assert!(text.contains("2.00 papers/s; 1m 30s to go"), "{text}");
    }

    #[test]
    fn the_headline_says_complete_only_when_every_batch_is_done() {
        let mut s = RunStatus {
            plan_complete: true,
            batches: 3,
            ..RunStatus::default()
        };
        s.batches_by_state.insert("done".into(), 2);
        s.batches_by_state.insert("failed".into(), 1);
        assert!(!is_complete(&s));
        assert_eq!(headline(&s), "2/3 batches embedded, 1 failed");
        s.batches_by_state = [("done".to_string(), 3)].into();
        assert!(is_complete(&s));
        assert_eq!(headline(&s), "complete: 3/3 batches embedded");
        assert!(
            render(&s).starts_with("run        : complete"),
            "{}",
            render(&s)
        );
        s.plan_complete = false;
        assert_eq!(headline(&s), "3/3 batches embedded, planning unfinished");
    }

    #[test]
    fn a_pause_of_the_breaker_says_why_and_what_to_check() {
        let s = RunStatus {
            paused: true,
            pause_reason: Some(PauseReason {
                by: "breaker".into(),
                message: "3 jobs in a row failed alike".into(),
                signature: "exit code 1: error: libcudnn.so.# not found".into(),
                jobs: vec!["j1".into()],
                logs: vec!["/run/logs/j1.log".into()],
                check: vec!["quota".into()],
                at_unix_s: 1,
            }),
            ..RunStatus::default()
        };
        let text = render(&s);
        assert!(
            text.contains("by the breaker: 3 jobs in a row failed alike"),
            "{text}"
        );
        assert!(
            text.contains("failure: exit code 1: error: libcudnn"),
            "{text}"
        );
        assert!(text.contains("log: /run/logs/j1.log"), "{text}");
        assert!(text.contains("check: quota"), "{text}");
    }
}
