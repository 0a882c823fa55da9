//! Embedding a stream of parts (groups of papers) on several devices.
//!
//! A tokenizer thread works one part ahead of the devices, so tokenisation never stalls them;
//! each part's chunks are cut into mini-batches by the plan's rule and spread over the device
//! workers through one queue, the next part's queued behind the current one's so the devices
//! keep working while a finished part's shard is written; vectors of chunked papers are
//! combined when the part is complete.

use super::chunk;
use super::device::{self, Done, FallbackStats, Work};
use super::minibatch::{self, Item};
use embedfleet_core::paper::{count_chars, Paper};
use embedfleet_core::settings::MiniBatchRule;
use embedfleet_models::{Embedder, Tokenizer};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How papers become token sequences.
pub struct Encoding<'a> {
    pub tokenizer: &'a Tokenizer,
    /// Longest sequence, special tokens included: the model's context or `--max-tokens`.
    pub max_len: usize,
    pub rule: MiniBatchRule,
    /// `Some(instruction)` embeds queries (in the tokenizer's family's query format); documents
    /// get the directory's document prompt, if any.
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
    /// Wall time to the part's last vector back, from its mini-batches being queued or the
    /// previous part being handed over, whichever is later (parts overlap: see
    /// [`PARTS_IN_FLIGHT`]).
    pub inference: Duration,
}

struct Tokenized {
    papers: Vec<Paper>,
    /// Per paper: its chunks (each framed by the model's special tokens), or a tokenizer error.
    chunks: Vec<Result<Vec<Arc<Vec<u32>>>, String>>,
    took: Duration,
}

fn tokenize(papers: Vec<Paper>, enc: &Encoding) -> Tokenized {
    let started = Instant::now();
    let framing = enc.tokenizer.framing();
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
                            let text = enc
                                .tokenizer
                                .input_text(enc.query_instruction.as_deref(), &p.text);
                            let tokens =
                                enc.tokenizer.encode_raw(&text).map_err(|e| e.to_string())?;
                            // A query carries no document prompt into its chunks.
                            let continuation = match enc.query_instruction {
                                Some(_) => &[][..],
                                None => enc.tokenizer.document_prompt_ids(),
                            };
                            Ok(chunk::split(&tokens, framing, enc.max_len, continuation)
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

/// Parts whose mini-batches are queued at once: while the oldest one's shard is written, the
/// devices work on the next one's, so they never wait on the host at a part boundary.
pub const PARTS_IN_FLIGHT: usize = 2;

/// Embeds every part of `parts` on `models` (one thread each) and hands each part, with its
/// outcome, to `on_part` in order. An error from `on_part` stops the run and is returned.
///
/// A tokenizer thread works ahead of the devices; up to [`PARTS_IN_FLIGHT`] parts have their
/// mini-batches queued at once, so `on_part` (writing a shard) overlaps the next part's
/// inference.
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
            let framing = enc.tokenizer.framing();
            scope.spawn(move || device::serve(model.as_ref(), framing, work_rx, done_tx));
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
            let mut in_flight: VecDeque<InFlight> = VecDeque::new();
            let mut next_seq = 0u64;
            let mut tokenized_all = false;
            // When the previous part was handed over: a part's inference is counted from
            // then (or from its queuing, if later), so overlapping parts are not counted twice.
            let mut last_finished = Instant::now();
            loop {
                if in_flight.front().is_some_and(|p| p.remaining == 0) {
                    let part = in_flight
                        .pop_front()
                        .expect("checked above. This is a bug.");
                    let (papers, outcome) = part.finish(last_finished);
                    last_finished = Instant::now();
                    on_part(papers, outcome)?;
                    continue;
                }
                let room = !tokenized_all && in_flight.len() < PARTS_IN_FLIGHT;
                if in_flight.is_empty() && !room {
                    return Ok(());
                }
                let event = if room && in_flight.is_empty() {
                    Event::Part(part_rx.recv().ok())
                } else if room {
                    crossbeam_channel::select! {
                        recv(part_rx) -> part => Event::Part(part.ok()),
                        recv(done_rx) -> done => Event::Done(done),
                    }
                } else {
                    Event::Done(done_rx.recv())
                };
                match event {
                    Event::Part(None) => tokenized_all = true,
                    Event::Part(Some(part)) => {
                        in_flight.push_back(InFlight::queue(part, next_seq, enc, &work_tx));
                        next_seq += 1;
                    }
                    Event::Done(done) => {
                        let d = done.expect("device threads outlive the parts. This is a bug.");
                        if let Some(why) = &d.panicked {
                            // Fail the job at once, with the message, rather than wait for the
                            // mini-batches that worker will never finish (a job would hang
                            // until its walltime).
                            panic!("a device worker panicked, so the job stops: {why}");
                        }
                        let first = in_flight.front().map_or(0, |p| p.seq);
                        in_flight[(d.part - first) as usize].record(d);
                    }
                }
            }
        })();
        drop(part_rx); // stops the tokenizer thread if we stopped early
        drop(work_tx); // lets the device threads finish
        drop(done_rx); // and stops them at their next mini-batch if we stopped early
        result
    })
}

