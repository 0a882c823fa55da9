//! Collections on the server: created from a spec (payload indexes first), their index
//! settings changed (bulk load, then restored), and their state read back.

use qdrant_client::qdrant::{
    self, vectors_config, CollectionStatus, CreateCollectionBuilder,
    CreateFieldIndexCollectionBuilder, FieldType, HnswConfigDiffBuilder,
    OptimizersConfigDiffBuilder, ScalarQuantizationBuilder, UpdateCollectionBuilder,
    VectorParamsBuilder,
};

use super::QdrantServer;
use crate::error::UploadResult;
use crate::spec::{
    CollectionInfo, CollectionSpec, Distance, HnswParams, PayloadIndexKind, QdrantIndex,
    VectorIndex,
};

impl QdrantServer {
    pub(super) fn set_indexing(
        &self,
        name: &str,
        hnsw: HnswParams,
        threshold_kb: u64,
    ) -> UploadResult<()> {
        self.retry("update the collection's index settings", || {
            self.client.update_collection(
                UpdateCollectionBuilder::new(name)
                    .hnsw_config(
                        HnswConfigDiffBuilder::default()
                            .m(hnsw.m)
                            .ef_construct(hnsw.ef_construct),
                    )
                    .optimizers_config(
                        OptimizersConfigDiffBuilder::default().indexing_threshold(threshold_kb),
                    ),
            )
        })?;
        Ok(())
    }

    pub(super) fn create(&self, spec: &CollectionSpec) -> UploadResult<()> {
        let qdrant = &spec.qdrant;
        let (hnsw, threshold) = if spec.bulk_load {
            (
                HnswParams {
                    m: 0,
                    ..qdrant.hnsw
                },
                0,
            )
        } else {
            (qdrant.hnsw, qdrant.indexing_threshold_kb)
        };
        let mut request = CreateCollectionBuilder::new(&spec.name)
            .vectors_config(
                VectorParamsBuilder::new(spec.vector_size as u64, grpc_distance(spec.distance))
                    .on_disk(qdrant.on_disk_vectors),
            )
            .hnsw_config(
                HnswConfigDiffBuilder::default()
                    .m(hnsw.m)
                    .ef_construct(hnsw.ef_construct),
            )
            .optimizers_config(
                OptimizersConfigDiffBuilder::default().indexing_threshold(threshold),
            );
        if qdrant.int8_quantization {
            request = request.quantization_config(
                ScalarQuantizationBuilder::default()
                    .r#type(qdrant::QuantizationType::Int8.into())
                    .quantile(0.99)
                    .always_ram(true),
            );
        }
        if qdrant.custom_sharding {
            // One shard per shard key (each key is one built shard); keys are made later.
            request = request
                .sharding_method(qdrant::ShardingMethod::Custom.into())
                .shard_number(1);
        } else if let Some(n) = qdrant.shard_number {
            request = request.shard_number(n);
        }
        if let Some(n) = qdrant.replication_factor {
            request = request.replication_factor(n);
        }
        let request = request.build();
        self.retry("create the collection", || {
            self.client.create_collection(request.clone())
        })?;
        Ok(())
    }

    pub(super) fn create_payload_indexes(&self, spec: &CollectionSpec) -> UploadResult<()> {
        for (field, kind) in &spec.payload_indexes {
            let field_type = match kind {
                PayloadIndexKind::Integer => FieldType::Integer,
                PayloadIndexKind::Keyword => FieldType::Keyword,
            };
            self.retry("create a payload index", || {
                self.client.create_field_index(
                    CreateFieldIndexCollectionBuilder::new(&spec.name, field, field_type)
                        .wait(true),
                )
            })?;
        }
        Ok(())
    }
}

fn grpc_distance(d: Distance) -> qdrant::Distance {
    match d {
        Distance::Cosine => qdrant::Distance::Cosine,
        Distance::Dot => qdrant::Distance::Dot,
    }
}

pub(super) fn info_from_grpc(info: qdrant::CollectionInfo) -> CollectionInfo {
    let config = info.config.unwrap_or_default();
    let index = index_from_grpc(&config);
    let params = config
        .params
        .and_then(|p| p.vectors_config)
        .and_then(|v| v.config);
    let (vector_size, distance) = match params {
        Some(vectors_config::Config::Params(p)) => (
            p.size as usize,
            match qdrant::Distance::try_from(p.distance) {
                Ok(qdrant::Distance::Cosine) => Some(Distance::Cosine),
                Ok(qdrant::Distance::Dot) => Some(Distance::Dot),
                _ => None,
            },
        ),
        _ => (0, None),
    };
    let queue_empty = info.update_queue.is_none_or(|q| q.length == 0);
    CollectionInfo {
        vector_size,
        distance,
        points: info.points_count.unwrap_or(0),
        indexed_vectors: info.indexed_vectors_count.unwrap_or(0),
        green: info.status == CollectionStatus::Green as i32 && queue_empty,
        red: info.status == CollectionStatus::Red as i32,
        index: (index.hnsw.m > 0).then_some(VectorIndex::Hnsw(index.hnsw)),
        qdrant: Some(index),
    }
}

/// The collection's current HNSW parameters and indexing threshold.
pub(super) fn index_from_grpc(config: &qdrant::CollectionConfig) -> QdrantIndex {
    let hnsw = config.hnsw_config.as_ref();
    QdrantIndex {
        hnsw: HnswParams {
            m: hnsw.and_then(|h| h.m).unwrap_or(0),
            ef_construct: hnsw.and_then(|h| h.ef_construct).unwrap_or(0),
        },
        indexing_threshold_kb: config
            .optimizer_config
            .as_ref()
            .and_then(|o| o.indexing_threshold)
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;

    #[test]
    fn a_red_collection_is_told_from_a_busy_one() {
        let with = |status: CollectionStatus| {
            info_from_grpc(qdrant::CollectionInfo {
                status: status as i32,
                ..Default::default()
            })
        };
        let red = with(CollectionStatus::Red);
        assert!(red.red && !red.green);
        let yellow = with(CollectionStatus::Yellow);
        assert!(!yellow.red && !yellow.green, "still optimizing: wait");
        assert!(with(CollectionStatus::Green).green);
    }
}
