//! A collection as a table: its columns, the vector type chosen for the run's vectors, what an
//! existing table holds, and embedfleet's comment on it (distance and identity marker).
//!
//! ```sql
//! CREATE TABLE "papers" (id uuid PRIMARY KEY, paper_id text NOT NULL,
//!     embedding vector(1024) NOT NULL, year integer, source text,
//!     n_chars integer, n_tokens integer);
//! CREATE INDEX ON "papers" (year); CREATE INDEX ON "papers" (source);
//! COMMENT ON TABLE "papers" IS 'embedfleet {"distance":"Cosine","marker":"…"}';
//! ```
//!
//! The comment goes with the table: dropped with it, kept by `pg_dump`. A table made again has
//! none, so the upload sees another collection and sends every row again.

use embedfleet_core::shardfile::VectorDtype;
use postgres::Client;
use serde::{Deserialize, Serialize};

use super::sql::{pg_err, quoted};
use crate::error::{UploadError, UploadResult};
use crate::spec::{CollectionSpec, Distance, PayloadIndexKind};

/// pgvector indexes (HNSW, IVFFlat) take at most this many dimensions of `vector`.
pub const MAX_VECTOR_DIMS: usize = 2000;
/// ... and of `halfvec`.
pub const MAX_HALFVEC_DIMS: usize = 4000;
/// PostgreSQL cuts longer identifiers silently (NAMEDATALEN - 1).
const MAX_NAME: usize = 63;

/// The columns, in COPY order.
pub(super) const COLUMNS: &str = "id, paper_id, embedding, year, source, n_chars, n_tokens";

/// How a table stores its vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Storage {
    /// `vector`: f32.
    Vector,
    /// `halfvec`: f16, half the size, indexable up to 4,000 dimensions.
    Halfvec,
}

impl Storage {
    /// The SQL type name.
    pub fn sql(self) -> &'static str {
        match self {
            Self::Vector => "vector",
            Self::Halfvec => "halfvec",
        }
    }

    /// The operator class of an index for `distance`.
    pub(super) fn opclass(self, distance: Distance) -> String {
        let op = match distance {
            Distance::Cosine => "cosine",
            Distance::Dot => "ip",
        };
        format!("{}_{op}_ops", self.sql())
    }
}

/// A table's vector column and distance, as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    pub dim: usize,
    pub storage: Storage,
    /// `None`: the table was not made by embedfleet (no comment saying its distance).
    pub distance: Option<Distance>,
}

/// The type the run's vectors go in: f16 runs in `halfvec`; f32 runs in `vector`, or in
/// `halfvec` past the 2,000 dimensions an index takes on `vector` (with a note saying so).
/// Past 4,000 nothing is indexable: refused, with the ways out.
pub fn storage_for(spec: &CollectionSpec) -> UploadResult<(Storage, Option<String>)> {
    let dim = spec.vector_size;
    if dim > MAX_HALFVEC_DIMS {
        return Err(UploadError::PgTooManyDims {
            collection: spec.name.clone(),
            dim,
        });
    }
    Ok(match spec.vector_dtype {
        VectorDtype::F16 => (Storage::Halfvec, None),
        VectorDtype::F32 if dim > MAX_VECTOR_DIMS => (
            Storage::Halfvec,
            Some(format!(
                "note: {dim}-d vectors are past the {MAX_VECTOR_DIMS} dimensions pgvector indexes on `vector`: `{}` stores them as `halfvec` (f16: the index is half the size, recall changes little; every vector is rounded to f16)",
                spec.name
            )),
        ),
        VectorDtype::F32 => (Storage::Vector, None),
    })
}

/// Refuses names PostgreSQL would cut short (two collections could become one table).
pub(super) fn check_table_name(name: &str) -> UploadResult<()> {
    crate::spec::check_collection_name(name)?;
    if name.len() > MAX_NAME {
        return Err(UploadError::PgUrl {
            url: name.to_owned(),
            reason: format!("a table name has at most {MAX_NAME} bytes in PostgreSQL: give a shorter --collection"),
        });
    }
    Ok(())
}

/// embedfleet's comment on a table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Comment {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    distance: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marker: Option<String>,
}

const COMMENT_PREFIX: &str = "embedfleet ";

fn parse_comment(text: Option<&str>) -> Comment {
    text.and_then(|t| t.strip_prefix(COMMENT_PREFIX))
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default()
}

fn distance_name(d: Distance) -> String {
    d.to_string()
}

fn parse_distance(s: &str) -> Option<Distance> {
    match s {
        "Cosine" => Some(Distance::Cosine),
        "Dot" => Some(Distance::Dot),
        _ => None,
    }
}

/// What the table `name` holds: `None` when there is no such table, a shape with size 0 when
/// it has no vector column of pgvector's.
pub(super) fn shape(client: &mut Client, name: &str) -> UploadResult<Option<Shape>> {
    let rows = client
        .query(
            "SELECT format_type(a.atttypid, a.atttypmod), obj_description(c.oid, 'pg_class') \
             FROM pg_class c LEFT JOIN pg_attribute a \
               ON a.attrelid = c.oid AND a.attname = 'embedding' AND NOT a.attisdropped \
             WHERE c.oid = to_regclass($1)",
            &[&quoted(name)],
        )
        .map_err(pg_err("read the table's columns"))?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let ty: Option<String> = row.get(0);
    let comment = parse_comment(row.get::<_, Option<&str>>(1));
    let distance = comment.distance.as_deref().and_then(parse_distance);
    let parsed = ty.as_deref().and_then(|t| {
        let (kind, rest) = t.split_once('(')?;
        let dim = rest.strip_suffix(')')?.parse().ok()?;
        let storage = match kind {
            "vector" => Storage::Vector,
            "halfvec" => Storage::Halfvec,
            _ => return None,
        };
        Some((dim, storage))
    });
    let (dim, storage) = parsed.unwrap_or((0, Storage::Vector));
    Ok(Some(Shape {
        dim,
        storage,
        distance,
    }))
}

