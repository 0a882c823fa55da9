//! The embedding pipeline on the tiny model: chunk combination, multi-device equality,
//! out-of-memory fallback.

use embedfleet_core::settings::MiniBatchRule;
use embedfleet_core::Paper;
use embedfleet_embed::chunk;
use embedfleet_embed::device::{embed_with_fallback, FallbackStats};
use embedfleet_embed::pipeline::{embed_parts, Embedded, Encoding};
use embedfleet_embed::LoadedModels;
use embedfleet_models::{DeviceSpec, PackedSequences};

fn papers() -> Vec<Paper> {
    let texts = [
        "A short abstract.".to_string(),
        "Protein folding and kinetic models of enzyme binding. ".repeat(40),
        "Δt ≈ 5 µm — Schrödinger's naïve model.".to_string(),
        "Graph neural networks for crystal structures. ".repeat(9),
    ];
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| Paper {
            id: i.to_string(),
            text: t.clone(),
            ..Paper::default()
        })
        .collect()
}

fn run(devices: usize, max_len: usize, rule: MiniBatchRule, limit: Option<u64>) -> Vec<Embedded> {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::write_tiny_model(dir.path(), 0).unwrap();
    let loaded =
        LoadedModels::load(dir.path(), &vec![DeviceSpec::Cpu; devices], None, limit).unwrap();
    let enc = Encoding {
        tokenizer: &loaded.tokenizer,
        max_len,
        rule,
        query_instruction: None,
        tokenize_threads: 2,
    };
    let mut out = Vec::new();
    let parts = vec![papers()[..2].to_vec(), papers()[2..].to_vec()];
    embed_parts(&loaded.models, parts.into_iter(), &enc, |_, outcome| {
        out.extend(outcome.results.into_iter().map(Result::unwrap));
        Ok::<(), ()>(())
    })
    .unwrap();
    out
}

fn assert_close(a: &[Embedded], b: &[Embedded]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        let cos: f32 = x.vector.iter().zip(&y.vector).map(|(p, q)| p * q).sum();
        assert!(cos >= 0.99999, "cosine {cos}");
        assert_eq!((x.n_tokens, x.n_chunks), (y.n_tokens, y.n_chunks));
    }
}

#[test]
fn long_papers_are_the_length_weighted_mean_of_their_chunks() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::write_tiny_model(dir.path(), 0).unwrap();
    let loaded = LoadedModels::load(dir.path(), &[DeviceSpec::Cpu], None, None).unwrap();
    let paper = &papers()[1];
    let tokens = loaded.tokenizer.encode_raw(&paper.text).unwrap();
    let chunks = chunk::split(&tokens, loaded.tokenizer.framing(), 48, &[]);
    assert!(chunks.len() > 2);
    let vectors: Vec<Vec<f32>> = chunks
        .iter()
        .map(|c| {
            loaded.models[0]
                .embed(&PackedSequences::from_sequences(&[c]))
                .unwrap()
                .remove(0)
        })
        .collect();
    let weights: Vec<usize> = chunks.iter().map(Vec::len).collect();
    let expected = chunk::combine(&vectors, &weights);
    let got = run(1, 48, MiniBatchRule::default(), None);
    assert_eq!(got[1].n_chunks as usize, chunks.len());
    assert_eq!(got[1].n_tokens as usize, weights.iter().sum::<usize>());
    let cos: f32 = got[1]
        .vector
        .iter()
        .zip(&expected)
        .map(|(a, b)| a * b)
        .sum();
    assert!(cos >= 0.99999, "cosine {cos}");
}

#[test]
fn devices_and_batching_rules_do_not_change_the_vectors() {
    let one = run(1, 4096, MiniBatchRule::default(), None);
    assert_close(
        &one,
        &run(3, 4096, MiniBatchRule::TokenBudget { max_tokens: 64 }, None),
    );
    assert_close(&one, &run(2, 4096, MiniBatchRule::STUDY, None));
}

#[test]
fn out_of_memory_halves_then_goes_sequential_then_chunks() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::write_tiny_model(dir.path(), 0).unwrap();
    let loaded = LoadedModels::load(dir.path(), &[DeviceSpec::Cpu], None, None).unwrap();
    let model = &loaded.models[0];
    let seqs: Vec<Vec<u32>> = papers()
        .iter()
        .map(|p| loaded.tokenizer.encode_document(&p.text).unwrap())
        .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let free = embed_with_fallback(
        model.as_ref(),
        loaded.tokenizer.framing(),
        &refs,
        &mut FallbackStats::default(),
    )
    .unwrap();
    // Cap below the longest paper alone: the batch splits down to single papers, and the
    // longest is embedded in pieces.
    let longest = seqs.iter().map(Vec::len).max().unwrap();
    let cap = model.estimate_memory(&[longest]) - 1;
    model.set_memory_limit(Some(cap));
    let mut stats = FallbackStats::default();
    let capped = embed_with_fallback(
        model.as_ref(),
        loaded.tokenizer.framing(),
        &refs,
        &mut stats,
    )
    .unwrap();
    assert!(
        stats.split >= 2 && stats.sequential >= 1 && stats.chunked == 1,
        "{stats:?}"
    );
    for (i, (a, b)) in free.iter().zip(&capped).enumerate() {
        let cos: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        if seqs[i].len() == longest {
            assert!(cos > 0.5, "a chunked paper stays close to its whole: {cos}");
        } else {
            assert!(cos >= 0.99999, "paper {i}: cosine {cos}");
        }
    }
}

