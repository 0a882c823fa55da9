//! What publishing reads of the run directory: which batches are not (all) embedded, and the
//! parquet shards — checked to agree with each other and with run.db before a byte is written,
//! because the split into data files is computed from run.db's row counts alone.

use crate::error::{io, pq_err, MissingBatch, PublishError};
use arrow_array::{Array, StringArray};
use arrow_schema::{DataType, Schema, SchemaRef};
use embedfleet_core::rundb::{RunDb, ShardRow};
use embedfleet_core::state::BatchState;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// Shard metadata keys that differ from shard to shard and so say nothing of the whole.
const PER_SHARD_KEYS: [&str; 1] = ["embedfleet.timings"];

/// The run's parquet shards, as one table.
#[derive(Debug, Clone)]
pub struct Source {
    /// In batch and part order.
    pub shards: Vec<ShardRow>,
    /// The shards' arrow schema (all equal).
    pub schema: SchemaRef,
    /// The shards' `embedfleet.*` key-value metadata, less what is per shard.
    pub meta: Vec<(String, String)>,
    pub dim: usize,
    /// Bytes of one vector element: 4 (float32) or 2 (float16).
    pub item_bytes: usize,
    /// Mean UTF-8 bytes of a paper's text, estimated from the plan's character counts.
    pub text_bytes: u64,
    /// Identifies the run's plan (corpus files and batches), not its progress: a published
    /// folder of the same run may be replaced, one of another run may not.
    pub plan_sha256: String,
    /// Per shard (as `shards`), the rows left out of the data files, sorted: papers deleted
    /// from the run (`embedfleet delete`, run.db's tombstones), and rows a later corpus
    /// release superseded or withdrew (`plan --update`).
    pub deleted: Vec<Vec<u64>>,
    /// How many of `deleted` are rows releases withheld (the rest are tombstones).
    pub withheld: u64,
    /// Per shard (as `shards`), the rows whose corpus metadata a later release changed without
    /// changing the text, each with the new metadata's hash (the values are read a batch at a
    /// time when the file is written), sorted by row.
    pub restamped: Vec<Vec<(u64, u64)>>,
    /// Per shard (as `shards`), the corpus release its batch was planned in: each release's
    /// rows go to data files of their own, so a later release leaves an earlier one's files as
    /// they were unless it took one of their papers out.
    pub releases: Vec<i64>,
}

impl Source {
    /// Rows of papers deleted from the run (tombstones), left out of the data files.
    pub fn deleted_rows(&self) -> u64 {
        self.deleted.iter().map(|d| d.len() as u64).sum::<u64>() - self.withheld
    }

    /// `float32` or `float16`: what the vectors are stored as.
    pub fn vector_type(&self) -> &'static str {
        if self.item_bytes == 2 {
            "float16"
        } else {
            "float32"
        }
    }

    /// Reads every shard's footer and checks them against the first and against run.db.
    pub fn read(db: &RunDb) -> Result<Self, PublishError> {
        let shards = db.all_shards()?;
        let first = shards.first().ok_or(PublishError::NoShards)?;
        let Footer { schema, meta, .. } = footer(&db.dir().join(&first.path))?;
        let (dim, item_bytes) = vector_shape(&schema, &db.dir().join(&first.path))?;
        for shard in &shards {
            let path = db.dir().join(&shard.path);
            let other = footer(&path)?;
            if other.rows != shard.rows {
                return Err(PublishError::ShardRows {
                    path,
                    recorded: shard.rows,
                    found: other.rows,
                });
            }
            if let Some(what) = difference(&schema, &meta, &other.schema, &other.meta) {
                return Err(PublishError::MixedShards { path, what });
            }
        }
        let RowMarks {
            deleted,
            withheld,
            restamped,
        } = row_marks(db, &shards)?;
        let release_of = release_of_batches(db)?;
        let releases = shards
            .iter()
            .map(|s| release_of.get(&s.batch_id.0).copied().unwrap_or(1))
            .collect();
        Ok(Source {
            withheld,
            restamped,
            releases,
            shards,
            schema,
            meta,
            dim,
            item_bytes,
            text_bytes: text_bytes(db)?,
            plan_sha256: plan_sha256(db)?,
            deleted,
        })
    }
}