/// Creates the table of `spec` with `storage`, its B-tree indexes and its comment, in one
/// transaction. `Ok(false)` when another session made it first.
pub(super) fn create(
    client: &mut Client,
    spec: &CollectionSpec,
    storage: Storage,
) -> UploadResult<bool> {
    let table = quoted(&spec.name);
    let mut sql = format!(
        "CREATE TABLE {table} (id uuid PRIMARY KEY, paper_id text NOT NULL, \
         embedding {}({}) NOT NULL, year integer, source text, n_chars integer, n_tokens integer);\n",
        storage.sql(),
        spec.vector_size
    );
    for (field, kind) in &spec.payload_indexes {
        // Only the payload the table has columns for: year (integer) and source (keyword).
        let column = match (field.as_str(), kind) {
            ("year", PayloadIndexKind::Integer) => "year",
            ("source", PayloadIndexKind::Keyword) => "source",
            _ => continue,
        };
        sql.push_str(&format!("CREATE INDEX ON {table} ({column});\n"));
    }
    let comment = Comment {
        distance: Some(distance_name(spec.distance)),
        marker: None,
    };
    sql.push_str(&format!(
        "COMMENT ON TABLE {table} IS {};",
        literal(&format!("{COMMENT_PREFIX}{}", json(&comment)))
    ));
    let mut tx = client.transaction().map_err(pg_err("create the table"))?;
    match tx.batch_execute(&sql) {
        Ok(()) => {}
        // Another session created it between our look and our create: it is there.
        Err(e)
            if e.code()
                .is_some_and(|c| c.code() == "42P07" || c.code() == "23505") =>
        {
            return Ok(false)
        }
        Err(e) => return Err(pg_err("create the table")(e)),
    }
    tx.commit().map_err(pg_err("create the table"))?;
    Ok(true)
}

fn json(c: &Comment) -> String {
    serde_json::to_string(c).expect("a comment serialises. This is a bug.")
}

/// A SQL string literal of `s` (standard_conforming_strings: only `'` is doubled).
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The identity marker in the comment of `name`, `None` when the table has none (or is gone).
pub(super) fn marker(client: &mut Client, name: &str) -> UploadResult<Option<String>> {
    let rows = client
        .query(
            "SELECT obj_description(to_regclass($1), 'pg_class')",
            &[&quoted(name)],
        )
        .map_err(pg_err("read the table's comment"))?;
    let text: Option<String> = rows.first().and_then(|r| r.get(0));
    Ok(parse_comment(text.as_deref()).marker)
}

/// Stores `marker` in the comment of `name`, keeping its distance.
pub(super) fn set_marker(client: &mut Client, name: &str, marker: &str) -> UploadResult<()> {
    let rows = client
        .query(
            "SELECT obj_description(to_regclass($1), 'pg_class')",
            &[&quoted(name)],
        )
        .map_err(pg_err("read the table's comment"))?;
    let text: Option<String> = rows.first().and_then(|r| r.get(0));
    let mut comment = parse_comment(text.as_deref());
    comment.marker = Some(marker.to_owned());
    let sql = format!(
        "COMMENT ON TABLE {} IS {}",
        quoted(name),
        literal(&format!("{COMMENT_PREFIX}{}", json(&comment)))
    );
    client
        .batch_execute(&sql)
        .map_err(pg_err("store the table's marker"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dim: usize, dtype: VectorDtype) -> CollectionSpec {
        CollectionSpec {
            vector_dtype: dtype,
            ..CollectionSpec::new("papers", dim)
        }
    }

    #[test]
    fn vectors_go_to_vector_halfvec_past_2000_and_past_4000_are_refused() {
        let (s, note) = storage_for(&spec(1024, VectorDtype::F32)).unwrap();
        assert_eq!((s, note), (Storage::Vector, None));
        let (s, note) = storage_for(&spec(1024, VectorDtype::F16)).unwrap();
        assert_eq!((s, note), (Storage::Halfvec, None));
        let (s, note) = storage_for(&spec(2560, VectorDtype::F32)).unwrap();
        assert_eq!(s, Storage::Halfvec);
        assert!(note.unwrap().contains("halfvec"));
        let refused = storage_for(&spec(4096, VectorDtype::F32)).unwrap_err();
        let text = refused.to_string();
        assert!(text.contains("--dim"), "{text}");
        assert!(text.contains("binary"), "{text}");
    }

    #[test]
    fn the_comment_keeps_distance_and_marker_and_ignores_others() {
        let c = Comment {
            distance: Some("Dot".into()),
            marker: Some("m-1".into()),
        };
        let text = format!("{COMMENT_PREFIX}{}", json(&c));
        assert_eq!(parse_comment(Some(&text)), c);
        assert_eq!(
            parse_comment(Some("a table of someone else's")),
            Comment::default()
        );
        assert_eq!(literal("it's"), "'it''s'");
    }
}
