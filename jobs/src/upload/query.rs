//! One query against an uploaded collection: the text embedded as a query (with the task
//! instruction, as `embedfleet embed --query` does), the nearest papers, and their first words
//! read back from the run's batch files (the shards and the payload hold no text).

use std::collections::HashMap;
use std::path::Path;

use embedfleet_core::rundb::{RunDb, RunDbError};
use embedfleet_models::{Embedder, LoadOptions, ModelError, Qwen3Embedder, TokenBatch};

use super::{Hit, Sink, UploadError};

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The model could not be loaded or run.
    #[error("failed to embed the query: {0}")]
    Model(#[from] ModelError),
    /// The search failed.
    #[error(transparent)]
    Sink(#[from] UploadError),
    /// run.db could not be read.
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    /// A batch file could not be read.
    #[error(transparent)]
    BatchFile(#[from] embedfleet_core::batchfile::BatchFileError),
}

/// The query vector of `text`: `Instruct: {instruction}\nQuery:{text}` through the model (on the
/// CPU), cut to the model's context.
pub fn embed_query(
    model_dir: &Path,
    output_dim: Option<usize>,
    instruction: &str,
    text: &str,
) -> Result<Vec<f32>, QueryError> {
    let options = LoadOptions {
        output_dim,
        ..LoadOptions::default()
    };
    let model = Qwen3Embedder::load(model_dir, &options)?;
    let tokenizer = model.tokenizer()?;
    let mut ids = tokenizer.encode_query(instruction, text)?;
    let max = model.max_position_embeddings().max(1);
    if ids.len() > max {
        ids.truncate(max - 1);
        ids.push(tokenizer.eos_id());
    }
    let mut vectors = model.embed(&TokenBatch::from_sequences(&[ids]))?;
    Ok(vectors.pop().unwrap_or_default())
}

/// A search hit with the first words of its paper.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryHit {
    /// The hit, with its payload.
    pub hit: Hit,
    /// The first `words` words of the paper's text (`None` when the paper is not in this run).
    pub first_words: Option<String>,
}

/// The `k` nearest papers to `vector` in `collection`, with the first `words` words of each.
pub fn search_with_text(
    sink: &dyn Sink,
    db: &RunDb,
    collection: &str,
    vector: &[f32],
    k: usize,
    words: usize,
) -> Result<Vec<QueryHit>, QueryError> {
    let hits = sink.search(collection, vector, k, None)?;
    let ids: Vec<&str> = hits.iter().filter_map(|h| h.paper_id.as_deref()).collect();
    let texts = first_words(db, &ids, words)?;
    Ok(hits
        .into_iter()
        .map(|hit| {
            let first_words = hit.paper_id.as_ref().and_then(|id| texts.get(id).cloned());
            QueryHit { hit, first_words }
        })
        .collect())
}

/// Paper id -> its first `words` words, from the batch files that hold `ids`.
fn first_words(
    db: &RunDb,
    ids: &[&str],
    words: usize,
) -> Result<HashMap<String, String>, QueryError> {
    let mut by_file: HashMap<String, Vec<&str>> = HashMap::new();
    if !ids.is_empty() {
        db.index_paper_ids()?;
    }
    for id in ids {
        if let Some(path) = db.batch_path_of_paper(id)? {
            by_file.entry(path).or_default().push(id);
        }
    }
    let mut out = HashMap::new();
    for (path, wanted) in by_file {
        embedfleet_core::batchfile::read(&db.dir().join(path), |row| {
            if wanted.contains(&row.paper.id.as_str()) {
                let text: Vec<&str> = row.paper.text.split_whitespace().take(words).collect();
                out.insert(row.paper.id.clone(), text.join(" "));
            }
        })?;
    }
    Ok(out)
}
