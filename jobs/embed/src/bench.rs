//! `embedfleet bench-gpu`: the forward pass's throughput, memory and fidelity on one node, in
//! the shapes and fields of the PyTorch peer (`benches/torch_baseline.py`), so the two can be
//! put side by side from one script (`benches/gpu-check.sh`).
//!
//! Everything runs through the production code: the model directory loads as the embed job
//! loads it (the fused kernel and its self-test on a GPU), mini-batches are cut by the job's
//! rule with the device's token budget, and several workers share one queue through the job's
//! device workers, out-of-memory fallback included.

use crate::device::{self, Done, FallbackStats, Work};
use crate::minibatch::{self, Item};
use crate::LoadedModels;
use embedfleet_core::settings::MiniBatchRule;
use embedfleet_models::stage_profile::{self, StageTime};
use embedfleet_models::{DeviceSpec, Embedder, Framing, ModelError, ModelShape, PackedSequences};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One measurement, in the PyTorch peer's fields (`event`, `label`, `secs`, `real_tokens`,
/// `padded_tokens`, `real_tok_per_s`, `tflops_useful`, `peak_mem_gb`) and ours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRecord {
    pub event: String,
    pub label: String,
    pub secs: f64,
    pub real_tokens: u64,
    /// What a padded forward would have computed (the peer pads; we pack).
    pub padded_tokens: u64,
    pub real_tok_per_s: f64,
    /// Useful FLOP/s: the peer's count (2 × non-embedding parameters per token, plus causal
    /// attention), whatever was really computed.
    pub tflops_useful: f64,
    /// Device memory in use at the peak, weights included, sampled from the driver every
    /// millisecond (the peer reports PyTorch's allocator peak); `None` on the CPU.
    pub peak_mem_gb: Option<f64>,
    /// The model's own estimate for the largest mini-batch, weights included.
    pub estimate_gb: f64,
    pub mini_batches: u64,
    pub fallbacks: FallbackStats,
    pub attention: String,
    pub devices: String,
    /// Distinct attention plans of the run's mini-batches, (sequences, longest length) each
    /// as planned for the fused kernel (see `embedfleet_models::attention_plan`).
    pub plans: Vec<(usize, usize)>,
    /// Seconds spent building those plans before the timed forwards (0 where the kernel
    /// plans nothing: the blockwise one), apart from `secs`.
    pub plan_build_s: f64,
    /// The timed forwards' stages (`EF_PROFILE_STAGES=1`: each stage between two device
    /// synchronizations, so `secs` is not the bench's), longest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<Vec<StageTime>>,
}

/// The distinct attention plans of mini-batches of these lengths.
pub fn plans_of(batches: &[Vec<usize>]) -> Vec<(usize, usize)> {
    embedfleet_models::attention_plan::planned_shapes(batches.iter().map(Vec::as_slice))
        .into_iter()
        .map(|s| (s.batch, s.max_seq))
        .collect()
}

/// One fidelity case: our vector against the reference's (`event` `fidelity`), or why it
/// could not be computed (`fidelity_error`): one case failing does not end the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FidelityRecord {
    pub event: String,
    pub name: String,
    pub tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cosine: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The attention kernel that computed it (an encoder falls back to the blockwise one when
    /// the fused kernel is refused: the GPU check's families rows say which ran).
    #[serde(default)]
    pub attention: String,
}

/// Reference vectors, as `tests/golden/make_golden.py` and `gpu-check.sh` write them.
#[derive(Debug, Clone, Deserialize)]
pub struct FidelityCases {
    pub cases: Vec<FidelityCase>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FidelityCase {
    pub name: String,
    /// Token ids, EOS included.
    pub ids: Vec<u32>,
    pub embedding: Vec<f32>,
}

/// A loaded model directory to measure.
pub struct Bench {
    pub loaded: LoadedModels,
    pub shape: ModelShape,
    /// Cap mini-batches by the device's free memory (the job's behaviour); off to exercise the
    /// out-of-memory fallback.
    pub memory_plan: bool,
    devices: String,
    seed: u64,
}

impl Bench {
    /// The special tokens around the model's sequences.
    fn framing(&self) -> &Framing {
        self.loaded.tokenizer.framing()
    }