#[test]
fn queries_embed_through_the_pipeline_as_one_forward_of_the_query_would() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::write_tiny_model(dir.path(), 0).unwrap();
    let loaded = LoadedModels::load(dir.path(), &[DeviceSpec::Cpu; 2], None, None).unwrap();
    let texts = vec!["protein folding".to_string(), "graph networks".to_string()];
    let instruction = embedfleet_models::family_of(dir.path())
        .unwrap()
        .default_instruction();
    let got = loaded.embed_queries(instruction, &texts, 64).unwrap();
    assert_eq!(got.len(), 2);
    for (text, vector) in texts.iter().zip(&got) {
        let ids = loaded.tokenizer.encode_query(instruction, text).unwrap();
        let expected = loaded.models[0]
            .embed(&PackedSequences::from_sequences(&[ids]))
            .unwrap()
            .remove(0);
        let cos: f32 = vector.iter().zip(&expected).map(|(a, b)| a * b).sum();
        assert!(cos >= 0.99999, "{text}: cosine {cos}");
    }
    let single = embedfleet_embed::embed_query(dir.path(), None, instruction, &texts[1]);
    let cos: f32 = single
        .unwrap()
        .iter()
        .zip(&got[1])
        .map(|(a, b)| a * b)
        .sum();
    assert!(cos >= 0.99999, "embed_query agrees: cosine {cos}");
}

/// A device whose model panics on every forward.
struct PanickingModel;

impl embedfleet_models::Embedder for PanickingModel {
    fn embed(&self, _: &PackedSequences) -> embedfleet_models::ModelResult<Vec<Vec<f32>>> {
        panic!("simulated kernel failure")
    }
    fn max_position_embeddings(&self) -> usize {
        2048
    }
    fn hidden_size(&self) -> usize {
        128
    }
    fn output_dim(&self) -> usize {
        128
    }
    fn estimate_memory(&self, _: &[usize]) -> u64 {
        0
    }
    fn set_memory_limit(&self, _: Option<u64>) {}
}

#[test]
fn a_panicking_device_fails_the_run_at_once_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::write_tiny_model(dir.path(), 0).unwrap();
    let loaded = LoadedModels::load(dir.path(), &[DeviceSpec::Cpu], None, None).unwrap();
    let LoadedModels {
        models: working,
        tokenizer,
        ..
    } = loaded;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // One broken device beside a working one: the working one keeps the queue open, so
        // without the fix the run waits forever for the broken one's mini-batch.
        let mut models: Vec<Box<dyn embedfleet_models::Embedder>> = vec![Box::new(PanickingModel)];
        models.extend(working);
        let enc = Encoding {
            tokenizer: &tokenizer,
            max_len: 2048,
            rule: MiniBatchRule::TokenBudget { max_tokens: 64 },
            query_instruction: None,
            tokenize_threads: 1,
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            embed_parts(&models, std::iter::once(papers()), &enc, |_, _| {
                Ok::<(), ()>(())
            })
        }));
        let message = result
            .err()
            .map(|p| p.downcast_ref::<String>().cloned().unwrap_or_default());
        let _ = tx.send(message);
    });
    let message = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the run ended instead of hanging");
    let message = message.expect("the run failed");
    assert!(
        message.contains("device worker panicked") && message.contains("simulated kernel failure"),
        "{message}"
    );
}

/// When each mini-batch started.
type Starts = std::sync::Arc<std::sync::Mutex<Vec<std::time::Instant>>>;

/// A device that takes 20 ms per mini-batch and records when each one started.
struct SlowModel {
    starts: Starts,
}

impl embedfleet_models::Embedder for SlowModel {
    fn embed(&self, batch: &PackedSequences) -> embedfleet_models::ModelResult<Vec<Vec<f32>>> {
        self.starts.lock().unwrap().push(std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(20));
        Ok(vec![vec![1.0, 0.0]; batch.len()])
    }
    fn max_position_embeddings(&self) -> usize {
        2048
    }
    fn hidden_size(&self) -> usize {
        2
    }
    fn output_dim(&self) -> usize {
        2
    }
    fn estimate_memory(&self, _: &[usize]) -> u64 {
        0
    }
    fn set_memory_limit(&self, _: Option<u64>) {}
}

