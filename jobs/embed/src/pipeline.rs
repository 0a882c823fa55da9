//! Embedding a stream of parts (groups of papers) on several devices.
//!
//! A tokenizer thread works one part ahead of the devices, so tokenisation never stalls them;
//! each part's chunks are cut into mini-batches by the plan's rule and spread over the device
//! workers through one queue; vectors of chunked papers are combined when the part is complete.

use super::chunk;
use super::device::{self, Done, FallbackStats, Work};
use super::minibatch::{self, Item};
use embedfleet_core::paper::{count_chars, Paper};
use embedfleet_core::settings::MiniBatchRule;
use embedfleet_models::{format_query, Embedder, Tokenizer};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How papers become token sequences.
pub struct Encoding<'a> {
    pub tokenizer: &'a Tokenizer,
    /// Longest sequence, EOS included: the model's context or `--max-tokens`.
    pub max_len: usize,
    pub rule: MiniBatchRule,
    /// `Some(instruction)` embeds queries (`Instruct: {task}\nQuery:{text}`); documents get none.
    pub query_instruction: Option<String>,
    pub tokenize_threads: usize,
}

/// One embedded paper.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    pub vector: Vec<f32>,
    pub n_tokens: u32,
    pub n_chunks: u16,
}

/// What embedding one part came to.
#[derive(Debug, Default)]
pub struct PartOutcome {
    /// One per paper, in order; `Err` says why a paper could not be embedded.
    pub results: Vec<Result<Embedded, String>>,
    pub tokens: u64,
    pub padding_tokens: u64,
    pub fallbacks: FallbackStats,
    /// Papers longer than the context, split into chunks.
    pub long_chunked: u64,
    pub tokenize: Duration,
    /// Wall time from the first mini-batch sent to the last vector back.
    pub inference: Duration,
}

struct Tokenized {
    papers: Vec<Paper>,
    /// Per paper: its chunks (each ending in EOS), or a tokenizer error.
    chunks: Vec<Result<Vec<Arc<Vec<u32>>>, String>>,
    took: Duration,
}

