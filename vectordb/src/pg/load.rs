//! An upsert batch into a table: binary `COPY` into a temporary staging table of the session,
//! then one `INSERT … ON CONFLICT (id) DO UPDATE` into the table, in one transaction, committed
//! without waiting for the disk (`Sink::checkpoint` does, for every batch before it). A batch
//! sent twice (a retry, a resumed upload) leaves one row per paper: the second copy updates the
//! first. The staging table is the session's own (`pg_temp`: no WAL, no other session sees it)
//! and empties itself at each commit. Into a table this sink made, a batch is copied straight
//! in first (no id can be there unless it was sent before), and only one that meets an id
//! already there takes the staging way.

use pgvector::{HalfVector, Vector};
use postgres::binary_copy::BinaryCopyInWriter;
use postgres::error::SqlState;
use postgres::types::{ToSql, Type};

use super::connect::Session;
use super::sql::pg_err;
use super::table::{Storage, COLUMNS};
use crate::error::UploadResult;
use crate::points::PointsBatch;

/// Rows per upsert batch by default. A batch costs five round trips, an `INSERT` planned and
/// the staging table emptied at its commit, whatever its rows: at 2,048 rows the load of
/// 200,000 × 768-d, every batch staged, kept 0.88x and 0.72x the rows/s of a plain binary
/// COPY in two runs where 256 kept 0.74x and 0.68x (BENCHMARKS.md "The load before the index against a plain COPY"). 2,048 rows of 768-d f32
/// staged whole are 6.4 MB, within the default `temp_buffers` (8 MB).
pub const DEFAULT_BATCH: usize = 2048;

/// Test hook: milliseconds each COPY pauses half-way through its rows, so that a test can kill
/// an upload mid-COPY. Not for production use.
pub const TEST_COPY_DELAY_ENV: &str = "EMBEDFLEET_PG_TEST_COPY_DELAY_MS";

/// The staging table of a session for vectors stored as `storage`.
fn staging_name(storage: Storage) -> String {
    format!("embedfleet_stage_{}", storage.sql())
}

/// The column types of the staging table for `storage`, making it on the session's first use.
/// Its vector column has no size: the insert into the table checks it. Its rows stay whole
/// up to a page (`toast_tuple_target` 8160): pgvector stores vectors out of line past 2 KB,
/// and a staged vector moved out of line would be written to the staging table's TOAST, read
/// back and written again to the table's, for every row.
fn staging_types(session: &mut Session, storage: Storage) -> UploadResult<Vec<Type>> {
    if let Some(types) = session.staged.get(&storage) {
        return Ok(types.clone());
    }
    let name = staging_name(storage);
    session
        .client
        .batch_execute(&format!(
            "CREATE TEMP TABLE IF NOT EXISTS {name} (id uuid, paper_id text, embedding {}, \
             year integer, source text, n_chars integer, n_tokens integer) \
             WITH (toast_tuple_target = 8160) ON COMMIT DELETE ROWS",
            storage.sql()
        ))
        .map_err(pg_err("make the staging table"))?;
    let statement = session
        .statement(&format!("SELECT {COLUMNS} FROM {name} LIMIT 0"))
        .map_err(pg_err("make the staging table"))?;
    let types: Vec<Type> = statement
        .columns()
        .iter()
        .map(|c| c.type_().clone())
        .collect();
    session.staged.insert(storage, types.clone());
    Ok(types)
}

/// Writes `points` to a binary COPY of [`COLUMNS`] in that order.
fn write_rows(
    writer: &mut BinaryCopyInWriter<'_>,
    storage: Storage,
    points: &PointsBatch<'_>,
) -> Result<(), postgres::Error> {
    let pause = std::env::var(TEST_COPY_DELAY_ENV)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(std::time::Duration::from_millis);
    for (row, p) in points.iter().enumerate() {
        if let Some(pause) = pause.filter(|_| row == points.len() / 2) {
            // The server is in the COPY, half the rows written: a kill now is mid-COPY.
            std::thread::sleep(pause);
        }
        let id = p.id();
        let year = p.year.and_then(|y| i32::try_from(y).ok());
        let vector: Box<dyn ToSql + Sync> = match storage {
            Storage::Vector => Box::new(Vector::from(p.vector.to_vec())),
            Storage::Halfvec => Box::new(HalfVector::from_f32_slice(p.vector)),
        };
        writer.write(&[
            &id,
            &p.paper_id,
            vector.as_ref(),
            &year,
            &p.source,
            &p.n_chars,
            &p.n_tokens,
        ])?;
    }
    Ok(())
}

