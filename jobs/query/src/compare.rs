//! `eval` of two databases side by side (`eval --compare-postgres`): a Qdrant collection and a
//! pgvector table of the same run, each searched at the least effort that reaches a recall
//! floor (0.95 recall@10 by default, against the exact truth `eval` computes), unfiltered and
//! under three filters picked from the run's own payload: one year (the one nearest 1 % of the
//! papers), one source (nearest 10 %) and a wide range of years (nearest half).
//!
//! Latency at different recall is how such comparisons mislead, so each row is at its floor:
//! the effort is swept upwards (HNSW's `ef`, IVFFlat's probes) until the floor is reached, and
//! that sweep's step is the row (its recall, queries/s, p50/p95/p99 at the client, and the share
//! of short answers: fewer rows than the exact search found, pgvector's silent failure under a
//! selective filter). A target marked `defaults_only` is searched once as it comes (pgvector
//! with its defaults, iterative scans off), to show what the floor repaired.

use crate::eval::{cached_truth, score, EvalError};
use crate::exact::for_each_block;
use crate::held::HeldRows;
use crate::search::search_batched;
use embedfleet_core::rundb::RunDb;
use embedfleet_vectordb::{CountRequest, PayloadFilter, SearchOptions, Sink, VectorIndex};
use std::collections::BTreeMap;

/// The recall@k each database must reach.
pub const DEFAULT_FLOOR: f64 = 0.95;

/// One side of the comparison.
pub struct Target<'a> {
    /// How the table names it: `qdrant`, `pgvector`, `pgvector (defaults)`.
    pub database: String,
    pub sink: &'a dyn Sink,
    pub collection: String,
    /// Searched once at the database's defaults, not swept to the floor.
    pub defaults_only: bool,
}

/// How to compare.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    pub k: usize,
    pub floor: f64,
    pub batch_size: usize,
    pub in_flight: usize,
    /// The user's own `--filter`, beside the three picked (`None`: the three only).
    pub extra_filter: Option<(String, PayloadFilter)>,
}

pub use embedfleet_core::eval_tables::{CompareReport, CompareRow, Percentiles};

/// The efforts tried for an index, least first: `ef` from k up for HNSW (pgvector returns at
/// most `ef_search` rows), probes in doublings up to every list for IVFFlat.
fn efforts(index: Option<&VectorIndex>, k: usize) -> Vec<u64> {
    match index {
        Some(VectorIndex::Hnsw(_)) => {
            let mut e: Vec<u64> = [
                10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1000,
            ]
            .into_iter()
            .map(|ef: u64| ef.max(k as u64))
            .collect();
            e.dedup();
            e
        }
        Some(VectorIndex::IvfFlat { lists }) => {
            let mut e: Vec<u64> = std::iter::successors(Some(1u64), |p| Some(p * 2))
                .take_while(|p| p < lists)
                .collect();
            e.push(*lists);
            e
        }
        None => Vec::new(),
    }
}

fn options_at(
    index: Option<&VectorIndex>,
    effort: Option<u64>,
    k: usize,
) -> (SearchOptions, String) {
    let mut o = SearchOptions::new(k);
    let tuning = match (index, effort) {
        (_, None) => "defaults".to_owned(),
        (Some(VectorIndex::IvfFlat { .. }), Some(p)) => {
            o.probes = Some(p);
            format!("probes={p}")
        }
        (_, Some(ef)) => {
            o.hnsw_ef = Some(ef);
            format!("ef={ef}")
        }
    };
    (o, tuning)
}

/// The three filters of the comparison, from the run's payload: the year nearest 1 % of the
/// papers, the source nearest 10 % (when there are two or more), the range of latest years
/// nearest half.
pub fn pick_filters(db: &RunDb) -> Result<Vec<(String, PayloadFilter)>, EvalError> {
    let mut years: BTreeMap<i64, u64> = BTreeMap::new();
    let mut sources: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0u64;
    for_each_block(db, |_, _, points| {
        for p in points.iter() {
            total += 1;
            if let Some(y) = p.year {
                *years.entry(y).or_default() += 1;
            }
            if let Some(s) = p.source {
                *sources.entry(s.to_owned()).or_default() += 1;
            }
        }
        Ok(true)
    })?;
    let share = |n: u64| n as f64 / total.max(1) as f64;
    // Nearest on a log scale: 0.5 % and 2 % are as far from 1 %.
    let nearest = |target: f64| move |n: &u64| ((share(*n).max(1e-9) / target).ln()).abs();
    let mut out = Vec::new();
    if let Some((year, _)) = years
        .iter()
        .min_by(|a, b| nearest(0.01)(a.1).total_cmp(&nearest(0.01)(b.1)))
    {
        out.push((format!("year={year}"), PayloadFilter::year(*year)));
    }
    if sources.len() > 1 {
        if let Some((source, _)) = sources
            .iter()
            .min_by(|a, b| nearest(0.10)(a.1).total_cmp(&nearest(0.10)(b.1)))
        {
            out.push((
                format!("source={source}"),
                PayloadFilter::source(source.clone()),
            ));
        }
    }
    if let Some(&last) = years.keys().next_back() {
        let mut best: Option<(i64, f64)> = None;
        let mut n = 0;
        for (&year, &count) in years.iter().rev() {
            n += count;
            let d = nearest(0.5)(&n);
            if best.is_none_or(|(_, bd)| d < bd) {
                best = Some((year, d));
            }
        }
        if let Some((first, _)) = best.filter(|(first, _)| *first < last) {
            out.push((format!("year>={first}"), PayloadFilter::years(first, last)));
        }
    }
    Ok(out)
}