    pub fn load(
        model_dir: &Path,
        devices: &[DeviceSpec],
        memory_plan: bool,
        seed: u64,
        dtype: Option<embedfleet_models::DType>,
        precision: embedfleet_core::Precision,
    ) -> Result<Bench, ModelError> {
        let shape = embedfleet_models::family_of(model_dir)?.shape(model_dir)?;
        let how = crate::ModelLoad {
            dtype,
            precision,
            ..crate::ModelLoad::default()
        };
        let loaded = LoadedModels::load_with(model_dir, devices, &how)?;
        Ok(Bench {
            loaded,
            shape,
            memory_plan,
            devices: devices
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            seed,
        })
    }

    /// The peer's useful FLOPs of sequences of these lengths.
    pub fn flops(&self, lengths: &[usize]) -> f64 {
        let c = &self.shape;
        let non_embedding = c.non_embedding_parameters();
        let attention =
            2.0 * c.num_hidden_layers as f64 * c.num_attention_heads as f64 * c.head_dim as f64;
        lengths
            .iter()
            .map(|&l| 2.0 * non_embedding as f64 * l as f64 + attention * (l * l) as f64)
            .sum()
    }

    /// Random token ids (seeded, not EOS-terminated: throughput does not care) per length.
    fn sequences(&self, lengths: &[usize], salt: u64) -> Vec<Arc<Vec<u32>>> {
        let mut state = self.seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let vocab = self.shape.vocab_size as u64;
        lengths
            .iter()
            .map(|&l| {
                Arc::new(
                    (0..l)
                        .map(|_| {
                            state = state
                                .wrapping_mul(6_364_136_223_846_793_005)
                                .wrapping_add(1_442_695_040_888_963_407);
                            ((state >> 33) % vocab) as u32
                        })
                        .collect(),
                )
            })
            .collect()
    }

    /// `forwards` forwards of `batch` sequences of `tokens` tokens on the first device, after
    /// two warm-up forwards (the peer's `uniform_bB_tT`).
    pub fn uniform(
        &self,
        batch: usize,
        tokens: usize,
        forwards: usize,
    ) -> Result<BenchRecord, ModelError> {
        let model = self.loaded.models[0].as_ref();
        let lengths = vec![tokens; batch];
        let seqs = self.sequences(&lengths, (batch * tokens) as u64);
        let packed =
            PackedSequences::from_sequences(&seqs.iter().map(|s| s.as_slice()).collect::<Vec<_>>());
        let planned = vec![lengths.clone()];
        let plan_build_s = model.prepare_attention(&planned)?;
        for _ in 0..2 {
            model.embed(&packed)?;
        }
        stage_profile::take();
        let sampler = MemorySampler::start(model);
        let started = Instant::now();
        for _ in 0..forwards {
            model.embed(&packed)?;
        }
        let secs = started.elapsed().as_secs_f64();
        let real = (batch * tokens * forwards) as u64;
        Ok(BenchRecord {
            event: "bench".into(),
            label: format!("uniform_b{batch}_t{tokens}"),
            secs,
            real_tokens: real,
            padded_tokens: real,
            real_tok_per_s: real as f64 / secs,
            tflops_useful: self.flops(&lengths) * forwards as f64 / secs / 1e12,
            peak_mem_gb: sampler.stop(),
            estimate_gb: model.estimate_memory(&lengths) as f64 / GIB,
            mini_batches: forwards as u64,
            fallbacks: FallbackStats::default(),
            attention: self.attention(),
            devices: self.devices.clone(),
            plans: plans_of(&planned),
            plan_build_s,
            stages: stage_profile::take(),
        })
    }

