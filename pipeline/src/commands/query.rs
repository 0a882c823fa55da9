//! `query`, `eval`, `tune --queries` and `publish`: the stages after the upload.

use super::invoke::Ended;
use crate::flags::{EvalFlags, PublishFlags, QueryFlags};
use crate::query_job::{self, QueryJobRequest};
use crate::records;
use crate::settings::query::{QueryRun, QuerySettings};
use crate::settings::{self, EvalMeasure, EvalQueries, QueryModelSettings};
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_core::rundb::RunDb;
use embedfleet_query::tune::{self, QueryTuneOptions};
use embedfleet_query::{EmbedQueries, PrecomputedVectors, QueryModel, QueryOptions};
use embedfleet_vectordb::SearchOptions;
use std::path::Path;

/// The query model of `settings`, on this host (default: its CPU).
fn query_model(settings: &QueryModelSettings) -> Result<QueryModel> {
    let devices = embedfleet_embed::parse_devices(settings.devices.as_deref().unwrap_or("cpu"))?;
    Ok(
        QueryModel::new(settings.model_dir.clone(), devices, settings.dim)
            .with_precision(settings.precision)
            .with_text_rule(settings.text_rule),
    )
}

pub fn query(args: &QueryFlags, slot: &mut super::invoke::RunDbSlot) -> Result<Ended> {
    let db = slot.open(&args.run_dir)?;
    let sink = args.target.open(&args.run_dir)?;
    let QuerySettings { model, run } = QuerySettings::resolve(db, sink.as_ref(), args)?;
    let options = match run {
        QueryRun::Print { terms, search } => {
            return print_top_hits(db, sink.as_ref(), args, &terms, &model, &search)
        }
        QueryRun::Workload(options) => *options,
    };
    let output = &options.output;
    let mut embedder = query_embedder(db, args, &model, &options)?;
    let report = embedfleet_query::run(sink.as_ref(), embedder.as_mut(), &options)?;
    records::record_query_output(db, output)?;
    if report.already_done == report.queries {
        eprintln!(
            "{} already holds the results of this request ({} queries, the same terms, collection contents, settings and model); nothing to do",
            output.display(),
            report.queries
        );
        return Ok(Ended::nothing_written(exit::SUCCESS));
    }
    crate::activity::record_query(
        db,
        &embedfleet_vectordb::progress_key(sink.as_ref(), &args.collection),
        &report,
    );
    say_query_report(&report, &options, output, args.top_k);
    Ok(exit::SUCCESS.into())
}

/// Where the query vectors come from: embedded here, or by a scheduler job whose files this
/// owner collects (nothing to embed when the output already answers the request).
fn query_embedder(
    db: &RunDb,
    args: &QueryFlags,
    model: &QueryModelSettings,
    options: &QueryOptions,
) -> Result<Box<dyn EmbedQueries>> {
    if !args.submit {
        return Ok(Box::new(query_model(model)?));
    }
    if embedfleet_query::workload::is_answered(options) {
        return Ok(Box::new(PrecomputedVectors::default()));
    }
    let request = QueryJobRequest {
        run_dir: args.run_dir.clone(),
        model: model.clone(),
        queue: args
            .queue
            .clone()
            .expect("clap requires --queue with --submit"),
        part_terms: args.part_terms,
        poll_interval_s: args.poll_interval,
    };
    let vectors = query_job::embed_on_cluster(db, &request, &options.terms, &mut |line| {
        eprintln!("{line}")
    })?;
    Ok(Box::new(vectors))
}

/// What a finished query workload says: its speed, and its short results (never silent).
fn say_query_report(
    report: &embedfleet_query::QueryReport,
    options: &QueryOptions,
    output: &Path,
    top_k: usize,
) {
    let l = report.latency;
    eprintln!(
        "{} queries ({} done before) into {}: {:.0} queries/s searching (batches of {}, {} in flight), embedding {:.1} s; per request p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms",
        report.queries,
        report.already_done,
        output.display(),
        report.queries_per_s(),
        options.batch_size,
        options.in_flight,
        report.embed.as_secs_f64(),
        l.p50_ms,
        l.p95_ms,
        l.p99_ms
    );
    if report.short > 0 {
        eprintln!(
            "warning: {} of these queries got fewer than {} results although the collection holds that many matching papers: the index gave up early (pgvector: search with --pg-iterative-scan relaxed, or a higher ef)",
            report.short, top_k
        );
    } else {
        eprintln!(
            "short results: none (every query got {} results, or every matching paper)",
            top_k
        );
    }
}

