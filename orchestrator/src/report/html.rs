//! `report --html`: one self-contained page. The tables are written here, every value escaped;
//! the plots and the timeline are drawn in the browser by the page's own script
//! (`page/report.js`, inline) from the figures as a JSON block. Nothing is fetched: no CDN, no
//! font, no image.

use embedfleet_core::space::size;
use std::fmt::Write as _;

use super::escape::{html, json_in_script};
use super::figures::Figures;
use super::history::Outcome;

const STYLE: &str = include_str!("page/report.css");
const SCRIPT: &str = include_str!("page/report.js");

/// The page of `figures`.
pub fn render(figures: &Figures) -> String {
    let json = serde_json::to_string(figures).expect("the figures serialise");
    let mut out = String::with_capacity(json.len() + 64 * 1024);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>embedfleet report: {run}</title><style>{STYLE}</style></head><body>\n\
         <h1>embedfleet report</h1><p class=\"sub\">{run} · written {when} UTC</p>\n\
         <div id=\"js-errors\"></div>\n",
        run = html(&figures.run_dir),
        when = html(&super::clock::utc(figures.generated_unix_s)),
    );
    cards(&mut out, figures);
    out.push_str(
        "<h2>Progress</h2><p class=\"sub\">papers embedded (green, of those planned) and job \
         attempts running (blue) over time</p><svg id=\"progress\"></svg>\n",
    );
    timeline(&mut out);
    queues(&mut out, figures);
    hosts(&mut out, figures);
    failures(&mut out, figures);
    quarantined(&mut out, figures);
    uploads_and_releases(&mut out, figures);
    activity(&mut out, figures);
    eval(&mut out, figures);
    compare(&mut out, figures);
    let _ = write!(
        out,
        "<script type=\"application/json\" id=\"report-data\">{}</script>\n<script>{SCRIPT}</script>\n</body></html>\n",
        json_in_script(&json)
    );
    out
}

fn card(out: &mut String, value: &str, what: &str) {
    let _ = write!(
        out,
        "<div class=\"card\"><b>{}</b><span>{}</span></div>",
        html(value),
        html(what)
    );
}

