//! What a query request says of the collection it searched and the model that embedded its
//! terms (`embedfleet_query::Searched`): read from the sink and run.db, so that a results file
//! made against one release of the collection is never taken for the answer against the next.

use std::path::Path;

use embedfleet_core::rundb::RunDb;
use embedfleet_query::Searched;
use embedfleet_vectordb::{progress_key, CountRequest, Sink};

use crate::error::{PipelineError, Result};

/// The collection `collection` of `sink` as the run knows it, and the model of `model_dir` at
/// `dim`. A collection that does not exist is refused with the upload that makes it.
pub fn searched(
    db: &RunDb,
    sink: &dyn Sink,
    collection: &str,
    model_dir: &Path,
    dim: Option<usize>,
) -> Result<Searched> {
    if sink.collection_info(collection)?.is_none() {
        return Err(nothing_uploaded(db, sink, collection));
    }
    let key = progress_key(sink, collection);
    let points = sink.count(CountRequest::new(collection))?;
    let (acked, _) = db.upload_totals(&key)?;
    let contents = match db.upload_release(&key)? {
        Some(release) => format!("release {release}, {acked} rows sent, {points} points"),
        None if acked > 0 => format!("no complete upload, {acked} rows sent, {points} points"),
        None => format!("not uploaded by this run, {points} points"),
    };
    let marker = sink.collection_marker(collection)?;
    Ok(Searched {
        target: sink.target(),
        marker,
        contents,
        model: embedfleet_embed::model_revision(model_dir),
        dim,
    })
}

/// The refusal of a search of a collection that does not exist: most often nothing was
/// uploaded yet.
pub fn nothing_uploaded(db: &RunDb, sink: &dyn Sink, collection: &str) -> PipelineError {
    PipelineError::NotUploaded {
        collection: collection.to_string(),
        target: sink.target(),
        upload: upload_command(db, sink, collection),
    }
}

/// The `upload` that fills `collection` at `sink` from the run of `db`: the run's own embedded
/// Qdrant needs no flag, any other target its own, and a collection other than `papers` its name.
pub fn upload_command(db: &RunDb, sink: &dyn Sink, collection: &str) -> String {
    let mut command = format!("embedfleet upload --run-dir {}", db.dir().display());
    let own_edge = embedfleet_core::RunLayout::new(db.dir()).edge_dir();
    let own_edge = std::fs::canonicalize(&own_edge).unwrap_or(own_edge);
    let flag = sink.target_flag();
    if !flag.is_empty() && sink.target() != format!("edge:{}", own_edge.display()) {
        command.push(' ');
        command.push_str(&flag);
    }
    if collection != embedfleet_vectordb::DEFAULT_COLLECTION {
        command.push_str(&format!(" --collection {collection}"));
    }
    command
}
