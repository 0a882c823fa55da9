//! CPU throughput of any model directory's forward pass, in tokens per second: the other side
//! of `benches/families_cpu.py` (transformers on the same shapes, `benches/families-cpu.sh`).
//!
//! ```text
//! cargo run --release -p embedfleet-models --example family_bench -- DIR LEN BATCH [FORWARDS]
//! ```
//! `BATCH` sequences of `LEN` tokens (the model's framing around random ordinary ids), packed
//! into one forward; one warm-up forward, then the median of `FORWARDS` (default 3).

use std::path::Path;
use std::time::Instant;

use embedfleet_models::{load_embedder, load_tokenizer, LoadOptions, PackedSequences};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, len, batch, rest @ ..] = args.as_slice() else {
        eprintln!("usage: family_bench DIR LEN BATCH [FORWARDS]");
        std::process::exit(2);
    };
    let dir = Path::new(dir);
    let (len, batch): (usize, usize) = (len.parse().unwrap(), batch.parse().unwrap());
    let forwards: usize = rest.first().map_or(3, |f| f.parse().unwrap());
    // As the embed job does on a CPU (`LoadedModels::load`).
    embedfleet_models::cpu::allocator::keep_freed_memory();
    let model = load_embedder(dir, &LoadOptions::default()).expect("the model loads");
    let framing = load_tokenizer(dir, Some(Default::default()))
        .expect("its tokenizer loads")
        .framing()
        .clone();
    let family = embedfleet_models::family_of(dir).unwrap().model_type();
    let vocab = embedfleet_models::family_of(dir)
        .unwrap()
        .shape(dir)
        .unwrap()
        .vocab_size as u32;
    // Ordinary ids past the special tokens, spread over the vocabulary.
    let body: Vec<u32> = (0..len - framing.overhead())
        .map(|i| 300 + (i as u32 * 7919) % (vocab - 300))
        .collect();
    let seqs: Vec<Vec<u32>> = (0..batch).map(|_| framing.wrap(&body)).collect();
    let packed = PackedSequences::from_sequences(&seqs);
    model.embed(&packed).expect("warm-up forward");
    let mut secs: Vec<f64> = (0..forwards)
        .map(|_| {
            let started = Instant::now();
            model.embed(&packed).expect("forward");
            started.elapsed().as_secs_f64()
        })
        .collect();
    secs.sort_by(f64::total_cmp);
    let median = secs[secs.len() / 2];
    println!(
        "| ours | {family} | {len} | {batch} | {:.0} |",
        (len * batch) as f64 / median
    );
}
