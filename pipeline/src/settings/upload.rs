//! `upload`'s settings, resolved once: the collection's spec from the flags, the batching as
//! given, else as `tune` measured it for this kind of database, else the sink's default
//! ([`crate::tuned`]), and a worker process's share of the batches.

use crate::flags::{CollectionFlags, UploadFlags};
use crate::tuned::{self, Batching};
use embedfleet_core::rundb::RunDb;
use embedfleet_vectordb::{CollectionSpec, Sink, UploadOptions};
use std::io::IsTerminal;

/// What one upload runs with.
#[derive(Debug, Clone)]
pub struct UploadSettings {
    pub options: UploadOptions,
    /// Where the batch size and requests in flight came from (the options hold the values).
    pub batching: Batching,
}

impl UploadSettings {
    /// `flags` resolved against the run in `db`, for an upload into `sink`.
    pub fn resolve(db: &RunDb, sink: &dyn Sink, flags: &UploadFlags) -> anyhow::Result<Self> {
        let batching = tuned::upload_batching(
            db,
            sink.kind(),
            (flags.batch_size, flags.in_flight),
            sink.default_batch_size(),
        )?;
        let mut options = UploadOptions::new(&flags.run_dir, &flags.collection);
        apply_collection_flags(&mut options.spec, &flags.collection_settings);
        let spec = &mut options.spec;
        spec.qdrant.shard_number = flags.shard_number;
        spec.qdrant.replication_factor = flags.replication_factor;
        spec.bulk_load = !flags.no_bulk_load;
        options.batch_size = batching.batch_size.value;
        options.in_flight = batching.in_flight.value;
        options.checkpoint_every = flags.checkpoint_every.max(1);
        options.progress = flags.worker.is_none() && std::io::stderr().is_terminal();
        options.share = flags.worker.as_deref().map(parse_share).transpose()?;
        Ok(Self { options, batching })
    }
}

/// The collection's index and storage flags onto its spec (the upload's and the shard
/// builds').
pub fn apply_collection_flags(spec: &mut CollectionSpec, flags: &CollectionFlags) {
    spec.qdrant.hnsw.m = flags.hnsw_m;
    spec.qdrant.hnsw.ef_construct = flags.hnsw_ef_construct;
    spec.qdrant.on_disk_vectors = flags.on_disk_vectors;
    spec.qdrant.int8_quantization = flags.int8;
}

/// `--worker I/N`: this worker's share of the batches.
fn parse_share(s: &str) -> anyhow::Result<(u64, u64)> {
    let parsed = s
        .split_once('/')
        .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
    match parsed {
        Some((i, n)) if i < n => Ok((i, n)),
        _ => anyhow::bail!("--worker takes I/N with I < N, e.g. 0/4 (got `{s}`)"),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_share;

    #[test]
    fn a_worker_share_is_i_of_n_with_i_below_n() {
        assert_eq!(parse_share("0/4").unwrap(), (0, 4));
        assert_eq!(parse_share("3/4").unwrap(), (3, 4));
        for bad in ["4/4", "1", "a/b", "-1/2", ""] {
            let err = parse_share(bad).unwrap_err().to_string();
            assert!(err.contains("--worker takes I/N"), "{bad}: {err}");
        }
    }
}