    /// Sequences of `lengths` tokens cut into mini-batches by `rule` (capped by the devices'
    /// free memory when planning is on) and embedded on every device through one queue, the
    /// embed job's way, after two warm-up mini-batches. Returns the measurement and the
    /// vectors in input order.
    pub fn mix(
        &self,
        label: &str,
        lengths: &[usize],
        rule: MiniBatchRule,
    ) -> Result<(BenchRecord, Vec<Vec<f32>>), String> {
        let rule = if self.memory_plan {
            self.loaded.device_rule(rule).0
        } else {
            rule
        };
        let seqs = self.sequences(lengths, 0x006d_6978);
        let items: Vec<Item> = lengths
            .iter()
            .enumerate()
            .map(|(index, &n)| Item {
                index,
                n_tokens: n,
                n_chars: n as u64 * 42 / 10,
            })
            .collect();
        let batches = minibatch::minibatches(&items, &rule);
        let (real, padding) = minibatch::padding(&items, &batches);
        let model = self.loaded.models[0].as_ref();
        let estimate = batches
            .iter()
            .map(|b| model.estimate_memory(&b.iter().map(|&i| lengths[i]).collect::<Vec<_>>()))
            .max()
            .unwrap_or(0);
        // Every plan the timed run needs, built first on every device.
        let batch_lengths: Vec<Vec<usize>> = batches
            .iter()
            .map(|b| b.iter().map(|&i| lengths[i]).collect())
            .collect();
        let mut plan_build_s = 0.0;
        for m in &self.loaded.models {
            plan_build_s += m
                .prepare_attention(&batch_lengths)
                .map_err(|e| e.to_string())?;
        }
        for b in batches.iter().take(2) {
            let warm: Vec<&[u32]> = b.iter().map(|&i| seqs[i].as_slice()).collect();
            device::embed_with_fallback(
                model,
                self.framing(),
                &warm,
                &mut FallbackStats::default(),
            )
            .map_err(|e| e.to_string())?;
        }
        stage_profile::take();
        let sampler = MemorySampler::start(model);
        let started = Instant::now();
        let (vectors, fallbacks) =
            run_on_devices(&self.loaded.models, self.framing(), &seqs, &batches)?;
        let secs = started.elapsed().as_secs_f64();
        let record = BenchRecord {
            event: "bench".into(),
            label: label.into(),
            secs,
            real_tokens: real,
            padded_tokens: real + padding,
            real_tok_per_s: real as f64 / secs,
            tflops_useful: self.flops(lengths) / secs / 1e12,
            peak_mem_gb: sampler.stop(),
            estimate_gb: estimate as f64 / GIB,
            mini_batches: batches.len() as u64,
            fallbacks,
            attention: self.attention(),
            devices: self.devices.clone(),
            plans: plans_of(&batch_lengths),
            plan_build_s,
            stages: stage_profile::take(),
        };
        Ok((record, vectors))
    }

    /// Each case alone on the first device, against its reference vector; a case that fails
    /// is a `fidelity_error` record, and the others still run.
    pub fn fidelity(&self, cases: &FidelityCases) -> Vec<FidelityRecord> {
        let model = self.loaded.models[0].as_ref();
        cases
            .cases
            .iter()
            .map(|case| {
                let got = device::embed_with_fallback(
                    model,
                    self.framing(),
                    &[case.ids.as_slice()],
                    &mut FallbackStats::default(),
                );
                let (event, cosine, error) = match got {
                    Ok(got) => ("fidelity", Some(cosine(&got[0], &case.embedding)), None),
                    Err(e) => ("fidelity_error", None, Some(e.to_string())),
                };
                FidelityRecord {
                    event: event.into(),
                    name: case.name.clone(),
                    tokens: case.ids.len(),
                    cosine,
                    error,
                    attention: self.attention(),
                }
            })
            .collect()
    }

    fn attention(&self) -> String {
        self.loaded.models[0].attention_kernel().into()
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Cosine of two vectors, accumulated in f64.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    dot / (na * nb)
}

/// The mini-batches on every device through one queue (the job's device workers); vectors in
/// input order, and the fallbacks taken.
fn run_on_devices(
    models: &[Box<dyn Embedder>],
    framing: &Framing,
    seqs: &[Arc<Vec<u32>>],
    batches: &[Vec<usize>],
) -> Result<(Vec<Vec<f32>>, FallbackStats), String> {
    let (work_tx, work_rx) = crossbeam_channel::unbounded::<Work>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<Done>();
    let mut vectors = vec![Vec::new(); seqs.len()];
    let mut fallbacks = FallbackStats::default();
    std::thread::scope(|scope| {
        for model in models {
            let (work_rx, done_tx) = (work_rx.clone(), done_tx.clone());
            scope.spawn(move || device::serve(model.as_ref(), framing, work_rx, done_tx));
        }
        drop(done_tx);
        for (tag, batch) in batches.iter().enumerate() {
            let seqs = batch.iter().map(|&i| seqs[i].clone()).collect();
            let _ = work_tx.send(Work { part: 0, tag, seqs });
        }
        drop(work_tx);
        for _ in 0..batches.len() {
            let d = done_rx
                .recv()
                .map_err(|_| "the device workers stopped".to_string())?;
            if let Some(why) = d.panicked {
                return Err(format!("a device worker panicked: {why}"));
            }
            fallbacks.add(d.stats);
            for (&i, v) in batches[d.tag].iter().zip(d.vectors?) {
                vectors[i] = v;
            }
        }
        Ok((vectors, fallbacks))
    })
}

/// A timed stretch's peak device memory: the GPU pool's high-water mark where there is one
/// (nothing runs beside the forwards), else free memory polled every millisecond from a
/// second thread (`EF_MEMORY_SAMPLER=1`, or a device without the mark).
enum MemorySampler {
    Watch(embedfleet_models::PeakWatch),
    Poll {
        stop: Arc<AtomicBool>,
        handle: std::thread::JoinHandle<Option<(u64, u64)>>,
    },
    Nothing,
}

impl MemorySampler {
    fn start(model: &dyn Embedder) -> MemorySampler {
        if let Some(watch) = model.watch_peak_memory() {
            return MemorySampler::Watch(watch);
        }
        let Some(probe) = model.memory_probe() else {
            return MemorySampler::Nothing;
        };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut lowest: Option<(u64, u64)> = None;
            while !flag.load(Ordering::Relaxed) {
                if let Some((free, total)) = probe() {
                    lowest = Some(lowest.map_or((free, total), |(f, t)| (f.min(free), t)));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            lowest
        });
        MemorySampler::Poll { stop, handle }
    }