enum Event {
    /// The next tokenized part, or `None` when there are no more.
    Part(Option<Tokenized>),
    Done(Result<Done, crossbeam_channel::RecvError>),
}

/// A part whose mini-batches are queued, collecting their vectors as they come back.
struct InFlight {
    seq: u64,
    part: Tokenized,
    outcome: PartOutcome,
    /// Every chunk of every paper is one item; `owner[i]` is the paper of item i.
    owner: Vec<usize>,
    seqs: Vec<Arc<Vec<u32>>>,
    batches: Vec<Vec<usize>>,
    vectors: Vec<Option<Result<Vec<f32>, String>>>,
    remaining: usize,
    queued: Instant,
    last_back: Instant,
}

impl InFlight {
    /// Cuts a tokenized part's chunks into mini-batches and queues them for the devices.
    fn queue(
        part: Tokenized,
        seq: u64,
        enc: &Encoding,
        work: &crossbeam_channel::Sender<Work>,
    ) -> InFlight {
        let mut outcome = PartOutcome {
            tokenize: part.took,
            ..PartOutcome::default()
        };
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
        let queued = Instant::now();
        for (tag, batch) in batches.iter().enumerate() {
            let seqs = batch.iter().map(|&i| seqs[i].clone()).collect();
            work.send(Work {
                part: seq,
                tag,
                seqs,
            })
            .expect("device threads outlive the parts. This is a bug.");
        }
        InFlight {
            seq,
            part,
            outcome,
            vectors: vec![None; items.len()],
            remaining: batches.len(),
            owner,
            seqs,
            batches,
            queued,
            last_back: queued,
        }
    }

    fn record(&mut self, d: Done) {
        self.outcome.fallbacks.add(d.stats);
        let members = &self.batches[d.tag];
        match d.vectors {
            Ok(vs) => members
                .iter()
                .zip(vs)
                .for_each(|(&i, v)| self.vectors[i] = Some(Ok(v))),
            Err(e) => members
                .iter()
                .for_each(|&i| self.vectors[i] = Some(Err(e.clone()))),
        }
        self.remaining -= 1;
        self.last_back = Instant::now();
    }

    /// The part's papers and outcome, its inference counted from `previous_finished` or its
    /// queuing, whichever is later, to its last vector.
    fn finish(self, previous_finished: Instant) -> (Vec<Paper>, PartOutcome) {
        let mut outcome = self.outcome;
        let from = self.queued.max(previous_finished);
        outcome.inference = self.last_back.saturating_duration_since(from);
        outcome.results = assemble(&self.part, &self.owner, &self.seqs, self.vectors);
        (self.part.papers, outcome)
    }
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