/// What [`row_marks`] finds per shard: the fields of [`Source`] of the same names.
struct RowMarks {
    deleted: Vec<Vec<u64>>,
    withheld: u64,
    restamped: Vec<Vec<(u64, u64)>>,
}

/// Per shard, the rows left out (see [`Source::deleted`]), how many of them a release withheld,
/// and the rows a later release gave new metadata (see [`Source::restamped`]; run.db is asked
/// for those a batch at a time). Only the shards of batches with such a row are read, once
/// each, their `id` column alone.
fn row_marks(db: &RunDb, shards: &[ShardRow]) -> Result<RowMarks, PublishError> {
    let mut by_batch: HashMap<i64, HashSet<String>> = HashMap::new();
    for t in db.tombstones()? {
        by_batch.entry(t.batch_id).or_default().insert(t.paper_id);
    }
    let mut withheld: HashMap<i64, HashSet<String>> = HashMap::new();
    for w in db.withheld_rows()? {
        withheld.entry(w.batch_id).or_default().insert(w.paper_id);
    }
    let any_restamps = db.has_restamps()?;
    let mut stamps: Option<(i64, HashMap<String, u64>)> = None;
    let mut marks = RowMarks {
        deleted: Vec::with_capacity(shards.len()),
        withheld: 0,
        restamped: Vec::with_capacity(shards.len()),
    };
    for shard in shards {
        let batch = shard.batch_id.0;
        if any_restamps && stamps.as_ref().is_none_or(|(b, _)| *b != batch) {
            let hashes = db
                .restamps_of_batch(batch)?
                .into_iter()
                .map(|r| (r.paper_id, r.meta_hash))
                .collect();
            stamps = Some((batch, hashes));
        }
        let new = stamps.as_ref().map(|(_, h)| h).filter(|h| !h.is_empty());
        let (dead, held) = (by_batch.get(&batch), withheld.get(&batch));
        let (mut left_out, mut restamped) = (Vec::new(), Vec::new());
        if dead.is_some() || held.is_some() || new.is_some() {
            let ids = ids_of(&db.dir().join(&shard.path))?;
            for (row, id) in (0u64..).zip(&ids) {
                let id = id.as_str();
                if dead.is_some_and(|d| d.contains(id)) {
                    left_out.push(row);
                } else if held.is_some_and(|h| h.contains(id)) {
                    left_out.push(row);
                    marks.withheld += 1;
                } else if let Some(hash) = new.and_then(|n| n.get(id)) {
                    restamped.push((row, *hash));
                }
            }
        }
        marks.deleted.push(left_out);
        marks.restamped.push(restamped);
    }
    Ok(marks)
}

/// The corpus release of each batch.
fn release_of_batches(db: &RunDb) -> Result<HashMap<i64, i64>, PublishError> {
    let mut stmt = db
        .conn()
        .prepare("SELECT b.id, f.release FROM batches b JOIN corpus_files f ON f.id = b.file_id")
        .map_err(|e| db.err(e))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .and_then(|r| r.collect::<rusqlite::Result<HashMap<i64, i64>>>())
        .map_err(|e| db.err(e))?;
    Ok(rows)
}

/// The `id` column of a parquet shard, in row order.
fn ids_of(path: &Path) -> Result<Vec<String>, PublishError> {
    let file = File::open(path).map_err(io(path))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(pq_err(path))?;
    let Some(root) = builder
        .schema()
        .fields()
        .iter()
        .position(|f| f.name() == "id")
    else {
        return Err(PublishError::Parquet {
            path: path.into(),
            message: "no `id` column: not a parquet shard of embedfleet".into(),
        });
    };
    let mask = ProjectionMask::roots(builder.parquet_schema(), [root]);
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(pq_err(path))?;
    let mut ids = Vec::new();
    for batch in reader {
        let batch = batch.map_err(pq_err(path))?;
        let column = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| PublishError::Parquet {
                path: path.into(),
                message: "the `id` column is not utf8".into(),
            })?;
        ids.extend(column.iter().map(|id| id.unwrap_or_default().to_owned()));
    }
    Ok(ids)
}

