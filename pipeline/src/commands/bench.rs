//! `bench-gpu`: measurements in the PyTorch peer's JSON fields, one line each on stdout, and a
//! table of them on stderr.

use crate::flags::BenchGpuFlags;
use anyhow::{bail, Context, Result};
use embedfleet_core::exit;
use embedfleet_core::settings::MiniBatchRule;
use embedfleet_embed::bench::{cosine, paper_mix, Bench, BenchRecord, FidelityCases};
use serde::{Deserialize, Serialize};

/// The mix's vectors as `--save-vectors` writes them.
#[derive(Serialize, Deserialize)]
struct SavedVectors {
    lengths: Vec<usize>,
    vectors: Vec<Vec<f32>>,
}

pub fn bench_gpu(args: &BenchGpuFlags) -> Result<i32> {
    let devices = embedfleet_embed::parse_devices(&args.devices)?;
    let bench = Bench::load(
        &args.model_dir,
        &devices,
        !args.no_memory_plan,
        args.seed,
        args.dtype,
        args.precision,
    )?;
    let mut table = Vec::new();
    // A step that fails is a line (`fidelity_error`, `bench_error`) and the rest still runs:
    // a GPU check gets every figure it can, then exits non-zero.
    let mut failed = 0usize;
    // The mix the job's way first, its vectors written at once: the run's main figure, and the
    // vectors later checks compare with, survive a run cut short.
    let lengths = if args.skip_mix {
        None
    } else {
        Some(mix_lengths(args)?)
    };
    if let Some(lengths) = &lengths {
        failed += mix_token_budget(&bench, args, lengths, &mut table)?;
    }
    if let Some(path) = &args.fidelity {
        failed += fidelity(&bench, path)?;
    }
    if !args.skip_uniform {
        failed += uniform_shapes(&bench, args, &mut table)?;
    }
    if let Some(lengths) = lengths.as_ref().filter(|_| !args.skip_study) {
        match bench.mix("mix_packed_study_batches", lengths, MiniBatchRule::STUDY) {
            Ok((record, _)) => {
                print_json(&record);
                table.push(record);
            }
            Err(e) => {
                bench_error("mix_packed_study_batches", &e);
                failed += 1;
            }
        }
    }
    eprint!("{}", render(&table));
    if failed > 0 {
        eprintln!(
            "{failed} measurement(s) failed: see the `bench_error` and `fidelity_error` lines"
        );
        return Ok(exit::FAILURE);
    }
    Ok(exit::SUCCESS)
}

/// Each `--shapes` shape (papers x tokens) timed; the count of those that failed.
fn uniform_shapes(
    bench: &Bench,
    args: &BenchGpuFlags,
    table: &mut Vec<BenchRecord>,
) -> Result<usize> {
    let mut failed = 0;
    for shape in &args.shapes {
        let (b, t) = parse_shape(shape)?;
        match bench.uniform(b, t, args.forwards) {
            Ok(record) => {
                print_json(&record);
                table.push(record);
            }
            Err(e) => {
                bench_error(&format!("uniform_b{b}_t{t}"), &e.to_string());
                failed += 1;
            }
        }
    }
    Ok(failed)
}

