//! `embedfleet embed`: records of any corpus format (or plain text lines) straight to one
//! parquet file with the shard schema — the quickest way to try a model.

use crate::embed::pipeline::{self, Encoding};
use crate::embed::{load_models, LoadedModels};
use embedfleet_core::corpus::{self, ReadOptions, Record};
use embedfleet_core::paper::count_chars;
use embedfleet_core::settings::MiniBatchRule;
use embedfleet_core::shardfile::{ShardRow, ShardWriter, VectorDtype};
use embedfleet_core::Paper;
use embedfleet_models::DeviceSpec;
use std::io::BufRead;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct EmbedFilesOptions {
    pub model_dir: PathBuf,
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    pub devices: Vec<DeviceSpec>,
    pub output_dim: Option<usize>,
    pub vector_dtype: VectorDtype,
    /// Each input line is one text (id = `{file name}:{line}`), instead of corpus records.
    pub lines: bool,
    /// `Some(instruction)`: embed as queries with this instruction.
    pub query_instruction: Option<String>,
    pub max_tokens: Option<usize>,
    pub batch_tokens: u64,
}

/// The default query instruction of Qwen3-Embedding's model card.
pub const DEFAULT_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";

#[derive(Debug, Default, Clone)]
pub struct EmbedFilesReport {
    pub embedded: u64,
    /// Records that could not be read or embedded, with why.
    pub skipped: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedFilesError {
    #[error(transparent)]
    Corpus(#[from] corpus::CorpusError),
    #[error("failed to read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to load the model: {0}")]
    Model(#[from] embedfleet_models::ModelError),
    #[error(transparent)]
    Shard(#[from] embedfleet_core::shardfile::ShardFileError),
}

pub fn run(options: &EmbedFilesOptions) -> Result<EmbedFilesReport, EmbedFilesError> {
    let mut report = EmbedFilesReport::default();
    let papers = read_inputs(options, &mut report.skipped)?;
    let LoadedModels {
        models,
        tokenizer,
        meta,
        ..
    } = load_models(
        &options.model_dir,
        &options.devices,
        options.output_dim,
        None,
    )?;
    let encoding = Encoding {
        tokenizer: &tokenizer,
        max_len: options
            .max_tokens
            .unwrap_or(usize::MAX)
            .min(models[0].max_position_embeddings()),
        rule: MiniBatchRule::TokenBudget {
            max_tokens: options.batch_tokens,
        },
        query_instruction: options.query_instruction.clone(),
        tokenize_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    if let Some(parent) = options
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|source| EmbedFilesError::Io {
            path: parent.into(),
            source,
        })?;
    }
    let mut writer = ShardWriter::create(&options.output, options.vector_dtype, &meta)?;
    let parts = papers
        .chunks(1024)
        .map(<[Paper]>::to_vec)
        .collect::<Vec<_>>();
    pipeline::embed_parts(&models, parts.into_iter(), &encoding, |papers, outcome| {
        for (paper, result) in papers.iter().zip(outcome.results) {
            match result {
                Ok(e) => {
                    let row = ShardRow {
                        paper,
                        vector: &e.vector,
                        n_chars: count_chars(&paper.text) as u32,
                        n_tokens: e.n_tokens,
                        n_chunks: e.n_chunks,
                    };
                    writer.push(&row)?;
                    report.embedded += 1;
                }
                Err(why) => report.skipped.push(format!("{}: {why}", paper.id)),
            }
        }
        Ok::<(), EmbedFilesError>(())
    })?;
    writer.finish()?;
    Ok(report)
}

fn read_inputs(
    options: &EmbedFilesOptions,
    skipped: &mut Vec<String>,
) -> Result<Vec<Paper>, EmbedFilesError> {
    let mut papers = Vec::new();
    for input in &options.inputs {
        if options.lines {
            read_lines(input, &mut papers)?;
            continue;
        }
        for file in corpus::discover(std::slice::from_ref(input))? {
            let summary = corpus::read_file::<()>(&file, &ReadOptions::default(), |record| {
                match record {
                    Record::Paper { paper, .. } => papers.push(paper),
                    Record::Quarantined(q) => {
                        skipped.push(format!("{}:{}: {}", q.file, q.line, q.detail))
                    }
                }
                Ok(())
            });
            summary.map_err(|e| match e {
                corpus::ReadError::Corpus(e) => EmbedFilesError::Corpus(e),
                corpus::ReadError::Visit(()) => unreachable!("the visitor never fails"),
            })?;
        }
    }
    Ok(papers)
}

fn read_lines(path: &Path, papers: &mut Vec<Paper>) -> Result<(), EmbedFilesError> {
    let io = |source| EmbedFilesError::Io {
        path: path.into(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if !line.trim().is_empty() {
            papers.push(Paper {
                id: format!("{name}:{}", i + 1),
                text: line,
                ..Paper::default()
            });
        }
    }
    Ok(())
}