/// A term's top papers on stdout, a line each: rank, score, id, first words (`query` of
/// terms, and the query that ends `run`).
pub(crate) fn print_hits(term: &str, hits: &[embedfleet_vectordb::query::QueryHit]) {
    println!("top {} papers for \"{term}\":", hits.len());
    for (rank, h) in hits.iter().enumerate() {
        println!(
            "{:>2}. {:.4}  {}  {}",
            rank + 1,
            h.hit.score,
            h.hit.paper_id.as_deref().unwrap_or("?"),
            h.first_words.as_deref().unwrap_or("")
        );
    }
}

/// `query` with no `--output`: each term's top hits, with the first words of each paper, on
/// the terminal. Nothing is written.
fn print_top_hits(
    db: &RunDb,
    sink: &dyn embedfleet_vectordb::Sink,
    args: &QueryFlags,
    terms: &[String],
    model: &QueryModelSettings,
    search: &SearchOptions,
) -> Result<Ended> {
    let vectors = query_model(model)?.embed(&model.instruction, terms)?;
    for (term, vector) in terms.iter().zip(&vectors) {
        let hits = embedfleet_vectordb::query::search_with_text_as(
            sink,
            db,
            &args.collection,
            vector,
            search,
            12,
        )?;
        print_hits(term, &hits);
        if hits.is_empty() && search.filter.is_some() {
            eprintln!(
                "note: no paper of `{}` passes --filter {}",
                args.collection,
                args.filters.join(" --filter ")
            );
        }
    }
    eprintln!("(printed, not saved: `--output FILE.parquet` writes every hit to a file)");
    Ok(Ended::nothing_written(exit::SUCCESS))
}

pub fn eval(args: &EvalFlags, slot: &mut super::invoke::RunDbSlot) -> Result<i32> {
    let db = slot.open(&args.run_dir)?;
    let sink = args.target.open(&args.run_dir)?;
    let settings = settings::EvalSettings::resolve(db, args)?;
    let queries = match &settings.queries {
        EvalQueries::Terms { terms, model } => {
            query_model(model)?.embed(&model.instruction, terms)?
        }
        EvalQueries::Sample { papers, seed } => {
            embedfleet_query::sample_queries(db, *papers, *seed)?
        }
    };
    let (options, plot) = match &settings.measure {
        EvalMeasure::Recall { options, plot } => (options, plot),
        EvalMeasure::Compare(comparison) => {
            return super::compare::eval_compare(args, db, sink.as_ref(), &queries, comparison);
        }
    };
    let report = embedfleet_query::eval(sink.as_ref(), db, &queries, options)?;
    if settings.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", embedfleet_query::render(&report));
    }
    embedfleet_query::write_recall_plot(&report, plot)
        .map_err(|e| anyhow::anyhow!("failed to write {}: {e}", plot.display()))?;
    eprintln!("wrote {}", plot.display());
    Ok(exit::SUCCESS)
}

/// `tune --queries`: the query workload's batch size and requests in flight.
pub(super) fn tune_queries(
    db: &RunDb,
    sink: &dyn embedfleet_vectordb::Sink,
    options: &QueryTuneOptions,
) -> Result<i32> {
    let report = tune::tune_queries(sink, db, options)?;
    print!("{}", tune::markdown(&report));
    crate::tuned::save_queries(db, sink.kind(), &report)?;
    eprintln!(
        "chosen: {} queries a request, {} in flight ({:.0} queries/s into the {} sink); saved in run.db, `embedfleet query` uses it",
        report.batch_size,
        report.in_flight,
        report.queries_per_s,
        sink.kind()
    );
    Ok(exit::SUCCESS)
}

pub fn publish(args: &PublishFlags, slot: &mut super::invoke::RunDbSlot) -> Result<i32> {
    let db = slot.open(&args.run_dir)?;
    let options = settings::publish::publish_options(db, args)?;
    let report = embedfleet_publish::publish(db, &options)
        .with_context(|| format!("failed to publish into {}", args.out.display()))?;
    eprintln!(
        "published {} rows in {} files ({:.1} MB{}) into {}{}",
        report.rows,
        report.files,
        report.bytes as f64 / 1e6,
        if report.reused > 0 {
            format!(", {} files reused from a killed run", report.reused)
        } else {
            String::new()
        },
        report.out.display(),
        if report.partial {
            "; PARTIAL: the card lists what is missing"
        } else {
            ""
        }
    );
    eprintln!("{}", embedfleet_publish::load_hint(&report.out));
    Ok(if report.partial {
        exit::PARTIAL
    } else {
        exit::SUCCESS
    })
}
