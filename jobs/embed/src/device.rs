//! One worker thread per device, each owning its model copy, all fed from one shared queue of
//! mini-batches so a slow device never leaves the others idle. Out-of-memory is handled here:
//! a mini-batch is halved until it fits, down to one sequence; a sequence that still does not
//! fit is embedded in halves and combined.

use super::chunk;
use crossbeam_channel::{Receiver, Sender};
use embedfleet_models::{Embedder, Framing, ModelError, PackedSequences};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Shortest piece a sequence is cut to after repeated out-of-memory errors.
const MIN_PIECE_TOKENS: usize = 16;

/// A mini-batch of sequences to embed, tagged so results find their way back.
pub struct Work {
    /// The part it belongs to (its sequence number in the stream).
    pub part: u64,
    pub tag: usize,
    pub seqs: Vec<Arc<Vec<u32>>>,
}

pub struct Done {
    pub part: u64,
    pub tag: usize,
    /// The device's model panicked on this mini-batch (the message): the job must stop, not
    /// wait for vectors that will never come.
    pub panicked: Option<String>,
    /// One vector per sequence, or why the mini-batch failed.
    pub vectors: Result<Vec<Vec<f32>>, String>,
    pub stats: FallbackStats,
    pub busy: Duration,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FallbackStats {
    pub split: u64,
    pub sequential: u64,
    pub chunked: u64,
}

impl FallbackStats {
    pub fn add(&mut self, other: FallbackStats) {
        self.split += other.split;
        self.sequential += other.sequential;
        self.chunked += other.chunked;
    }
}

/// Runs one device: takes work until the queue closes. `framing` is the special tokens around
/// every sequence (a sequence too long for the device is cut inside them).
pub fn serve(model: &dyn Embedder, framing: &Framing, work: Receiver<Work>, done: Sender<Done>) {
    for item in work {
        let started = Instant::now();
        let mut stats = FallbackStats::default();
        let seqs: Vec<&[u32]> = item.seqs.iter().map(|s| s.as_slice()).collect();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            embed_with_fallback(model, framing, &seqs, &mut stats).map_err(|e| e.to_string())
        }));
        let (vectors, panicked) = match run {
            Ok(vectors) => (vectors, None),
            Err(payload) => {
                let why = panic_message(payload.as_ref());
                (Err(format!("the device worker panicked: {why}")), Some(why))
            }
        };
        let stop = panicked.is_some();
        let message = Done {
            part: item.part,
            tag: item.tag,
            panicked,
            vectors,
            stats,
            busy: started.elapsed(),
        };
        if done.send(message).is_err() || stop {
            return; // the job gave up, or this worker is broken
        }
    }
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

fn is_oom(err: &ModelError) -> bool {
    matches!(err, ModelError::OutOfMemory { .. })
}

/// Embeds `seqs`, halving on out-of-memory. Results are in input order.
pub fn embed_with_fallback(
    model: &dyn Embedder,
    framing: &Framing,
    seqs: &[&[u32]],
    stats: &mut FallbackStats,
) -> Result<Vec<Vec<f32>>, ModelError> {
    match model.embed(&PackedSequences::from_sequences(seqs)) {
        Err(err) if is_oom(&err) && seqs.len() > 1 => {
            stats.split += 1;
            let (left, right) = seqs.split_at(seqs.len() / 2);
            let mut out = embed_with_fallback(model, framing, left, stats)?;
            out.extend(embed_with_fallback(model, framing, right, stats)?);
            if left.len() == 1 {
                stats.sequential += 1;
            }
            if right.len() == 1 {
                stats.sequential += 1;
            }
            Ok(out)
        }
        Err(err) if is_oom(&err) => {
            stats.chunked += 1;
            embed_in_pieces(model, framing, seqs[0], err, stats).map(|v| vec![v])
        }
        other => other,
    }
}

/// One sequence that does not fit alone: embed its halves (each framed by the model's special
/// tokens, as the sequence was) and combine them by length.
fn embed_in_pieces(
    model: &dyn Embedder,
    framing: &Framing,
    seq: &[u32],
    err: ModelError,
    stats: &mut FallbackStats,
) -> Result<Vec<f32>, ModelError> {
    let inside = framing.prefix.len()..seq.len().saturating_sub(framing.suffix.len());
    let body = seq.get(inside).unwrap_or_default();
    if body.len() < 2 * MIN_PIECE_TOKENS {
        return Err(err);
    }
    let pieces = chunk::split(
        body,
        framing,
        body.len().div_ceil(2) + framing.overhead(),
        &[],
    );
    let mut vectors = Vec::with_capacity(pieces.len());
    for piece in &pieces {
        let mut inner = FallbackStats::default();
        let v = embed_with_fallback(model, framing, &[piece.as_slice()], &mut inner)?;
        stats.split += inner.split;
        vectors.extend(v);
    }
    let weights: Vec<usize> = pieces.iter().map(Vec::len).collect();
    Ok(chunk::combine(&vectors, &weights))
}
