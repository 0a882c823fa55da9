//! Points to and from gRPC: the upsert request of a batch (one vector copy per point), the
//! query of a search, the filter, and a search hit back.

use std::collections::HashMap;

use qdrant_client::qdrant::{
    self, point_id::PointIdOptions, value::Kind, vector, vectors::VectorsOptions, Condition,
    DenseVector, Filter, PointId, QueryPointsBuilder, SearchParamsBuilder, UpsertPointsBuilder,
};
use uuid::Uuid;

use super::QdrantServer;
use crate::error::UploadResult;
use crate::points::{
    PointsBatch, PAYLOAD_N_CHARS, PAYLOAD_N_TOKENS, PAYLOAD_PAPER_ID, PAYLOAD_SOURCE, PAYLOAD_YEAR,
};
use crate::request::{Hit, PayloadFilter, SearchOptions, UpsertRequest};
use crate::spec::check_vector_size;

impl QdrantServer {
    /// Upserts the request's points, into its shard key when it names one; refuses a batch of
    /// the wrong vector size before sending it.
    pub(super) fn upsert_points(&self, request: UpsertRequest<'_>) -> UploadResult<()> {
        let UpsertRequest {
            collection,
            points,
            shard_key,
        } = request;
        check_vector_size(collection, self.collection_size(collection)?, points.dim())?;
        if points.is_empty() {
            return Ok(());
        }
        // Rebuilt per attempt from the borrowed batch: nothing is cloned on the happy path.
        self.retry("upsert points", || {
            let mut request = UpsertPointsBuilder::new(collection, build_point_structs(points))
                .wait(self.config.wait);
            if let Some(key) = shard_key {
                request = request.shard_key_selector(key.to_owned());
            }
            self.client.upsert_points(request)
        })?;
        Ok(())
    }
}

/// The gRPC points of `points`: one `Vec<f32>` copy (a memcpy) per vector, the id as a UUID
/// string, five payload entries. This is the whole client-side cost of a batch.
pub fn build_point_structs(points: &PointsBatch<'_>) -> Vec<qdrant::PointStruct> {
    let mut out = Vec::with_capacity(points.len());
    let mut id_buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    for p in points.iter() {
        let id = p.id().hyphenated().encode_lower(&mut id_buf).to_owned();
        let mut payload = HashMap::with_capacity(5);
        payload.insert(PAYLOAD_PAPER_ID.to_owned(), string_value(p.paper_id));
        if let Some(year) = p.year {
            payload.insert(PAYLOAD_YEAR.to_owned(), int_value(year));
        }
        if let Some(source) = p.source {
            payload.insert(PAYLOAD_SOURCE.to_owned(), string_value(source));
        }
        if let Some(n) = p.n_chars {
            payload.insert(PAYLOAD_N_CHARS.to_owned(), int_value(i64::from(n)));
        }
        if let Some(n) = p.n_tokens {
            payload.insert(PAYLOAD_N_TOKENS.to_owned(), int_value(i64::from(n)));
        }
        out.push(qdrant::PointStruct {
            id: Some(PointId {
                point_id_options: Some(PointIdOptions::Uuid(id)),
            }),
            payload,
            vectors: Some(qdrant::Vectors {
                vectors_options: Some(VectorsOptions::Vector(qdrant::Vector {
                    vector: Some(vector::Vector::Dense(DenseVector {
                        data: p.vector.to_vec(),
                    })),
                    ..Default::default()
                })),
            }),
        });
    }
    out
}

pub(super) fn string_value(s: &str) -> qdrant::Value {
    qdrant::Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

fn int_value(i: i64) -> qdrant::Value {
    qdrant::Value {
        kind: Some(Kind::IntegerValue(i)),
    }
}

/// The query of one search, as `options` say.
pub(super) fn query_points(
    collection: &str,
    vector: &[f32],
    options: &SearchOptions,
) -> QueryPointsBuilder {
    let mut params = SearchParamsBuilder::default().exact(options.exact);
    if let Some(ef) = options.hnsw_ef {
        params = params.hnsw_ef(ef);
    }
    let mut request = QueryPointsBuilder::new(collection)
        .query(vector.to_vec())
        .limit(options.k as u64)
        .with_payload(true)
        .params(params);
    if let Some(f) = &options.filter {
        request = request.filter(grpc_filter(f));
    }
    request
}

pub(super) fn grpc_filter(f: &PayloadFilter) -> Filter {
    let mut conditions = Vec::new();
    if f.year_min.is_some() || f.year_max.is_some() {
        let range = qdrant::Range {
            gte: f.year_min.map(|y| y as f64),
            lte: f.year_max.map(|y| y as f64),
            ..Default::default()
        };
        conditions.push(Condition::range(PAYLOAD_YEAR, range));
    }
    match f.sources.as_slice() {
        [] => {}
        [source] => conditions.push(Condition::matches(PAYLOAD_SOURCE, source.clone())),
        any => conditions.push(Condition::matches(PAYLOAD_SOURCE, any.to_vec())),
    }
    Filter::must(conditions)
}

pub(super) fn hit_from_grpc(point: qdrant::ScoredPoint) -> Hit {
    let id = match point.id.and_then(|i| i.point_id_options) {
        Some(PointIdOptions::Uuid(s)) => Uuid::parse_str(&s).unwrap_or_default(),
        _ => Uuid::nil(),
    };
    let string = |key: &str| match point.payload.get(key).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    };
    let int = |key: &str| match point.payload.get(key).and_then(|v| v.kind.as_ref()) {
        Some(Kind::IntegerValue(i)) => Some(*i),
        Some(Kind::DoubleValue(d)) => Some(*d as i64),
        _ => None,
    };
    Hit {
        id,
        score: point.score,
        paper_id: string(PAYLOAD_PAPER_ID),
        year: int(PAYLOAD_YEAR),
        source: string(PAYLOAD_SOURCE),
        n_chars: int(PAYLOAD_N_CHARS),
        n_tokens: int(PAYLOAD_N_TOKENS),
    }
}