fn hours(seconds: f64) -> String {
    if seconds < 3600.0 {
        format!("{:.0} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

fn cards(out: &mut String, f: &Figures) {
    out.push_str("<div class=\"cards\">");
    // After `plan --update` the rows include older copies no release serves: the headline
    // counts the live papers, and says how many rows it left out.
    let (embedded, of, what) = if f.rows_withheld == 0 {
        (
            f.papers_embedded,
            f.papers_planned,
            "papers embedded".to_string(),
        )
    } else {
        (
            f.papers_embedded
                .saturating_sub(f.rows_withheld)
                .min(f.papers_live),
            f.papers_live,
            format!(
                "live papers embedded, not counting {} older rows later releases withheld",
                f.rows_withheld
            ),
        )
    };
    let share = if of > 0 {
        100.0 * embedded as f64 / of as f64
    } else {
        0.0
    };
    card(
        out,
        &format!("{embedded} / {of}"),
        &format!("{what} ({share:.1} %)"),
    );
    for (state, n) in &f.batches_by_state {
        card(out, &n.to_string(), &format!("batches {state}"));
    }
    card(out, &f.bars.len().to_string(), "job attempts");
    card(out, &f.failures.len().to_string(), "attempts failed");
    card(
        out,
        &f.eta_s.map_or_else(|| "-".into(), hours),
        "to go at the run's rate (ETA)",
    );
    card(
        out,
        &f.node_hours_to_go
            .map_or_else(|| "-".into(), |h| format!("{h:.1}")),
        "node-hours to go",
    );
    if let Some(disk) = &f.disk {
        let needed = disk.needed_bytes.map_or_else(
            || "the rest's size known after the first shard".to_string(),
            |n| format!("the rest of the run writes about {}", size(n)),
        );
        let short = if disk.short() {
            " — short of room"
        } else {
            ""
        };
        card(
            out,
            &size(disk.free_bytes),
            &format!(
                "free at {} (of {}); {needed}{short}",
                disk.dir,
                size(disk.total_bytes)
            ),
        );
    }
    out.push_str("</div>\n");
}

fn timeline(out: &mut String) {
    out.push_str(
        "<h2>Timeline</h2><p class=\"sub\">one bar per job attempt: queued (grey), then \
         running, coloured by how it ended. Wheel or buttons to zoom, drag to pan, hover for \
         details.</p><div class=\"controls\"><label>lanes <select id=\"lanes\">\
         <option value=\"host\">per host</option><option value=\"queue\">per queue</option>\
         </select></label><button id=\"zoom-in\">zoom in</button><button id=\"zoom-out\">zoom \
         out</button><button id=\"zoom-reset\">whole run</button></div><div class=\"legend\">",
    );
    for o in Outcome::ALL {
        let _ = write!(out, "<span><i class=\"o-{0}\"></i>{0}</span>", o.as_str());
    }
    out.push_str("</div><div id=\"bar-info\"></div><svg id=\"timeline\"></svg>\n");
}

fn queues(out: &mut String, f: &Figures) {
    out.push_str(
        "<h2>Queues</h2><table><tr><th>queue</th><th class=\"n\">attempts</th>\
         <th class=\"n\">done</th><th class=\"n\">failed</th><th class=\"n\">preempted or cancelled</th>\
         <th class=\"n\">walltime</th><th class=\"n\">lost</th><th class=\"n\">median start delay</th>\
         <th class=\"n\">mean run time</th></tr>",
    );
    for q in &f.queues {
        let median = q.start_delays_s.get(q.start_delays_s.len() / 2);
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td></tr>",
            html(&q.queue),
            q.attempts,
            q.done,
            q.failed,
            q.preempted,
            q.walltime,
            q.lost,
            median.map_or_else(|| "-".into(), |s| format!("{s:.1} s")),
            q.mean_run_s.map_or_else(|| "-".into(), |s| format!("{s:.1} s")),
        );
    }
    out.push_str("</table><div id=\"delays\" class=\"small-multiples\"></div>\n");
}

fn hosts(out: &mut String, f: &Figures) {
    out.push_str("<h2>Hosts</h2><p class=\"sub\">throughput of each host's finished embed runs</p><svg id=\"hosts\"></svg>");
    if let Some(b) = &f.breakdown {
        let _ = writeln!(
            out,
            "<h2>Where a batch's time goes (Table 2)</h2><p class=\"sub\">mean over {} finished \
             runs: model load {:.2} s, I/O {:.2} s, tokenisation {:.2} s, inference {:.2} s; \
             total {:.2} s</p><svg id=\"breakdown\"></svg>",
            b.runs, b.model_load_s, b.io_s, b.tokenize_s, b.inference_s, b.total_s
        );
    } else {
        out.push_str("<svg id=\"breakdown\"></svg>\n");
    }
}

fn failures(out: &mut String, f: &Figures) {
    let _ = write!(out, "<h2>Failures</h2>");
    if f.failures.is_empty() {
        out.push_str("<p class=\"none\">no attempt failed</p>\n");
        return;
    }
    out.push_str(
        "<table id=\"failures\"><tr><th class=\"n\">batch</th><th class=\"n\">attempt</th><th>job</th>\
         <th>outcome</th><th>exit</th><th>first error line of the log</th><th>log</th></tr>",
    );
    for x in &f.failures {
        let _ = write!(
            out,
            "<tr class=\"failure\"><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td class=\"first-error\">{}</td><td class=\"path\">{}</td></tr>",
            x.batch,
            x.attempt,
            html(&x.job),
            x.outcome.as_str(),
            html(&x.exit),
            html(x.first_error.as_deref().unwrap_or("")),
            html(x.log.as_deref().unwrap_or("")),
        );
    }
    out.push_str("</table>\n");
}

fn quarantined(out: &mut String, f: &Figures) {
    if f.papers_quarantined == 0 {
        return;
    }
    let _ = write!(
        out,
        "<h2>Papers set aside</h2><p class=\"sub\">{} papers quarantined; the first {}:</p>\
         <table id=\"quarantined\"><tr><th>paper</th><th>reason</th><th>detail</th></tr>",
        f.papers_quarantined,
        f.quarantined.len()
    );
    for (id, reason, detail) in &f.quarantined {
        let _ = write!(
            out,
            "<tr><td class=\"paper\">{}</td><td>{}</td><td>{}</td></tr>",
            html(id),
            html(reason),
            html(detail)
        );
    }
    out.push_str("</table>\n");
}

fn uploads_and_releases(out: &mut String, f: &Figures) {
    if !f.uploads.is_empty() {
        out.push_str("<h2>Upload</h2><table><tr><th>collection</th><th class=\"n\">points acknowledged</th><th class=\"n\">failed</th><th class=\"n\">missing</th></tr>");
        for (name, u) in &f.uploads {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                html(name),
                u.acked,
                u.failed,
                u.missing
            );
        }
        out.push_str("</table>\n");
    }
    if f.releases.len() > 1 {
        out.push_str("<h2>Releases</h2><table><tr><th class=\"n\">release</th><th class=\"n\">added</th><th class=\"n\">changed</th><th class=\"n\">withdrawn</th><th class=\"n\">batches done</th><th class=\"n\">node-hours</th></tr>");
        for r in &f.releases {
            let _ = write!(
                out,
                "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{} / {}</td><td class=\"n\">{:.2}</td></tr>",
                r.release,
                r.counts.added,
                r.counts.changed,
                r.counts.withdrawn,
                r.batches_done,
                r.batches,
                r.embed_node_hours
            );
        }
        out.push_str("</table>\n");
    }
}

/// The upload's rate, `tune`'s curve and the query workload, when the run has them.
fn activity(out: &mut String, f: &Figures) {
    let a = &f.activity;
    if !a.upload_runs.is_empty() {
        out.push_str(
            "<h2>Upload rate</h2><p class=\"sub\">the last upload into each collection</p>\
             <table id=\"upload-runs\"><tr><th>collection</th><th class=\"n\">points sent</th>\
             <th class=\"n\">seconds</th><th class=\"n\">points/s</th><th class=\"n\">batch</th>\
             <th class=\"n\">in flight</th><th class=\"n\">workers</th><th>ended (UTC)</th></tr>",
        );
        for u in &a.upload_runs {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td>\
                 <td class=\"n\">{:.0}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td>{}</td></tr>",
                html(&u.collection),
                u.points,
                u.seconds,
                u.points_per_s(),
                u.batch_size,
                u.in_flight,
                u.workers,
                html(&super::clock::utc(u.ended_unix_s))
            );
        }
        out.push_str("</table>\n");
    }
    if let Some(t) = &a.tune {
        let _ = write!(
            out,
            "<h2>Upload tuning (tune)</h2><p class=\"sub\">points/s into the {} sink per trial; \
             chosen: batches of {}, {} in flight ({:.0} points/s)</p>",
            html(&t.sink),
            t.batch_size,
            t.in_flight,
            t.points_per_s
        );
        out.push_str(&tune_curve(t));
        out.push_str(
            "<table id=\"tune\"><tr><th>sweep</th><th class=\"n\">batch size</th>\
             <th class=\"n\">in flight</th><th class=\"n\">points/s</th></tr>",
        );
        for trial in &t.trials {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{:.0}</td></tr>",
                html(&trial.sweep),
                trial.batch_size,
                trial.in_flight,
                trial.points_per_s
            );
        }
        out.push_str("</table>\n");
    }
    if let Some(q) = &a.query {
        let _ = writeln!(
            out,
            "<h2>Query workload</h2><p class=\"sub\">the last query run against {}: terms \
             embedded with the query instruction, then searched in batches</p>\
             <table id=\"query-run\"><tr><th class=\"n\">terms</th><th class=\"n\">searched \
             now</th><th class=\"n\">result rows</th><th class=\"n\">embed s</th>\
             <th class=\"n\">search s</th><th class=\"n\">queries/s</th><th class=\"n\">p50 ms\
             </th><th class=\"n\">p95 ms</th><th class=\"n\">p99 ms</th></tr>\
             <tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{:.1}</td><td class=\"n\">{:.1}</td><td class=\"n\">{:.0}</td>\
             <td class=\"n\">{:.2}</td><td class=\"n\">{:.2}</td><td class=\"n\">{:.2}</td></tr>\
             </table>",
            html(&q.collection),
            q.queries,
            q.queries.saturating_sub(q.already_done),
            q.rows,
            q.embed_s,
            q.search_s,
            q.queries_per_s,
            q.p50_ms,
            q.p95_ms,
            q.p99_ms
        );
    }
}