/// Compares `targets` on `queries` (see the module docs).
pub fn compare(
    targets: &[Target<'_>],
    db: &RunDb,
    queries: &[Vec<f32>],
    options: &CompareOptions,
) -> Result<CompareReport, EvalError> {
    let mut filters: Vec<(String, Option<PayloadFilter>)> = vec![("none".into(), None)];
    filters.extend(pick_filters(db)?.into_iter().map(|(n, f)| (n, Some(f))));
    if let Some((n, f)) = &options.extra_filter {
        filters.push((n.clone(), Some(f.clone())));
    }
    let mut report = CompareReport {
        format_version: 1,
        k: options.k,
        floor: options.floor,
        queries: queries.len(),
        rows: Vec::new(),
    };
    // Each database against what it holds now (a delete may have reached one and not yet the
    // other): the same state shares one cached truth.
    let held: Vec<HeldRows> = targets
        .iter()
        .map(|t| HeldRows::of(db, t.sink, &t.collection))
        .collect::<Result<_, _>>()?;
    for (name, filter) in &filters {
        for (target, held) in targets.iter().zip(&held) {
            let truth = cached_truth(db, queries, options.k, filter.as_ref(), held)?;
            let row = measure(target, name, filter.as_ref(), queries, &truth, options)?;
            report.rows.push(row);
        }
    }
    Ok(report)
}

/// One target under one filter: the sweep up to the floor (or its defaults).
fn measure(
    target: &Target<'_>,
    filter_name: &str,
    filter: Option<&PayloadFilter>,
    queries: &[Vec<f32>],
    truth: &[Vec<crate::exact::ExactHit>],
    options: &CompareOptions,
) -> Result<CompareRow, EvalError> {
    let info = target
        .sink
        .collection_info(&target.collection)?
        .ok_or_else(|| EvalError::NoCollection {
            collection: target.collection.clone(),
            target: target.sink.target(),
        })?;
    let all = info.points.max(1);
    let passing = match filter {
        None => info.points,
        Some(f) => target
            .sink
            .count(CountRequest::new(&target.collection).filter(Some(f)))?,
    };
    // An index that covers nothing (Qdrant below its indexing threshold) is not searched:
    // every search is exact, whatever its effort.
    let index = info.index.as_ref().filter(|_| info.indexed_vectors > 0);
    let ladder: Vec<Option<u64>> = if target.defaults_only {
        vec![None]
    } else {
        let e = efforts(index, options.k);
        if e.is_empty() {
            vec![None]
        } else {
            e.into_iter().map(Some).collect()
        }
    };
    // A first pass warms the caches, so that the first step is not measured cold.
    let run = |effort: Option<u64>| {
        let (mut o, tuning) = options_at(index, effort, options.k);
        o.filter = filter.cloned();
        search_batched(
            target.sink,
            &target.collection,
            queries,
            &o,
            options.batch_size,
            options.in_flight,
        )
        .map(|found| (found, tuning))
    };
    run(ladder[0])?;
    let mut last = None;
    for effort in &ladder {
        let (found, tuning) = run(*effort)?;
        let (recall, short_share) = score(truth, &found.hits);
        let row = CompareRow {
            database: target.database.clone(),
            index: index.map_or_else(|| "none (exact search)".to_owned(), ToString::to_string),
            filter: filter_name.to_owned(),
            selectivity: passing as f64 / all as f64,
            tuning,
            reached_floor: recall >= options.floor,
            recall,
            short_share,
            queries_per_s: queries.len() as f64 / found.elapsed.as_secs_f64().max(1e-9),
            latency: Percentiles::of(&found.batch_latencies),
        };
        if row.reached_floor {
            return Ok(row);
        }
        last = Some(row);
    }
    Ok(last.expect("a ladder has one step at least. This is a bug."))
}

/// The report as a markdown table.
pub fn render(report: &CompareReport) -> String {
    let mut out = format!(
        "recall@{k} side by side over {} queries, each at the least effort reaching recall@{k} ≥ {} (\"not reached\": the most effort tried)\n\n\
         | database | index | filter | passes | tuning | recall@{k} | short answers | queries/s | p50 ms | p95 ms | p99 ms |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        report.queries,
        report.floor,
        k = report.k
    );
    for r in &report.rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} % | {}{} | {:.4} | {:.1} % | {:.0} | {:.2} | {:.2} | {:.2} |\n",
            r.database,
            r.index,
            r.filter,
            r.selectivity * 100.0,
            r.tuning,
            if r.reached_floor || r.tuning == "defaults" {
                ""
            } else {
                " (not reached)"
            },
            r.recall,
            r.short_share * 100.0,
            r.queries_per_s,
            r.latency.p50_ms,
            r.latency.p95_ms,
            r.latency.p99_ms
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedfleet_vectordb::HnswParams;

    #[test]
    fn efforts_start_at_k_for_hnsw_and_double_to_every_list_for_ivfflat() {
        let hnsw = VectorIndex::Hnsw(HnswParams::default());
        let e = efforts(Some(&hnsw), 10);
        assert_eq!(&e[..3], &[10, 16, 24]);
        let e = efforts(Some(&hnsw), 100);
        assert_eq!(&e[..2], &[100, 128]);
        let ivf = VectorIndex::IvfFlat { lists: 200 };
        assert_eq!(efforts(Some(&ivf), 10), [1, 2, 4, 8, 16, 32, 64, 128, 200]);
        assert!(efforts(None, 10).is_empty());
        let (o, tuning) = options_at(Some(&ivf), Some(8), 10);
        assert_eq!(
            (o.probes, o.hnsw_ef, tuning.as_str()),
            (Some(8), None, "probes=8")
        );
    }
}
