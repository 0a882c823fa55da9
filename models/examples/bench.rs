//! CPU throughput of the embedding forward pass, in tokens per second.
//!
//! ```text
//! cargo run --release -p embedfleet-models --example bench -- [tiny|0.6b|all|simd] [LENS] [TOKENS]
//! ```
//! `simd` prints the instruction set and the matrix product the CPU kernels use.
//! `LENS` is a comma list of tokens per sequence (default `512,4096`); each measurement embeds
//! sequences of that length packed into batches of about `TOKENS` tokens (default 4,096),
//! after one warm-up batch. Weights are random (the tiny model's generator for `tiny`,
//! candle's normal sampler for the 0.6B shape), made in memory: no file is needed. Throughput
//! does not depend on the vocabulary, so the 0.6B shape uses a 4,096-row embedding table.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use embedfleet_models::qwen3::{random_weights, tiny_config, Config, Qwen3Embedder, Qwen3Model};
use embedfleet_models::weights::Weights;
use embedfleet_models::{Embedder, LoadOptions, PackedSequences};

fn model(name: &str) -> Qwen3Embedder {
    let (cfg, tensors) = match name {
        "tiny" => {
            // Positions are computed per batch, so a longer context needs no other weights.
            let cfg = Config {
                max_position_embeddings: 32_768,
                ..tiny_config()
            };
            let t: HashMap<String, Tensor> = random_weights(&cfg, 0)
                .expect("tiny weights")
                .into_iter()
                .collect();
            (cfg, t)
        }
        _ => {
            let cfg = Config {
                vocab_size: 4096,
                ..Config::qwen3_0_6b()
            };
            (cfg.clone(), randn_weights(&cfg))
        }
    };
    let weights = Weights::from_tensors(tensors, name, DType::F32, &Device::Cpu);
    let model = Qwen3Model::new(&cfg, &weights).expect("build model");
    Qwen3Embedder::from_model(model, Path::new(name), &LoadOptions::default()).expect("wrap model")
}

/// Random weights with the tiny model's names and shapes, scaled by 1/sqrt(fan_in).
fn randn_weights(cfg: &Config) -> HashMap<String, Tensor> {
    let small = Config {
        hidden_size: 4,
        intermediate_size: 4,
        head_dim: Some(2),
        vocab_size: 4,
        ..cfg.clone()
    };
    let names: Vec<String> = random_weights(
        &Config {
            num_hidden_layers: cfg.num_hidden_layers,
            ..small
        },
        0,
    )
    .expect("names")
    .into_keys()
    .collect();
    let (h, hd, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
    let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
    names
        .into_iter()
        .map(|name| {
            let shape: Vec<usize> = match name.rsplit('.').nth(1).unwrap_or("") {
                "embed_tokens" => vec![cfg.vocab_size, h],
                "q_proj" => vec![q, h],
                "k_proj" | "v_proj" => vec![kv, h],
                "o_proj" => vec![h, q],
                "gate_proj" | "up_proj" => vec![i, h],
                "down_proj" => vec![h, i],
                "q_norm" | "k_norm" => vec![hd],
                _ => vec![h],
            };
            let std = if shape.len() == 2 {
                1.0 / (shape[1] as f64).sqrt()
            } else {
                0.1
            };
            let mean = if shape.len() == 1 { 1.0 } else { 0.0 };
            let t = Tensor::randn(mean as f32, std as f32, shape, &Device::Cpu).expect("randn");
            (name, t)
        })
        .collect()
}

fn measure(m: &Qwen3Embedder, len: usize, tokens: usize) -> (f64, usize) {
    let per_batch = (tokens / len).max(1);
    let vocab = m.config().vocab_size as u32;
    let seq: Vec<u32> = (0..len as u32).map(|i| (i * 7919) % vocab).collect();
    let batch = PackedSequences::from_sequences(&vec![seq; per_batch]);
    m.embed(&batch).expect("warm-up");
    let start = Instant::now();
    let mut done = 0;
    // At least one batch and two seconds, so short runs are not dominated by noise.
    while done < 1 || start.elapsed().as_secs_f64() < 2.0 {
        m.embed(&batch).expect("embed");
        done += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    ((done * per_batch * len) as f64 / secs, per_batch)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("all");
    if which == "simd" {
        // What the CPU kernels run with, for benches/cpu-peer.sh's header.
        let simd = embedfleet_models::cpu::Simd::detect().name();
        println!(
            "{simd}, products by {}",
            embedfleet_models::cpu::blas::backend()
        );
        return;
    }
    let lens: Vec<usize> = args
        .get(1)
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![512, 4096]);
    let tokens: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let names: Vec<&str> = match which {
        "all" => vec!["tiny", "0.6b"],
        other => vec![other],
    };
    println!("| model | tokens/seq | seqs/batch | tokens/s |");
    println!("|---|---|---|---|");
    for name in names {
        let m = model(name);
        for &len in &lens {
            let (tps, per_batch) = measure(&m, len, tokens);
            println!("| {name} | {len} | {per_batch} | {tps:.0} |");
        }
    }
}
