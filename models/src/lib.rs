//! Embedding models in candle, a folder per model family: loading, tokenizer conventions, the
//! forward pass, memory estimates and test assets.
//!
//! The embed job talks to a model through the small [`Embedder`] trait and
//! [`PackedSequences`] (one mini-batch's flat ids plus cumulative sequence lengths, as TEI's
//! `Batch`). Which implementation serves a model directory is decided once, from the
//! `model_type` of its `config.json`, by the [`registry`] (as TEI's candle backend matches on
//! the model type): [`load_embedder`], [`load_tokenizer`], [`verify_model_dir`] and
//! [`write_tiny_model`] go through it. Each family implements [`ModelFamily`]; the one family
//! today is Qwen3 ([`qwen3`]).

mod ab_switch;
pub mod activation;
pub mod attention;
pub mod attention_check;
pub mod attention_plan;
pub mod bert;
pub mod cpu;
pub mod device;
pub mod elementwise;
pub mod embedder;
pub mod encoder;
pub mod error;
pub mod family;
pub mod fp8;
#[cfg(feature = "cuda")]
pub mod fused;
pub mod gemma3;
pub mod layer_kinds;
pub mod memory;
pub mod modernbert;
pub mod nomic_bert;
pub mod packed;
pub mod projection;
pub mod qwen3;
pub mod registry;
pub mod rotary;
pub mod sentence;
pub mod stage_profile;
pub mod text_rule;
pub mod tiny;
pub mod tiny_tokenizers;
pub mod tokenizer;
pub mod verify;
pub mod weights;

pub use attention::AttentionKernel;
pub use attention_check::probe_attention;
pub use candle_core::DType;
pub use device::{
    build_cuda, build_for, build_table, driver_advice, driver_cuda, driver_cuda_version,
    driver_major, min_driver_for, parse_devices, runs_on, supported_gpus, BuildChoice, CudaVersion,
    DeviceSpec, KernelForm, CUDA_BUILD, CUDA_COMPUTE_CAP, CUDA_VERSION, KERNEL_FORM,
};
pub use embedder::{matryoshka, Embedder, MemoryProbe, PeakWatch};
pub use error::{is_out_of_memory, ModelError, ModelResult};
pub use family::{
    LoadOptions, ModelFamily, ModelShape, ModelSummary, OutputDims, DEFAULT_ATTENTION_TILE,
};
pub use memory::MemoryEstimate;
pub use packed::{PackedSequences, SeqSpan};
pub use registry::{
    default_family, describe_vectors, families_help, family_of, known_model_types, load_embedder,
    load_tokenizer, model_layout, output_dims, query_instruction, verify_model_dir,
    write_tiny_model, write_tiny_model_of, write_tiny_model_with,
};
pub use sentence::{Pooling, SentenceLayout};
pub use text_rule::TextRule;
pub use tiny::TinyModelOptions;
pub use tokenizer::{Framing, QueryFormat, Specials, TextFormat, Tokenizer};
