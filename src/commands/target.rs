//! The flags that say where points go (`--qdrant`, `--edge`, the API key, `--postgres`) and the collection's
//! settings, as the libraries take them: shared by `upload`, `delete`, `tune`, `query`, `eval`
//! and the snapshot load.

use crate::cli::{CollectionArgs, PgIndexArg, PgScanArg, TargetArgs};
use anyhow::Result;
use embedfleet_pipeline::target::{SinkKind, TargetFlags};
use embedfleet_upload::{self as upload, Sink};
use std::path::Path;

/// `target`'s flags as the pipeline takes them.
pub(super) fn target_flags(target: &TargetArgs) -> TargetFlags {
    TargetFlags {
        qdrant: target.qdrant.clone(),
        edge: target.edge.clone(),
        api_key_env: target.api_key_env.clone(),
        api_key_file: target.api_key_file.clone(),
        allow_insecure: target.allow_insecure,
        postgres: target.postgres.as_ref().map(|url| pg_config(target, url)),
    }
}

/// The PostgreSQL database at `url` with `target`'s pgvector settings.
pub(super) fn pg_config(target: &TargetArgs, url: &str) -> upload::PgConfig {
    upload::PgConfig {
        index: match target.pg_index {
            PgIndexArg::Hnsw => upload::PgIndex::Hnsw,
            PgIndexArg::Ivfflat => upload::PgIndex::IvfFlat,
        },
        iterative_scan: match target.pg_iterative_scan {
            PgScanArg::Relaxed => upload::IterativeScan::Relaxed,
            PgScanArg::Strict => upload::IterativeScan::Strict,
            PgScanArg::Off => upload::IterativeScan::Off,
        },
        maintenance_mem_mb: target.pg_maintenance_mem,
        ..upload::PgConfig::new(url)
    }
}

/// The sink of `target`, and its kind (for the tuned settings and what it is told).
pub(super) fn open_sink(run_dir: &Path, target: &TargetArgs) -> Result<(Box<dyn Sink>, SinkKind)> {
    Ok(target_flags(target).open(run_dir)?)
}

pub(super) fn apply_collection_args(spec: &mut upload::CollectionSpec, args: &CollectionArgs) {
    spec.qdrant.hnsw.m = args.hnsw_m;
    spec.qdrant.hnsw.ef_construct = args.hnsw_ef_construct;
    spec.qdrant.on_disk_vectors = args.on_disk_vectors;
    spec.qdrant.int8_quantization = args.int8;
}