/// What a parquet shard's footer says.
struct Footer {
    schema: SchemaRef,
    /// `embedfleet.*` key-value metadata, less what is per shard.
    meta: Vec<(String, String)>,
    rows: u64,
}

/// Reads a parquet file's footer alone.
fn footer(path: &Path) -> Result<Footer, PublishError> {
    let file = File::open(path).map_err(io(path))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(pq_err(path))?;
    let file_meta = builder.metadata().file_metadata();
    let meta = file_meta
        .key_value_metadata()
        .into_iter()
        .flatten()
        .filter(|kv| kv.key.starts_with("embedfleet.") && !PER_SHARD_KEYS.contains(&&*kv.key))
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect();
    let rows = u64::try_from(file_meta.num_rows()).unwrap_or(0);
    // The columns alone: the arrow schema also carries every key-value pair of the file
    // (this shard's timings among them), which would ride into each data file's ARROW:schema.
    let schema = Arc::new(Schema::new(builder.schema().fields().clone()));
    Ok(Footer { schema, meta, rows })
}

fn vector_shape(schema: &SchemaRef, path: &Path) -> Result<(usize, usize), PublishError> {
    match schema.field_with_name("embedding").map(|f| f.data_type()) {
        Ok(DataType::FixedSizeList(item, n)) if item.data_type() == &DataType::Float16 => {
            Ok((*n as usize, 2))
        }
        Ok(DataType::FixedSizeList(item, n)) if item.data_type() == &DataType::Float32 => {
            Ok((*n as usize, 4))
        }
        _ => Err(PublishError::Parquet {
            path: path.into(),
            message: "no `embedding` column of fixed-size float32 or float16 lists: not a parquet shard of embedfleet".into(),
        }),
    }
}

/// What differs between two shards, in words; `None` when they agree.
fn difference(
    schema: &SchemaRef,
    meta: &[(String, String)],
    other_schema: &SchemaRef,
    other_meta: &[(String, String)],
) -> Option<String> {
    if schema.fields() != other_schema.fields() {
        return Some("the columns differ".into());
    }
    let map = |m: &[(String, String)]| -> HashMap<String, String> { m.iter().cloned().collect() };
    let (a, b) = (map(meta), map(other_meta));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().find_map(|k| {
        let (x, y) = (a.get(k), b.get(k));
        (x != y).then(|| {
            let show = |v: Option<&String>| v.map_or("absent".to_string(), |v| format!("`{v}`"));
            format!("{k} is {} there, {} in the first", show(y), show(x))
        })
    })
}