#[test]
fn the_device_works_on_the_next_part_while_a_finished_part_is_written() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::write_tiny_model(dir.path(), 0).unwrap();
    let tokenizer =
        embedfleet_models::load_tokenizer(dir.path(), Some(Default::default())).unwrap();
    let starts = Starts::default();
    let models: Vec<Box<dyn embedfleet_models::Embedder>> = vec![Box::new(SlowModel {
        starts: starts.clone(),
    })];
    let enc = Encoding {
        tokenizer: &tokenizer,
        max_len: 2048,
        // One paper a mini-batch: each part is several forwards.
        rule: MiniBatchRule::Chars {
            max_chars: 1,
            max_papers: 1,
        },
        query_instruction: None,
        tokenize_threads: 1,
    };
    let parts = vec![papers(), papers(), papers()];
    let mut writes = Vec::new();
    let mut handed = Vec::new();
    embed_parts(&models, parts.into_iter(), &enc, |papers, outcome| {
        handed.push((papers.len(), outcome.results.len()));
        let start = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(200)); // writing the shard
        writes.push((start, std::time::Instant::now()));
        Ok::<(), ()>(())
    })
    .unwrap();
    assert_eq!(handed, vec![(4, 4); 3], "every part, in order, whole");
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 12);
    // While part 0 and part 1 were being written, the device was already working on the
    // next part's mini-batches.
    for (i, (from, to)) in writes.iter().take(2).enumerate() {
        let busy = starts.iter().filter(|s| *s > from && *s < to).count();
        assert!(busy > 0, "no forward ran while part {i} was written");
    }
}

/// A sequence cut into pieces after an out-of-memory error keeps its framing: each piece of a
/// BERT's `[CLS] … [SEP]` is itself `[CLS] … [SEP]`, and the vector is the pieces' combined.
#[test]
fn out_of_memory_pieces_are_framed_as_the_sequence_was() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::registry::family("bert")
        .unwrap()
        .write_tiny_model(dir.path(), &Default::default())
        .unwrap();
    let loaded = LoadedModels::load(dir.path(), &[DeviceSpec::Cpu], None, None).unwrap();
    let (model, framing) = (&loaded.models[0], loaded.tokenizer.framing());
    assert_eq!(
        (framing.prefix.clone(), framing.suffix.clone()),
        (vec![2], vec![3])
    );
    let body: Vec<u32> = (0..100).map(|i| 5 + i % 60).collect();
    let seq = framing.wrap(&body);
    model.set_memory_limit(Some(model.estimate_memory(&[seq.len()]) - 1));
    let mut stats = FallbackStats::default();
    let got = embed_with_fallback(model.as_ref(), framing, &[seq.as_slice()], &mut stats)
        .unwrap()
        .remove(0);
    assert_eq!(stats.chunked, 1, "{stats:?}");
    model.set_memory_limit(None);
    let pieces = [framing.wrap(&body[..50]), framing.wrap(&body[50..])];
    let vectors: Vec<Vec<f32>> = pieces
        .iter()
        .map(|p| {
            model
                .embed(&PackedSequences::from_sequences(&[p]))
                .unwrap()
                .remove(0)
        })
        .collect();
    let want = chunk::combine(&vectors, &[pieces[0].len(), pieces[1].len()]);
    let cos: f32 = want.iter().zip(&got).map(|(a, b)| a * b).sum();
    assert!(cos > 0.99999, "cosine {cos}");
}

#[test]
fn fp8_is_refused_on_the_cpu_before_the_model_loads_and_its_shards_say_fp8() {
    let dir = tempfile::tempdir().unwrap();
    embedfleet_models::write_tiny_model(dir.path(), 0).unwrap();
    let how = embedfleet_embed::ModelLoad {
        precision: embedfleet_core::Precision::Fp8,
        ..Default::default()
    };
    let err = LoadedModels::load_with(dir.path(), &[DeviceSpec::Cpu], &how)
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(err, embedfleet_models::ModelError::PrecisionRefused { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("Leave --precision out"), "{err}");
    // An embed job that meets it exits as a refusal (4): the run's devices are every job's,
    // so the submit loop pauses at the first such job. A GPU without FP8 tensor cores is
    // that node's refusal (5): its queue is set aside, the batch tried on the others.
    let job_error = embedfleet_embed::job::EmbedJobError::Model;
    assert!(job_error(err).is_refusal());
    let a100 = job_error(embedfleet_models::ModelError::DeviceRefused {
        reason: "compute capability 8.0".into(),
    });
    assert!(a100.is_device_refusal() && !a100.is_refusal());
    // What a shard says of vectors whose projections ran in FP8 (the library's emulation on
    // the CPU stands in for the GPU here), and of native ones.
    let options = |fp8_projections| embedfleet_models::LoadOptions {
        fp8_projections,
        ..Default::default()
    };
    let fp8 = embedfleet_models::load_embedder(dir.path(), &options(true)).unwrap();
    let native = embedfleet_models::load_embedder(dir.path(), &options(false)).unwrap();
    assert_eq!(embedfleet_embed::compute_label(fp8.as_ref()), "f32+fp8");
    assert_eq!(embedfleet_embed::compute_label(native.as_ref()), "f32");
}