/// Upserts `points` into `table` (quoted), in one transaction: all of the batch or none of it.
/// `fresh`: this sink made the table, so its rows are mostly new: they are copied straight in,
/// as a plain COPY is (a page of rows at a time, no second pass through a staging table), and
/// only a batch meeting an id already there (a retry, a batch sent twice) goes the staging way.
pub(super) fn upsert(
    session: &mut Session,
    table: &str,
    storage: Storage,
    points: &PointsBatch<'_>,
    fresh: bool,
) -> UploadResult<()> {
    if fresh && copy_new(session, table, storage, points)? {
        return Ok(());
    }
    upsert_staged(session, table, storage, points)
}

/// Copies `points` straight into `table`: false, with nothing written, when one of their ids
/// is there already.
fn copy_new(
    session: &mut Session,
    table: &str,
    storage: Storage,
    points: &PointsBatch<'_>,
) -> UploadResult<bool> {
    let types = staging_types(session, storage)?;
    let mut tx = session.client.transaction().map_err(pg_err("copy rows"))?;
    let copied = (|| {
        // No fsync per batch, as in `upsert_staged`.
        tx.batch_execute("SET LOCAL synchronous_commit = off")?;
        let sink = tx.copy_in(&format!(
            "COPY {table} ({COLUMNS}) FROM STDIN (FORMAT binary)"
        ))?;
        let mut writer = BinaryCopyInWriter::new(sink, &types);
        write_rows(&mut writer, storage, points)?;
        writer.finish().map(|_| ())
    })();
    match copied {
        Ok(()) => {
            tx.commit().map_err(pg_err("copy rows"))?;
            Ok(true)
        }
        // Dropping the transaction rolls it back: none of the batch stays.
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => Ok(false),
        Err(e) => Err(pg_err("copy rows")(e)),
    }
}

/// Copies `points` into the staging table and upserts them into `table`, in one transaction.
fn upsert_staged(
    session: &mut Session,
    table: &str,
    storage: Storage,
    points: &PointsBatch<'_>,
) -> UploadResult<()> {
    let types = staging_types(session, storage)?;
    let staging = staging_name(storage);
    let insert = format!(
        "INSERT INTO {table} ({COLUMNS}) SELECT {COLUMNS} FROM {staging} \
         ON CONFLICT (id) DO UPDATE SET paper_id = EXCLUDED.paper_id, \
         embedding = EXCLUDED.embedding, year = EXCLUDED.year, source = EXCLUDED.source, \
         n_chars = EXCLUDED.n_chars, n_tokens = EXCLUDED.n_tokens"
    );
    let insert = session.statement(&insert).map_err(pg_err("upsert rows"))?;
    let mut tx = session
        .client
        .transaction()
        .map_err(pg_err("upsert rows"))?;
    // No fsync per batch: `Sink::checkpoint` makes every acknowledged batch durable at once
    // (the upload records progress only after it), as Qdrant's flush does.
    tx.batch_execute("SET LOCAL synchronous_commit = off")
        .map_err(pg_err("upsert rows"))?;
    let sink = tx
        .copy_in(&format!(
            "COPY {staging} ({COLUMNS}) FROM STDIN (FORMAT binary)"
        ))
        .map_err(pg_err("copy rows"))?;
    let mut writer = BinaryCopyInWriter::new(sink, &types);
    write_rows(&mut writer, storage, points).map_err(pg_err("copy rows"))?;
    writer.finish().map_err(pg_err("copy rows"))?;
    tx.execute(&insert, &[]).map_err(pg_err("upsert rows"))?;
    tx.commit().map_err(pg_err("upsert rows"))
}