/// The mix's token lengths: `--mix`'s file, else the seeded paper mix.
fn mix_lengths(args: &BenchGpuFlags) -> Result<Vec<usize>> {
    let Some(path) = &args.mix else {
        return Ok(paper_mix(args.mix_papers, args.seed));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    serde_json::from_str::<Vec<usize>>(&text)
        .with_context(|| format!("{} is not a JSON list of token lengths", path.display()))
}

/// The mix in the job's token-budget mini-batches; its vectors saved (`--save-vectors`) and
/// compared (`--compare-vectors`) as soon as they exist. Returns the failures (0 or 1).
fn mix_token_budget(
    bench: &Bench,
    args: &BenchGpuFlags,
    lengths: &[usize],
    table: &mut Vec<BenchRecord>,
) -> Result<usize> {
    let budget = MiniBatchRule::TokenBudget {
        max_tokens: args.batch_tokens,
    };
    let vectors = match bench.mix("mix_packed_token_budget", lengths, budget) {
        Ok((record, vectors)) => {
            print_json(&record);
            table.push(record);
            vectors
        }
        Err(e) => {
            bench_error("mix_packed_token_budget", &e);
            return Ok(1);
        }
    };
    if let Some(path) = &args.save_vectors {
        let saved = SavedVectors {
            lengths: lengths.to_vec(),
            vectors: vectors.clone(),
        };
        std::fs::write(path, serde_json::to_vec(&saved)?)
            .with_context(|| format!("failed to write {}", path.display()))?;
    }
    if let Some(path) = &args.compare_vectors {
        let saved: SavedVectors = serde_json::from_slice(
            &std::fs::read(path).with_context(|| format!("failed to read {}", path.display()))?,
        )?;
        if saved.lengths != lengths {
            bail!("{} holds vectors of another mix", path.display());
        }
        let mut cosines: Vec<f64> = saved
            .vectors
            .iter()
            .zip(&vectors)
            .map(|(a, b)| cosine(a, b))
            .collect();
        cosines.sort_by(f64::total_cmp);
        let lowest = cosines.first().copied().unwrap_or(f64::NAN);
        let median = cosines.get(cosines.len() / 2).copied().unwrap_or(f64::NAN);
        println!(
            "{}",
            serde_json::json!({"event": "compare", "papers": lengths.len(),
                "min_cosine": lowest, "median_cosine": median})
        );
        eprintln!(
            "compare: cosine against {}: lowest {lowest:.6}, median {median:.6}",
            path.display()
        );
    }
    Ok(0)
}

/// Cosines against the reference vectors of `path`. Returns the failed cases.
fn fidelity(bench: &Bench, path: &std::path::Path) -> Result<usize> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let cases: FidelityCases = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a fidelity file (cases of name, ids, embedding)",
            path.display()
        )
    })?;
    let mut failed = 0;
    for record in bench.fidelity(&cases) {
        print_json(&record);
        match (record.cosine, &record.error) {
            (Some(cosine), _) => eprintln!(
                "fidelity {:<24} {:>6} tokens  cosine {cosine:.6}",
                record.name, record.tokens
            ),
            (None, error) => {
                eprintln!(
                    "fidelity {:<24} {:>6} tokens  failed: {}",
                    record.name,
                    record.tokens,
                    error.as_deref().unwrap_or("?")
                );
                failed += 1;
            }
        }
    }
    Ok(failed)
}

/// A measurement that failed: a `bench_error` line on stdout, and a line on stderr.
fn bench_error(label: &str, error: &str) {
    println!(
        "{}",
        serde_json::json!({"event": "bench_error", "label": label, "error": error})
    );
    eprintln!("{label}: failed: {error}");
}

/// One JSON line on stdout.
fn print_json<T: Serialize>(value: &T) {
    println!(
        "{}",
        serde_json::to_string(value).expect("records serialise. This is a bug.")
    );
}

fn parse_shape(shape: &str) -> Result<(usize, usize)> {
    let parsed = shape
        .split_once('x')
        .and_then(|(b, t)| Some((b.trim().parse().ok()?, t.trim().parse().ok()?)))
        .filter(|&(b, t): &(usize, usize)| b > 0 && t > 0);
    parsed.with_context(|| format!("--shapes takes BATCHxTOKENS, as in 64x512; not `{shape}`"))
}

fn render(rows: &[BenchRecord]) -> String {
    let mut out = format!(
        "{:<26} {:>9} {:>11} {:>8} {:>9} {:>9} {:>6} {:>9}\n",
        "run", "tokens", "tokens/s", "TFLOP/s", "peak GB", "est. GB", "mb", "fallbacks"
    );
    for r in rows {
        let f = &r.fallbacks;
        out.push_str(&format!(
            "{:<26} {:>9} {:>11.0} {:>8.1} {:>9} {:>9.1} {:>6} {:>9}\n",
            r.label,
            r.real_tokens,
            r.real_tok_per_s,
            r.tflops_useful,
            r.peak_mem_gb.map_or("-".into(), |g| format!("{g:.1}")),
            r.estimate_gb,
            r.mini_batches,
            f.split + f.sequential + f.chunked
        ));
    }
    if let Some(r) = rows.first() {
        out.push_str(&format!(
            "attention: {}; devices: {}\n",
            r.attention, r.devices
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_as_batch_by_tokens() {
        assert_eq!(parse_shape("64x512").unwrap(), (64, 512));
        for bad in ["64", "0x5", "x", "ax2"] {
            assert!(parse_shape(bad).is_err(), "{bad}");
        }
    }
}
