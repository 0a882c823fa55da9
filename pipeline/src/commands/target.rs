//! Where points go (`--qdrant`, `--edge`, the API key, `--postgres`) and the collection's
//! settings, as the libraries take them: shared by `upload`, `delete`, `tune`, `query`, `eval`
//! and the snapshot load.

use crate::flags::{CollectionFlags, TargetFlags};
use anyhow::Result;
use embedfleet_vectordb::{self as upload, Sink};
use std::path::Path;

/// The sink of `target` (the sink factory, `TargetFlags::open`, makes it).
pub(super) fn open_sink(run_dir: &Path, target: &TargetFlags) -> Result<Box<dyn Sink>> {
    Ok(target.open(run_dir)?)
}

pub(super) fn apply_collection_args(spec: &mut upload::CollectionSpec, args: &CollectionFlags) {
    spec.qdrant.hnsw.m = args.hnsw_m;
    spec.qdrant.hnsw.ef_construct = args.hnsw_ef_construct;
    spec.qdrant.on_disk_vectors = args.on_disk_vectors;
    spec.qdrant.int8_quantization = args.int8;
}