/// `tune`'s trials as bars of points/s, drawn here (no script needed), the chosen one darker.
fn tune_curve(t: &super::activity::TuneRun) -> String {
    let (w, h, gap) = (28.0, 120.0, 6.0);
    let most = t
        .trials
        .iter()
        .map(|x| x.points_per_s)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let width = t.trials.len() as f64 * (w + gap) + gap;
    let mut svg = format!(
        "<svg id=\"tune-plot\" width=\"{width:.0}\" height=\"{:.0}\" role=\"img\" \
         aria-label=\"points per second per tune trial\">",
        h + 30.0
    );
    for (i, trial) in t.trials.iter().enumerate() {
        let bar = h * trial.points_per_s / most;
        let x = gap + i as f64 * (w + gap);
        let chosen = trial.batch_size == t.batch_size && trial.in_flight == t.in_flight;
        let _ = write!(
            svg,
            "<rect class=\"tune-bar\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{w}\" height=\"{bar:.1}\" \
             fill=\"{}\"><title>{} sweep: batch {}, {} in flight: {:.0} points/s</title></rect>\
             <text x=\"{:.1}\" y=\"{:.0}\" font-size=\"9\" text-anchor=\"middle\">{}/{}</text>",
            h - bar,
            if chosen { "#1f5f8b" } else { "#8fb8d8" },
            html(&trial.sweep),
            trial.batch_size,
            trial.in_flight,
            trial.points_per_s,
            x + w / 2.0,
            h + 14.0,
            trial.batch_size,
            trial.in_flight
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn eval(out: &mut String, f: &Figures) {
    let Some(e) = &f.eval else {
        return;
    };
    let _ = write!(
        out,
        "<h2>Search quality (eval)</h2><p class=\"sub\">recall@{} of {} over {} queries against \
         latency, per search setting</p>",
        e.k,
        html(&e.collection),
        e.queries
    );
    if let Some(index) = e.index.as_ref().filter(|i| i.exact_only) {
        // Below the indexing threshold there is no graph: recall 1.0 at every ef is no result.
        let _ = write!(
            out,
            "<p class=\"warn\" id=\"eval-exact\">exact search: the collection has no HNSW index \
             ({} points{}), so every row searched exactly, whatever its ef</p>",
            index.points,
            index
                .indexing_threshold_kb
                .map(|t| format!(", indexing threshold {t} KB"))
                .unwrap_or_default()
        );
    }
    out.push_str(
        "<table id=\"eval\"><tr><th>filter</th><th>search</th><th class=\"n\">recall</th>\
         <th class=\"n\">p50 ms</th><th class=\"n\">p95 ms</th><th class=\"n\">queries/s</th></tr>",
    );
    for r in &e.rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{:.4}</td><td class=\"n\">{:.2}</td>\
             <td class=\"n\">{:.2}</td><td class=\"n\">{:.0}</td></tr>",
            html(&r.filter),
            html(&r.search),
            r.recall,
            r.latency.p50_ms,
            r.latency.p95_ms,
            r.queries_per_s
        );
    }
    out.push_str("</table><svg id=\"eval-plot\"></svg>\n");
}

/// `eval --compare-postgres`: one row per database, index and filter, at the recall floor.
fn compare(out: &mut String, f: &Figures) {
    let Some(c) = &f.compare else {
        return;
    };
    let _ = write!(
        out,
        "<h2>Databases side by side (eval --compare-postgres)</h2><p class=\"sub\">each at the \
         least search effort reaching recall@{k} &ge; {}, over {} queries; short answers: fewer \
         rows than the exact search found</p><table id=\"compare\"><tr><th>database</th>\
         <th>index</th><th>filter</th><th class=\"n\">passes</th><th>tuning</th>\
         <th class=\"n\">recall@{k}</th><th class=\"n\">short</th><th class=\"n\">queries/s</th>\
         <th class=\"n\">p50 ms</th><th class=\"n\">p95 ms</th><th class=\"n\">p99 ms</th></tr>",
        c.floor,
        c.queries,
        k = c.k
    );
    for r in &c.rows {
        let missed = !r.reached_floor && r.tuning != "defaults";
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{:.2} %</td><td>{}{}</td>\
             <td class=\"n\">{:.4}</td><td class=\"n\">{:.1} %</td><td class=\"n\">{:.0}</td>\
             <td class=\"n\">{:.2}</td><td class=\"n\">{:.2}</td><td class=\"n\">{:.2}</td></tr>",
            html(&r.database),
            html(&r.index),
            html(&r.filter),
            r.selectivity * 100.0,
            html(&r.tuning),
            if missed { " (floor not reached)" } else { "" },
            r.recall,
            r.short_share * 100.0,
            r.queries_per_s,
            r.latency.p50_ms,
            r.latency.p95_ms,
            r.latency.p99_ms
        );
    }
    out.push_str("</table>\n");
}
