//! Arrow record batch → Qdrant points: the sink-neutral view, point ids and payload.
//!
//! A [`PointsBatch`] borrows the columns of one record batch of an embed shard. It checks the
//! schema once and then hands out [`PointRef`]s that point straight into the Arrow buffers, so the
//! sinks copy each vector exactly once, as one slice, into their request type.
//!
//! **Point ids.** A point's id is the UUIDv5 of the paper id (its UTF-8 bytes) in the namespace
//! [`PAPER_NAMESPACE`], which is itself `uuid5(NAMESPACE_URL, "embedfleet:paper-id")`. In Python:
//! `uuid.uuid5(uuid.uuid5(uuid.NAMESPACE_URL, "embedfleet:paper-id"), paper_id)`. The same paper
//! therefore always lands on the same point, so a re-sent batch overwrites instead of duplicating.
//!
//! **Payload.** `paper_id` (string), `year` (integer, from the leading `YYYY` of `created`; absent
//! when `created` is null or has no year), `source` (string, absent when null), `n_chars` and
//! `n_tokens` (integers).

use std::borrow::Cow;

use arrow_array::{
    Array, FixedSizeListArray, Float16Array, Float32Array, Int32Array, RecordBatch, StringArray,
};
use arrow_schema::DataType;
use half::slice::HalfFloatSliceExt as _;
use uuid::Uuid;

use super::error::{UploadError, UploadResult};

/// Namespace of the point ids: `uuid5(NAMESPACE_URL, "embedfleet:paper-id")`.
///
/// Never change it: every uploaded collection's ids depend on it.
pub const PAPER_NAMESPACE: Uuid = uuid::uuid!("e92dfb99-f156-52b1-ab77-b5c5667945ae");

/// Payload key of the paper id.
pub const PAYLOAD_PAPER_ID: &str = "paper_id";
/// Payload key of the publication year (integer index).
pub const PAYLOAD_YEAR: &str = "year";
/// Payload key of the corpus source (keyword index).
pub const PAYLOAD_SOURCE: &str = "source";
/// Payload key of the paper's length in characters.
pub const PAYLOAD_N_CHARS: &str = "n_chars";
/// Payload key of the paper's length in tokens.
pub const PAYLOAD_N_TOKENS: &str = "n_tokens";

/// The deterministic point id of a paper (see the module docs).
pub fn point_id(paper_id: &str) -> Uuid {
    Uuid::new_v5(&PAPER_NAMESPACE, paper_id.as_bytes())
}

pub use embedfleet_core::paper::parse_year;

/// One point, borrowed from a [`PointsBatch`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PointRef<'a> {
    /// The paper id (`id` column).
    pub paper_id: &'a str,
    /// The embedding, as f32 (f16 shards are widened once per batch).
    pub vector: &'a [f32],
    /// Year parsed from `created`.
    pub year: Option<i64>,
    /// The `source` column.
    pub source: Option<&'a str>,
    /// The `n_chars` column.
    pub n_chars: Option<i32>,
    /// The `n_tokens` column.
    pub n_tokens: Option<i32>,
}

impl PointRef<'_> {
    /// The deterministic point id, [`point_id`] of the paper id.
    pub fn id(&self) -> Uuid {
        point_id(self.paper_id)
    }
}

/// A validated, borrowed view of one record batch of an embed shard.
#[derive(Debug)]
pub struct PointsBatch<'a> {
    ids: &'a StringArray,
    vectors: Cow<'a, [f32]>,
    dim: usize,
    n_chars: Option<&'a Int32Array>,
    n_tokens: Option<&'a Int32Array>,
    source: Option<&'a StringArray>,
    created: Option<&'a StringArray>,
}

