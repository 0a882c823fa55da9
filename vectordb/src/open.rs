//! Opening a collection for a run's upload: what is left to send, whether the recorded progress
//! is still true of the collection (`integrity.rs`), the collection created or checked, and in
//! a custom-sharded collection the shard keys the pending batches go to. Shared by the
//! in-process upload and the parent of the worker processes.

use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;

use crate::error::UploadRunError;
use crate::integrity;
use crate::options::UploadOptions;
use crate::prepared::{prepare, progress_key, Prepared};
use crate::shard_keys::ShardKeys;
use crate::sink::{is_keyed, Sink};
use crate::spec::{CollectionSpec, Ensured};

/// A collection ready to receive a run's shards (see [`open_collection`]).
pub(crate) struct OpenCollection<'d> {
    pub db: &'d RunDb,
    pub prepared: Prepared,
    /// The spec with the shards' vector size, as created or checked.
    pub spec: CollectionSpec,
    pub dim: usize,
    pub ensured: Ensured,
}

/// Reads what is left to send and creates or checks the collection; `None` when the run has no
/// shards yet.
pub(crate) fn open_collection<'d>(
    sink: &dyn Sink,
    db: &'d RunDb,
    options: &UploadOptions,
) -> Result<Option<OpenCollection<'d>>, UploadRunError> {
    let key = progress_key(sink, &options.spec.name);
    let name = options.spec.name.as_str();
    let prepared = prepare(db, &key)?;
    let Some(dim) = prepared.dim else {
        return Ok(None);
    };
    // Progress is only as good as the collection it is about (see `integrity`): first the
    // collection's identity, then each batch's points.
    let exists = sink.collection_info(name)?.is_some();
    let found_marker = if exists {
        sink.collection_marker(name)?
    } else {
        None
    };
    let prepared = if integrity::follow_marker(db, &key, name, found_marker.as_deref())? {
        prepare(db, &key)?
    } else {
        prepared
    };
    let prepared = trusted_progress(sink, db, &key, name, prepared, exists, &found_marker)?;
    // Nothing left to send: indexing is not deferred again (on a server that could rebuild the
    // index), but `finish` still restores it, in case a killed upload left it deferred.
    let spec = CollectionSpec {
        vector_size: dim,
        vector_dtype: prepared.dtype,
        bulk_load: options.spec.bulk_load && prepared.pending() > 0,
        ..options.spec.clone()
    };
    let ensured = sink.ensure_collection(&spec)?;
    integrity::record_marker::<UploadRunError>(sink, db, &key, name, found_marker)?;
    ensure_pending_keys(sink, db, &spec.name, &prepared)?;
    Ok(Some(OpenCollection {
        db,
        prepared,
        spec,
        dim,
        ensured,
    }))
}

/// `prepared`, less the progress that is not true of the collection: all of it when the
/// collection is another than the one recorded (gone, or another marker), a short batch's
/// when its points are counted.
fn trusted_progress(
    sink: &dyn Sink,
    db: &RunDb,
    key: &str,
    name: &str,
    mut prepared: Prepared,
    exists: bool,
    found_marker: &Option<String>,
) -> Result<Prepared, UploadRunError> {
    let recorded_marker = db.upload_marker(key)?;
    if prepared.acked() > 0
        && integrity::is_another_collection(
            recorded_marker.as_deref(),
            exists,
            found_marker.as_deref(),
        )
    {
        eprintln!(
            "note: `{name}` was dropped or replaced since this run uploaded into it ({}): sending every point again",
            if exists {
                "its identity marker is not the one run.db recorded: made again, or another run's"
            } else {
                "it is gone"
            }
        );
        db.forget_uploads(key)?;
        prepared = prepare(db, key)?;
    }
    let tombstones = integrity::Tombstones::read(db)?;
    if exists && prepared.acked() > 0 {
        let keys = shard_keys_of(sink, db, name)?;
        let check =
            integrity::check_batches(sink, db, key, name, &prepared, &tombstones, keys.as_ref())?;
        if !check.resent.is_empty() {
            prepared = prepare(db, key)?;
        }
    }
    Ok(prepared)
}

/// A collection loaded from built shards has a shard key per group of batches: every write
/// names its batch's key, and a batch loaded no other way gets its key here, before any write,
/// owned by this run (another run's key is refused).
fn ensure_pending_keys(
    sink: &dyn Sink,
    db: &RunDb,
    collection: &str,
    prepared: &Prepared,
) -> Result<(), UploadRunError> {
    let (Some(keys), Some(extras)) = (shard_keys_of(sink, db, collection)?, sink.qdrant()) else {
        return Ok(());
    };
    let batches: Vec<i64> = prepared
        .shards
        .iter()
        .filter(|s| !s.is_done())
        .map(|s| s.batch_id)
        .collect();
    let mut groups: Vec<i64> = batches.iter().map(|&b| keys.group_of(b)).collect();
    groups.dedup();
    for group in groups {
        let owner = keys.owner_of_group(group, db.dir());
        extras.ensure_shard_key(collection, &keys.key_of_group(group), &owner)?;
    }
    Ok(())
}

/// The run's shard keys when `collection` is custom-sharded (loaded from built shards), so
/// that every write names its batch's key; `None` for an ordinary collection.
pub fn shard_keys_of(
    sink: &dyn Sink,
    db: &RunDb,
    collection: &str,
) -> Result<Option<ShardKeys>, UploadRunError> {
    if !is_keyed(sink, collection)? {
        return Ok(None);
    }
    ShardKeys::for_writes(&RunLayout::new(db.dir()))
        .map(Some)
        .map_err(UploadRunError::ShardKeys)
}
