//! The end of `embedfleet run`: the run's shards into the embedded engine
//! (`<run-dir>/qdrant`, collection `papers`), then one query embedded with the run's model and
//! searched. It crosses three stages: upload, embed (the query vector) and the search.

use std::path::Path;

use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_upload::query::{self, QueryHit};
use embedfleet_upload::{QdrantEdge, UploadOptions, UploadReport};

use crate::error::Result;

/// The collection `run` uploads into.
pub const RUN_COLLECTION: &str = "papers";

/// What the end of `run` did: the upload, and the top papers for the query (none when the run
/// had no shards to upload).
pub struct UploadAndQuery {
    pub upload: UploadReport,
    pub hits: Vec<QueryHit>,
}

/// Uploads the run in `run_dir` into its embedded engine, then searches the top `k` papers for
/// `query_text`, embedded with the model in `model_dir` (at `dim`). Points that failed are in
/// the report; `embedfleet status` shows them as missing.
pub fn upload_and_query(
    run_dir: &Path,
    model_dir: &Path,
    dim: Option<usize>,
    query_text: &str,
    k: usize,
    progress: bool,
) -> Result<UploadAndQuery> {
    let sink = QdrantEdge::open(RunLayout::new(run_dir).edge_dir())?;
    let mut options = UploadOptions::new(run_dir, RUN_COLLECTION);
    options.progress = progress;
    let upload = embedfleet_upload::upload(&sink, &options)?;
    // One handle for what follows the upload (the upload opens its own, as its workers do).
    let db = RunDb::open(run_dir)?;
    crate::activity::record_upload(&db, &sink, &options, &upload);
    if upload.ensured.is_none() {
        return Ok(UploadAndQuery {
            upload,
            hits: Vec::new(),
        });
    }
    let instruction = crate::settings::query::instruction(model_dir, None)?;
    let vector = embedfleet_embed::embed_query(model_dir, dim, &instruction, query_text)?;
    let hits = query::search_with_text(&sink, &db, RUN_COLLECTION, &vector, k, 12)?;
    Ok(UploadAndQuery { upload, hits })
}