    /// Peak bytes in use (total less the lowest free), in GiB.
    fn stop(self) -> Option<f64> {
        let peak = match self {
            MemorySampler::Watch(watch) => watch()?,
            MemorySampler::Poll { stop, handle } => {
                stop.store(true, Ordering::Relaxed);
                let (free, total) = handle.join().ok()??;
                total.saturating_sub(free)
            }
            MemorySampler::Nothing => return None,
        };
        Some(peak as f64 / GIB)
    }
}

/// The paper-length mix of the PyTorch peer's distribution (lognormal characters around
/// 20,000, σ 0.8, at most 130,000; 4.2 characters a token, 16 to 32,768 tokens), seeded. The
/// peer's own list (Python's generator) can be passed instead, for the very same papers.
pub fn paper_mix(papers: usize, seed: u64) -> Vec<usize> {
    let mut state = seed.wrapping_add(0x2545_f491_4f6c_dd1d);
    let mut uniform = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..papers)
        .map(|_| {
            // Box-Muller.
            let z = (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos();
            let chars = ((20_000f64.ln() + 0.8 * z).exp() as u64).min(130_000);
            (chars * 10 / 42).clamp(16, 32_768) as usize
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_device::FakeDevice;

    #[test]
    fn the_paper_mix_is_seeded_and_within_the_peers_bounds() {
        let a = paper_mix(240, 0);
        assert_eq!(a, paper_mix(240, 0));
        assert_ne!(a, paper_mix(240, 1));
        assert!(a.iter().all(|&t| (16..=32_768).contains(&t)));
        let mean = a.iter().sum::<usize>() / a.len();
        // exp(mu + sigma²/2) = 20,000 × 1.377 chars ≈ 6,500 tokens (the peer's mix: 6,408).
        assert!((4_500..8_500).contains(&mean), "mean {mean}");
    }

    /// The peak comes from the high-water mark where the model has one (no polling thread);
    /// else from the lowest free memory polled; else there is none.
    #[test]
    fn the_peak_is_the_mark_else_the_lowest_polled_free_else_none() {
        let readings = Arc::new(std::sync::Mutex::new(vec![8 << 30, 3 << 30, 6 << 30]));
        let polled = FakeDevice {
            readings: Some(readings.clone()),
            ..FakeDevice::default()
        };
        let sampler = MemorySampler::start(&polled);
        assert!(matches!(sampler, MemorySampler::Poll { .. }));
        while readings.lock().unwrap().len() > 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sampler.stop(), Some(7.0), "10 GiB less the lowest free, 3");
        let marked = FakeDevice {
            mark: Some(5 << 30),
            readings: Some(readings),
            ..FakeDevice::default()
        };
        let sampler = MemorySampler::start(&marked);
        assert!(matches!(sampler, MemorySampler::Watch(_)));
        assert_eq!(sampler.stop(), Some(5.0));
        let cpu = FakeDevice::default();
        assert_eq!(MemorySampler::start(&cpu).stop(), None);
    }

    #[test]
    fn cosine_of_parallel_and_orthogonal_vectors() {
        assert!((cosine(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 3.0]), 0.0);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
