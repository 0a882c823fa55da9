//! `report --html`: one self-contained page. The tables are written here, every value escaped;
//! the plots and the timeline are drawn in the browser by the page's own script
//! (`page/report.js`, inline) from the figures as a JSON block. Nothing is fetched: no CDN, no
//! font, no image.

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
    eval(&mut out, figures);
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
    let share = if f.papers_planned > 0 {
        100.0 * f.papers_embedded as f64 / f.papers_planned as f64
    } else {
        0.0
    };
    card(
        out,
        &format!("{} / {}", f.papers_embedded, f.papers_planned),
        &format!("papers embedded ({share:.1} %)"),
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

fn eval(out: &mut String, f: &Figures) {
    let Some(e) = &f.eval else {
        return;
    };
    let _ = write!(
        out,
        "<h2>Search quality (eval)</h2><p class=\"sub\">recall@{} of {} over {} queries against \
         latency, per search setting</p><table id=\"eval\"><tr><th>filter</th><th>search</th>\
         <th class=\"n\">recall</th><th class=\"n\">p50 ms</th><th class=\"n\">p95 ms</th>\
         <th class=\"n\">queries/s</th></tr>",
        e.k,
        html(&e.collection),
        e.queries
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