/// Mean bytes of text per planned paper (chars ≈ bytes for the mostly-ASCII corpus): what
/// `--with-text` adds to a row. From the plan, so it does not move while the run progresses.
fn text_bytes(db: &RunDb) -> Result<u64, PublishError> {
    let (chars, rows): (Option<u64>, Option<u64>) = db
        .conn()
        .query_row("SELECT sum(n_chars), sum(n_rows) FROM batches", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(|e| db.err(e))?;
    Ok(chars.unwrap_or(0) / rows.unwrap_or(0).max(1))
}

/// The run's identity, from its first release (corpus files and batches): later releases of
/// the corpus are new versions of the same dataset, and may replace a folder it published.
fn plan_sha256(db: &RunDb) -> Result<String, PublishError> {
    let mut hasher = Sha256::new();
    let queries = [
        "SELECT path || char(31) || size || char(31) || mtime_ns FROM corpus_files WHERE release = 1 ORDER BY id",
        "SELECT b.id || char(31) || b.path || char(31) || b.n_rows FROM batches b
         JOIN corpus_files f ON f.id = b.file_id WHERE f.release = 1 ORDER BY b.id",
    ];
    for sql in queries {
        let mut stmt = db.conn().prepare(sql).map_err(|e| db.err(e))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|r| r.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| db.err(e))?;
        for row in rows {
            hasher.update(row.as_bytes());
            hasher.update([30u8]);
        }
        hasher.update([29u8]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// Batches whose papers are not all in parquet shards: every batch not `done`, and a `done`
/// one whose shards and `embed_failed` quarantine fall short of its planned papers.
pub fn missing_batches(db: &RunDb) -> Result<Vec<MissingBatch>, PublishError> {
    let failed = embed_failed_by_batch(db)?;
    let mut stmt = db
        .conn()
        .prepare(
            "SELECT b.id, b.state, b.n_rows - b.n_excluded,
                    (SELECT coalesce(sum(s.rows), 0) FROM shards s WHERE s.batch_id = b.id)
             FROM batches b ORDER BY b.id",
        )
        .map_err(|e| db.err(e))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, u64>(2)?,
                r.get::<_, u64>(3)?,
            ))
        })
        .and_then(|r| r.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(|e| db.err(e))?;
    let done = BatchState::Done.as_str();
    Ok(rows
        .into_iter()
        .filter_map(|(id, state, papers, in_shards)| {
            let accounted = in_shards + failed.get(&id).copied().unwrap_or(0);
            let missing = papers.saturating_sub(accounted);
            (state != done || missing > 0).then_some(MissingBatch {
                id,
                state,
                papers,
                missing,
            })
        })
        .collect())
}

/// Papers quarantined as `embed_failed`, per batch. Skips the join over all papers (no index
/// on their ids) when, as usual, there are none.
fn embed_failed_by_batch(db: &RunDb) -> Result<HashMap<i64, u64>, PublishError> {
    let reason = embedfleet_core::quarantine::QuarantineReason::EmbedFailed.as_str();
    let any: u64 = db
        .conn()
        .query_row(
            "SELECT count(*) FROM quarantine WHERE reason = ?1",
            [reason],
            |r| r.get(0),
        )
        .map_err(|e| db.err(e))?;
    if any == 0 {
        return Ok(HashMap::new());
    }
    let mut stmt = db
        .conn()
        .prepare(
            "SELECT p.batch_id, count(DISTINCT p.id) FROM quarantine q
             JOIN papers p ON p.id = q.paper_id AND p.duplicate_of IS NULL
             JOIN batches b ON b.id = p.batch_id AND b.file_id = q.file_id
             WHERE q.reason = ?1 GROUP BY p.batch_id",
        )
        .map_err(|e| db.err(e))?;
    let rows = stmt
        .query_map([reason], |r| Ok((r.get(0)?, r.get(1)?)))
        .and_then(|r| r.collect::<rusqlite::Result<HashMap<i64, u64>>>());
    rows.map_err(|e| db.err(e).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedfleet_core::shardfile::{schema, VectorDtype};

    fn meta(model: &str) -> Vec<(String, String)> {
        vec![
            ("embedfleet.model".into(), model.into()),
            ("embedfleet.dim".into(), "8".into()),
        ]
    }

    #[test]
    fn shards_of_another_model_or_vector_type_differ_and_alike_ones_do_not() {
        let f32s = schema(8, VectorDtype::F32);
        assert_eq!(difference(&f32s, &meta("a"), &f32s, &meta("a")), None);
        let what = difference(&f32s, &meta("a"), &f32s, &meta("b")).unwrap();
        assert_eq!(what, "embedfleet.model is `b` there, `a` in the first");
        let f16s = schema(8, VectorDtype::F16);
        let what = difference(&f32s, &meta("a"), &f16s, &meta("a")).unwrap();
        assert_eq!(what, "the columns differ");
    }
}
