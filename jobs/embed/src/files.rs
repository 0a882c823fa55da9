//! `embedfleet embed`: records of any corpus format (or plain text lines) straight to one
//! parquet file with the shard schema — the quickest way to try a model.

use crate::{write_rows, LoadedModels};
use embedfleet_core::corpus::{self, ReadOptions, Record};
use embedfleet_core::settings::MiniBatchRule;
use embedfleet_core::shardfile::{ShardWriter, VectorDtype};
use embedfleet_core::{Paper, Precision};
use embedfleet_models::{DeviceSpec, TextRule};
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
    /// `--precision`: the device's own, or FP8 projections.
    pub precision: Precision,
    /// Each input line is one text (id = `{file name}:{line}`), instead of corpus records.
    pub lines: bool,
    /// `Some(instruction)`: embed as queries with this instruction.
    pub query_instruction: Option<String>,
    pub max_tokens: Option<usize>,
    pub batch_tokens: u64,
    /// How texts are prepared before they are tokenised (`--text-rule`).
    pub text_rule: TextRule,
}

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
    #[error("failed to read {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("failed to load the model: {0}")]
    Model(embedfleet_models::ModelError),
    #[error(transparent)]
    Shard(#[from] embedfleet_core::shardfile::ShardFileError),
}

/// Said in the message, so not returned as the source (`embedfleet_core::cause`): no
/// `#[from]`, which would return it.
impl From<embedfleet_models::ModelError> for EmbedFilesError {
    fn from(e: embedfleet_models::ModelError) -> Self {
        Self::Model(e)
    }
}

pub fn run(options: &EmbedFilesOptions) -> Result<EmbedFilesReport, EmbedFilesError> {
    let mut report = EmbedFilesReport::default();
    let papers = read_inputs(options, &mut report.skipped)?;
    let how = crate::ModelLoad {
        output_dim: options.output_dim,
        precision: options.precision,
        text_rule: Some(options.text_rule),
        ..crate::ModelLoad::default()
    };
    let loaded = LoadedModels::load_with(&options.model_dir, &options.devices, &how)?;
    let rule = MiniBatchRule::TokenBudget {
        max_tokens: options.batch_tokens,
    };
    let encoding = loaded.encoding(options.max_tokens, rule, options.query_instruction.clone());
    if let Some(parent) = options
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|source| EmbedFilesError::Io {
            path: parent.into(),
            cause: source,
        })?;
    }
    let mut writer = ShardWriter::create(&options.output, options.vector_dtype, &loaded.meta)?;
    let parts = papers
        .chunks(1024)
        .map(<[Paper]>::to_vec)
        .collect::<Vec<_>>();
    loaded.embed_parts(parts.into_iter(), &encoding, |papers, outcome| {
        let failed = write_rows(&mut writer, &papers, &outcome.results)?;
        report.embedded += (papers.len() - failed.len()) as u64;
        let skipped = failed.into_iter().map(|(id, why)| format!("{id}: {why}"));
        report.skipped.extend(skipped);
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
        cause: source,
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
