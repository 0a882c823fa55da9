//! One query against an uploaded collection: the nearest papers to a query vector (embedded by
//! `embedfleet_embed::embed_query`), with their first words read back from the run's batch
//! files (the parquet shards and the payload hold no text).

use std::collections::HashMap;

use embedfleet_core::rundb::{RunDb, RunDbError};

use crate::error::UploadError;
use crate::request::{Hit, QueryRequest, SearchOptions};
use crate::sink::Sink;

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
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
    let search = SearchOptions::new(k);
    search_with_text_as(sink, db, collection, vector, &search, words)
}

/// [`search_with_text`] with the search's filter and settings.
pub fn search_with_text_as(
    sink: &dyn Sink,
    db: &RunDb,
    collection: &str,
    vector: &[f32],
    search: &SearchOptions,
    words: usize,
) -> Result<Vec<QueryHit>, QueryError> {
    let request = QueryRequest::one(collection, vector, search.clone());
    let hits = sink.query(request)?.into_iter().next().unwrap_or_default();
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
