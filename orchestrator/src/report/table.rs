//! The numbers of the report: the study's Table 2 (mean ± std per batch of each phase), the
//! throughput, padding and fallbacks of a run, from the latest successful run of each batch.

use embedfleet_core::rundb::{BatchRunRecord, BatchTimings};
use serde::Serialize;

/// Papers of the full peS2o corpus the study embedded, for the extrapolation line.
pub const FULL_CORPUS_PAPERS: u64 = 8_300_000;

/// Mean and sample standard deviation (n − 1; 0 for one value) of a per-batch quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Stat {
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    /// The statistics of `values`; all zero when there are none.
    pub fn of(values: &[f64]) -> Stat {
        if values.is_empty() {
            return Stat::default();
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = if values.len() > 1 {
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        Stat {
            mean,
            std: var.sqrt(),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// One batch's line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchLine {
    pub batch_id: i64,
    pub run_id: i64,
    pub devices: String,
    /// Unix seconds.
    pub started_unix_s: f64,
    pub finished_unix_s: f64,
    /// The job's own record of its phases (`report --json` shows them beside the line's
    /// other fields).
    #[serde(flatten)]
    pub timings: BatchTimings,
    /// Per second of the job's total time.
    pub papers_per_s: f64,
    pub tokens_per_s: f64,
}

/// Fallback counts summed over the batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Fallbacks {
    /// Mini-batches split in halves after an out-of-memory.
    pub split: u64,
    /// Papers embedded alone after an out-of-memory.
    pub sequential: u64,
    /// Papers embedded in chunks because even alone they did not fit.
    pub chunked: u64,
    /// Papers longer than the context, embedded in chunks.
    pub long_papers_chunked: u64,
}

/// The run as a whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub batches: usize,
    pub model_load_s: Stat,
    pub io_s: Stat,
    pub tokenize_s: Stat,
    pub inference_s: Stat,
    pub total_s: Stat,
    /// Σ inference / Σ total (the same as mean inference / mean total).
    pub inference_share: f64,
    /// Per-batch throughput, over each job's total time.
    pub papers_per_s: Stat,
    pub tokens_per_s: Stat,
    pub papers: u64,
    pub tokens: u64,
    pub padding_tokens: u64,
    /// Padding tokens / real tokens: what a padded forward would have wasted.
    pub padding_share: f64,
    /// Σ papers / Σ job time: throughput of one job (one node).
    pub job_papers_per_s: f64,
    pub job_tokens_per_s: f64,
    /// First start to last finish, and the papers per second of the run over it (jobs at once
    /// count together).
    pub wall_s: f64,
    pub wall_papers_per_s: f64,
    pub fallbacks: Fallbacks,
    /// The largest peak over the batches that recorded one.
    pub peak_memory_bytes: Option<u64>,
    /// Job-hours (node-hours) for [`FULL_CORPUS_PAPERS`] at `job_papers_per_s`.
    pub full_corpus_papers: u64,
    pub full_corpus_job_hours: f64,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// One line per run, in the order given.
pub fn lines(runs: &[BatchRunRecord]) -> Vec<BatchLine> {
    runs.iter()
        .map(|r| {
            let t = &r.timings;
            BatchLine {
                batch_id: r.batch_id,
                run_id: r.run_id,
                devices: r.devices.clone(),
                started_unix_s: r.started_unix_s,
                finished_unix_s: r.finished_unix_s,
                timings: t.clone(),
                papers_per_s: ratio(t.papers as f64, t.total_s),
                tokens_per_s: ratio(t.tokens as f64, t.total_s),
            }
        })
        .collect()
}

/// The summary of `lines`; `None` when there are none.
pub fn summarize(lines: &[BatchLine]) -> Option<Summary> {
    if lines.is_empty() {
        return None;
    }
    let stat = |f: fn(&BatchLine) -> f64| Stat::of(&lines.iter().map(f).collect::<Vec<_>>());
    let sum_f = |f: fn(&BatchLine) -> f64| lines.iter().map(f).sum::<f64>();
    let sum_u = |f: fn(&BatchLine) -> u64| lines.iter().map(f).sum::<u64>();
    let (papers, tokens) = (sum_u(|l| l.timings.papers), sum_u(|l| l.timings.tokens));
    let job_s = sum_f(|l| l.timings.total_s);
    let start = lines
        .iter()
        .map(|l| l.started_unix_s)
        .fold(f64::MAX, f64::min);
    let end = lines
        .iter()
        .map(|l| l.finished_unix_s)
        .fold(f64::MIN, f64::max);
    let wall_s = (end - start).max(0.0);
    let mut fallbacks = Fallbacks::default();
    for t in lines.iter().map(|l| &l.timings) {
        fallbacks.split += t.fallback_split;
        fallbacks.sequential += t.fallback_sequential;
        fallbacks.chunked += t.fallback_chunked;
        fallbacks.long_papers_chunked += t.long_chunked;
    }
    let job_papers_per_s = ratio(papers as f64, job_s);
    Some(Summary {
        batches: lines.len(),
        model_load_s: stat(|l| l.timings.model_load_s),
        io_s: stat(|l| l.timings.io_s),
        tokenize_s: stat(|l| l.timings.tokenize_s),
        inference_s: stat(|l| l.timings.inference_s),
        total_s: stat(|l| l.timings.total_s),
        inference_share: ratio(sum_f(|l| l.timings.inference_s), job_s),
        papers_per_s: stat(|l| l.papers_per_s),
        tokens_per_s: stat(|l| l.tokens_per_s),
        papers,
        tokens,
        padding_tokens: sum_u(|l| l.timings.padding_tokens),
        padding_share: ratio(sum_u(|l| l.timings.padding_tokens) as f64, tokens as f64),
        job_papers_per_s,
        job_tokens_per_s: ratio(tokens as f64, job_s),
        wall_s,
        wall_papers_per_s: ratio(papers as f64, wall_s),
        fallbacks,
        peak_memory_bytes: lines
            .iter()
            .filter_map(|l| l.timings.peak_memory_bytes)
            .max(),
        full_corpus_papers: FULL_CORPUS_PAPERS,
        full_corpus_job_hours: ratio(FULL_CORPUS_PAPERS as f64, job_papers_per_s) / 3600.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedfleet_core::rundb::BatchTimings;

    fn run(batch_id: i64, start: f64, t: BatchTimings) -> BatchRunRecord {
        BatchRunRecord {
            run_id: batch_id * 10,
            batch_id,
            started_unix_s: start,
            finished_unix_s: start + t.total_s,
            devices: "Cpu".into(),
            timings: t,
        }
    }

    /// Three batches whose statistics are worked out by hand below.
    fn runs() -> Vec<BatchRunRecord> {
        let t = |load, io, tok, inf, total, papers, tokens, pad| BatchTimings {
            model_load_s: load,
            io_s: io,
            tokenize_s: tok,
            inference_s: inf,
            total_s: total,
            papers,
            tokens,
            padding_tokens: pad,
            ..BatchTimings::default()
        };
        vec![
            run(1, 100.0, t(1.0, 2.0, 0.5, 6.0, 10.0, 40, 4000, 400)),
            run(
                2,
                100.0,
                BatchTimings {
                    fallback_split: 2,
                    fallback_sequential: 3,
                    long_chunked: 1,
                    peak_memory_bytes: Some(5_000),
                    ..t(2.0, 4.0, 0.5, 12.0, 20.0, 40, 6000, 0)
                },
            ),
            run(
                3,
                110.0,
                BatchTimings {
                    fallback_chunked: 1,
                    peak_memory_bytes: Some(7_000),
                    ..t(3.0, 3.0, 1.0, 18.0, 30.0, 60, 2000, 600)
                },
            ),
        ]
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn stat_is_mean_and_sample_std() {
        // mean 4; squared deviations 4+0+4 = 8; / (3-1) = 4; std 2.
        let s = Stat::of(&[2.0, 4.0, 6.0]);
        assert!(close(s.mean, 4.0) && close(s.std, 2.0), "{s:?}");
        assert_eq!((s.min, s.max), (2.0, 6.0));
        assert_eq!(Stat::of(&[3.5]).std, 0.0);
        assert_eq!(Stat::of(&[]), Stat::default());
    }

    #[test]
    fn table_two_of_three_batches() {
        let runs = runs();
        let lines = lines(&runs);
        assert_eq!(lines.len(), 3);
        // Batch 1: 40 papers / 10 s, 4000 tokens / 10 s.
        assert!(close(lines[0].papers_per_s, 4.0) && close(lines[0].tokens_per_s, 400.0));
        let s = summarize(&lines).unwrap();
        assert_eq!(s.batches, 3);
        // model load 1, 2, 3: mean 2, deviations 1+0+1 = 2, /2 = 1, std 1.
        assert!(close(s.model_load_s.mean, 2.0) && close(s.model_load_s.std, 1.0));
        // io 2, 4, 3: mean 3, std 1.
        assert!(close(s.io_s.mean, 3.0) && close(s.io_s.std, 1.0));
        // tokenize 0.5, 0.5, 1: mean 2/3; deviations 1/36+1/36+4/36 = 1/6, /2 = 1/12.
        assert!(close(s.tokenize_s.mean, 2.0 / 3.0));
        assert!(close(s.tokenize_s.std, (1.0f64 / 12.0).sqrt()));
        // inference 6, 12, 18: mean 12, deviations 36+0+36, /2 = 36, std 6.
        assert!(close(s.inference_s.mean, 12.0) && close(s.inference_s.std, 6.0));
        // total 10, 20, 30: mean 20, std 10; inference share 36 / 60.
        assert!(close(s.total_s.mean, 20.0) && close(s.total_s.std, 10.0));
        assert!(close(s.inference_share, 0.6));
        // papers/s per batch 4, 2, 2: mean 8/3, deviations 16/9+4/9+4/9 = 24/9, /2, std √(4/3).
        assert!(close(s.papers_per_s.mean, 8.0 / 3.0));
        assert!(close(s.papers_per_s.std, (4.0f64 / 3.0).sqrt()));
        // tokens/s per batch 400, 300, 66.67.
        assert!(close(
            s.tokens_per_s.mean,
            (400.0 + 300.0 + 2000.0 / 30.0) / 3.0
        ));
        assert_eq!((s.papers, s.tokens, s.padding_tokens), (140, 12_000, 1_000));
        assert!(close(s.padding_share, 1000.0 / 12000.0));
        // 140 papers in 60 job-seconds; the jobs ran from t=100 to t=140, 40 s of wall time.
        assert!(close(s.job_papers_per_s, 140.0 / 60.0));
        assert!(close(s.job_tokens_per_s, 200.0));
        assert!(close(s.wall_s, 40.0) && close(s.wall_papers_per_s, 3.5));
        assert_eq!(
            s.fallbacks,
            Fallbacks {
                split: 2,
                sequential: 3,
                chunked: 1,
                long_papers_chunked: 1
            }
        );
        assert_eq!(s.peak_memory_bytes, Some(7_000));
        assert!(close(
            s.full_corpus_job_hours,
            FULL_CORPUS_PAPERS as f64 / (140.0 / 60.0) / 3600.0
        ));
    }

    #[test]
    fn no_batches_no_summary_and_no_division_by_zero() {
        assert_eq!(summarize(&[]), None);
        let zero = vec![run(1, 0.0, BatchTimings::default())];
        let s = summarize(&lines(&zero)).unwrap();
        assert_eq!(
            (s.inference_share, s.padding_share, s.wall_papers_per_s),
            (0.0, 0.0, 0.0)
        );
        assert_eq!(s.peak_memory_bytes, None);
    }
}