fn tokenize(papers: Vec<Paper>, enc: &Encoding) -> Tokenized {
    let started = Instant::now();
    let eos = enc.tokenizer.eos_id();
    let threads = enc.tokenize_threads.clamp(1, papers.len().max(1));
    let per_thread = papers.len().div_ceil(threads).max(1);
    let chunks = std::thread::scope(|scope| {
        let handles: Vec<_> = papers
            .chunks(per_thread)
            .map(|group| {
                scope.spawn(move || {
                    group
                        .iter()
                        .map(|p| {
                            let text = match &enc.query_instruction {
                                Some(instruction) => format_query(instruction, &p.text),
                                None => p.text.clone(),
                            };
                            let tokens =
                                enc.tokenizer.encode_raw(&text).map_err(|e| e.to_string())?;
                            Ok(chunk::split(&tokens, eos, enc.max_len)
                                .into_iter()
                                .map(Arc::new)
                                .collect())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .expect("a tokenizer thread panicked. This is a bug.")
            })
            .collect()
    });
    Tokenized {
        papers,
        chunks,
        took: started.elapsed(),
    }
}

/// Embeds every part of `parts` on `models` (one thread each) and hands each part, with its
/// outcome, to `on_part` in order. An error from `on_part` stops the run and is returned.
pub fn embed_parts<E>(
    models: &[Box<dyn Embedder>],
    parts: impl Iterator<Item = Vec<Paper>> + Send,
    enc: &Encoding,
    mut on_part: impl FnMut(Vec<Paper>, PartOutcome) -> Result<(), E>,
) -> Result<(), E> {
    let (work_tx, work_rx) = crossbeam_channel::unbounded::<Work>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<Done>();
    let (part_tx, part_rx) = crossbeam_channel::bounded::<Tokenized>(1);
    std::thread::scope(|scope| {
        for model in models {
            let (work_rx, done_tx) = (work_rx.clone(), done_tx.clone());
            scope.spawn(move || device::serve(model.as_ref(), work_rx, done_tx));
        }
        drop(done_tx);
        scope.spawn(move || {
            for papers in parts {
                if part_tx.send(tokenize(papers, enc)).is_err() {
                    return;
                }
            }
        });
        let result = (|| {
            for part in &part_rx {
                let outcome = run_part(&part, enc, &work_tx, &done_rx);
                on_part(part.papers, outcome)?;
            }
            Ok(())
        })();
        drop(part_rx); // stops the tokenizer thread if we stopped early
        drop(work_tx); // lets the device threads finish
        result
    })
}

/// Sends one tokenized part's mini-batches to the devices and assembles the vectors.
fn run_part(
    part: &Tokenized,
    enc: &Encoding,
    work: &crossbeam_channel::Sender<Work>,
    done: &crossbeam_channel::Receiver<Done>,
) -> PartOutcome {
    let mut outcome = PartOutcome {
        tokenize: part.took,
        ..PartOutcome::default()
    };
    // Every chunk of every paper is one item; `owner[i]` is the paper of item i.
    let mut items = Vec::new();
    let mut seqs = Vec::new();
    let mut owner = Vec::new();
    for (p, chunks) in part.chunks.iter().enumerate() {
        if let Ok(chunks) = chunks {
            if chunks.len() > 1 {
                outcome.long_chunked += 1;
            }
            let chars = count_chars(&part.papers[p].text) / chunks.len() as u64;
            for c in chunks {
                items.push(Item {
                    index: items.len(),
                    n_tokens: c.len(),
                    n_chars: chars,
                });
                seqs.push(c.clone());
                owner.push(p);
            }
        }
    }
    let batches = minibatch::minibatches(&items, &enc.rule);
    let (real, padding) = minibatch::padding(&items, &batches);
    outcome.tokens = real;
    outcome.padding_tokens = padding;
    let started = Instant::now();
    for (tag, batch) in batches.iter().enumerate() {
        let seqs = batch.iter().map(|&i| seqs[i].clone()).collect();
        work.send(Work { tag, seqs })
            .expect("device threads outlive the part. This is a bug.");
    }
    let mut vectors: Vec<Option<Result<Vec<f32>, String>>> = vec![None; items.len()];
    for _ in 0..batches.len() {
        let d = done
            .recv()
            .expect("device threads outlive the part. This is a bug.");
        if let Some(why) = &d.panicked {
            // Fail the job at once, with the message, rather than wait for the mini-batches
            // that worker will never finish (a job would hang until its walltime).
            panic!("a device worker panicked, so the job stops: {why}");
        }
        outcome.fallbacks.add(d.stats);
        let members = &batches[d.tag];
        match d.vectors {
            Ok(vs) => members
                .iter()
                .zip(vs)
                .for_each(|(&i, v)| vectors[i] = Some(Ok(v))),
            Err(e) => members
                .iter()
                .for_each(|&i| vectors[i] = Some(Err(e.clone()))),
        }
    }
    outcome.inference = started.elapsed();
    outcome.results = assemble(part, &owner, &seqs, vectors);
    outcome
}

/// One paper's chunk vectors and their token counts as they come back, or the first error.
#[derive(Clone, Default)]
struct PaperChunks(Vec<Vec<f32>>, Vec<usize>, Option<String>);

fn assemble(
    part: &Tokenized,
    owner: &[usize],
    seqs: &[Arc<Vec<u32>>],
    vectors: Vec<Option<Result<Vec<f32>, String>>>,
) -> Vec<Result<Embedded, String>> {
    let mut per_paper: Vec<PaperChunks> = vec![PaperChunks::default(); part.papers.len()];
    for ((&p, seq), v) in owner.iter().zip(seqs).zip(vectors) {
        match v.expect("every item gets a result. This is a bug.") {
            Ok(v) => {
                per_paper[p].0.push(v);
                per_paper[p].1.push(seq.len());
            }
            Err(e) => per_paper[p].2 = Some(e),
        }
    }
    per_paper
        .into_iter()
        .zip(&part.chunks)
        .map(|(PaperChunks(vs, weights, err), chunks)| {
            let chunks = chunks
                .as_ref()
                .map_err(|e| format!("tokenizer failed: {e}"))?;
            if let Some(e) = err {
                return Err(format!("embedding failed: {e}"));
            }
            Ok(Embedded {
                vector: chunk::combine(&vs, &weights),
                n_tokens: weights.iter().sum::<usize>() as u32,
                n_chunks: chunks.len().min(u16::MAX as usize) as u16,
            })
        })
        .collect()
}