impl<'a> PointsBatch<'a> {
    /// Checks the schema of `batch` and borrows its columns.
    ///
    /// Required: `id: utf8`, `embedding: fixed_size_list<float32 | float16>`. Optional (absent or
    /// null values leave the payload key out): `n_chars`, `n_tokens` (int32), `source`, `created`
    /// (utf8). Other columns are ignored. f32 vectors are borrowed; f16 vectors are widened once.
    pub fn from_record_batch(batch: &'a RecordBatch) -> UploadResult<Self> {
        let ids: &StringArray = required(batch, "id", "utf8")?;
        if let Some(row) = first_null(ids) {
            return Err(UploadError::NullValue { column: "id", row });
        }
        let (vectors, dim) = vectors(batch)?;
        Ok(Self {
            ids,
            vectors,
            dim,
            n_chars: optional(batch, "n_chars", "int32")?,
            n_tokens: optional(batch, "n_tokens", "int32")?,
            source: optional(batch, "source", "utf8")?,
            created: optional(batch, "created", "utf8")?,
        })
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Vector size of every point.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// All vectors, row after row (`len() * dim()` values).
    pub fn vectors(&self) -> &[f32] {
        &self.vectors
    }

    /// The point of row `row`.
    ///
    /// # Panics
    /// When `row >= len()`, like slice indexing.
    pub fn point(&self, row: usize) -> PointRef<'_> {
        let start = row * self.dim;
        PointRef {
            paper_id: self.ids.value(row),
            vector: &self.vectors[start..start + self.dim],
            year: string_at(self.created, row).and_then(parse_year),
            source: string_at(self.source, row),
            n_chars: int_at(self.n_chars, row),
            n_tokens: int_at(self.n_tokens, row),
        }
    }

    /// The points in row order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = PointRef<'_>> + '_ {
        (0..self.len()).map(|row| self.point(row))
    }
}

fn column<'a>(batch: &'a RecordBatch, name: &'static str) -> Option<&'a dyn Array> {
    batch.column_by_name(name).map(|c| c.as_ref())
}

fn downcast<'a, T: 'static>(
    array: &'a dyn Array,
    name: &'static str,
    expected: &'static str,
) -> UploadResult<&'a T> {
    array
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| UploadError::ColumnType {
            column: name,
            expected,
            found: array.data_type().to_string(),
        })
}

fn required<'a, T: 'static>(
    batch: &'a RecordBatch,
    name: &'static str,
    expected: &'static str,
) -> UploadResult<&'a T> {
    let array = column(batch, name).ok_or(UploadError::MissingColumn { column: name })?;
    downcast(array, name, expected)
}

fn optional<'a, T: 'static>(
    batch: &'a RecordBatch,
    name: &'static str,
    expected: &'static str,
) -> UploadResult<Option<&'a T>> {
    match column(batch, name) {
        None => Ok(None),
        // An all-null column of type Null (e.g. metadata absent from a whole shard) is "absent".
        Some(array) if array.data_type() == &DataType::Null => Ok(None),
        Some(array) => downcast(array, name, expected).map(Some),
    }
}

fn first_null(array: &dyn Array) -> Option<usize> {
    let nulls = array.logical_nulls()?;
    if nulls.null_count() == 0 {
        return None;
    }
    (0..array.len()).find(|&i| nulls.is_null(i))
}

/// The embedding column as one contiguous f32 slice, and the vector size.
fn vectors(batch: &RecordBatch) -> UploadResult<(Cow<'_, [f32]>, usize)> {
    const EXPECTED: &str = "fixed_size_list<float32 | float16>";
    let list: &FixedSizeListArray = required(batch, "embedding", EXPECTED)?;
    if let Some(row) = first_null(list) {
        return Err(UploadError::NullValue {
            column: "embedding",
            row,
        });
    }
    let dim = usize::try_from(list.value_length()).unwrap_or(0);
    // The child array may be longer than this (sliced) list: take only the rows in view.
    let start = list.value_offset(0).max(0) as usize;
    let len = list.len() * dim;
    let values = list.values().slice(start, len);
    if first_null(values.as_ref()).is_some() {
        let row = (0..list.len())
            .find(|&r| list.value(r).null_count() > 0)
            .unwrap_or(0);
        return Err(UploadError::NullValue {
            column: "embedding",
            row,
        });
    }
    let vectors = match values.data_type() {
        DataType::Float32 => {
            let values: &Float32Array = downcast(list.values().as_ref(), "embedding", EXPECTED)?;
            Cow::Borrowed(&values.values()[start..start + len])
        }
        DataType::Float16 => {
            let values: &Float16Array = downcast(values.as_ref(), "embedding", EXPECTED)?;
            let mut wide = vec![0f32; len];
            values.values().convert_to_f32_slice(&mut wide);
            Cow::Owned(wide)
        }
        other => {
            return Err(UploadError::ColumnType {
                column: "embedding",
                expected: EXPECTED,
                found: format!("fixed_size_list<{other}>"),
            })
        }
    };
    Ok((vectors, dim))
}

fn string_at(array: Option<&StringArray>, row: usize) -> Option<&str> {
    array.filter(|a| a.is_valid(row)).map(|a| a.value(row))
}

fn int_at(array: Option<&Int32Array>, row: usize) -> Option<i32> {
    array.filter(|a| a.is_valid(row)).map(|a| a.value(row))
}
