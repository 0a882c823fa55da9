//! The collection settings a built shard is made with. The server checks none of them when it
//! recovers a shard snapshot (a wrong vector size gives broken search, other HNSW or
//! quantization settings a silent full rebuild), so embedfleet checks them: the manifest
//! records them and `upload --mode snapshot` refuses a snapshot whose settings differ from the
//! collection's.

use embedfleet_core::pin::{Difference, Field, Pinned};
use serde::{Deserialize, Serialize};

use crate::spec::{CollectionSpec, Distance, HnswParams, PayloadIndexKind, QdrantSpec};

/// What of a [`CollectionSpec`] decides a built shard's files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSettings {
    pub vector_size: usize,
    /// `Cosine` or `Dot`.
    pub distance: String,
    pub hnsw_m: u64,
    pub hnsw_ef_construct: u64,
    pub indexing_threshold_kb: u64,
    pub on_disk_vectors: bool,
    pub int8_quantization: bool,
    /// `(field, "integer" | "keyword")`, in the spec's order.
    pub payload_indexes: Vec<(String, String)>,
}

impl ShardSettings {
    /// The settings of a collection made from `spec` (its final ones: bulk-load mode is a
    /// loading state, not a setting).
    pub fn of(spec: &CollectionSpec) -> Self {
        Self {
            vector_size: spec.vector_size,
            distance: spec.distance.to_string(),
            hnsw_m: spec.qdrant.hnsw.m,
            hnsw_ef_construct: spec.qdrant.hnsw.ef_construct,
            indexing_threshold_kb: spec.qdrant.indexing_threshold_kb,
            on_disk_vectors: spec.qdrant.on_disk_vectors,
            int8_quantization: spec.qdrant.int8_quantization,
            payload_indexes: spec
                .payload_indexes
                .iter()
                .map(|(field, kind)| (field.clone(), kind_name(*kind).to_owned()))
                .collect(),
        }
    }

    /// The distance as the spec's type, `None` for one embedfleet does not create.
    pub fn distance(&self) -> Option<Distance> {
        match self.distance.as_str() {
            "Cosine" => Some(Distance::Cosine),
            "Dot" => Some(Distance::Dot),
            _ => None,
        }
    }

    /// What differs between these settings (asked for now) and those something was `made`
    /// with (a built shard, a collection, the run's pin): `name: the run's <made>, here
    /// <asked>`, one per setting (empty when none does). The order of payload indexes does
    /// not matter.
    pub fn differences_from(&self, made: &ShardSettings) -> Vec<Difference> {
        made.differences(self)
    }
}

impl Pinned for ShardSettings {
    fn fields(&self) -> Vec<Field> {
        let mut indexes: Vec<String> = self
            .payload_indexes
            .iter()
            .map(|(f, k)| format!("{f}:{k}"))
            .collect();
        indexes.sort();
        vec![
            Field::new("vector size", self.vector_size),
            Field::new("distance", &self.distance),
            Field::new("hnsw m", self.hnsw_m),
            Field::new("hnsw ef_construct", self.hnsw_ef_construct),
            Field::new("indexing threshold (KB)", self.indexing_threshold_kb),
            Field::new("vectors on disk", self.on_disk_vectors),
            Field::new("int8 quantization", self.int8_quantization),
            Field::new("payload indexes", indexes.join(",")),
        ]
    }
}

impl ShardSettings {
    /// `spec` with these settings (its name and vector size kept).
    pub fn apply(&self, spec: &CollectionSpec) -> CollectionSpec {
        CollectionSpec {
            distance: self.distance().unwrap_or(spec.distance),
            payload_indexes: self
                .payload_indexes
                .iter()
                .filter_map(|(f, k)| {
                    let kind = match k.as_str() {
                        "integer" => PayloadIndexKind::Integer,
                        "keyword" => PayloadIndexKind::Keyword,
                        _ => return None,
                    };
                    Some((f.clone(), kind))
                })
                .collect(),
            qdrant: QdrantSpec {
                hnsw: HnswParams {
                    m: self.hnsw_m,
                    ef_construct: self.hnsw_ef_construct,
                },
                indexing_threshold_kb: self.indexing_threshold_kb,
                on_disk_vectors: self.on_disk_vectors,
                int8_quantization: self.int8_quantization,
                ..spec.qdrant.clone()
            },
            ..spec.clone()
        }
    }
}

fn kind_name(kind: PayloadIndexKind) -> &'static str {
    match kind {
        PayloadIndexKind::Integer => "integer",
        PayloadIndexKind::Keyword => "keyword",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_each_setting_that_differs_and_ignore_index_order() {
        let spec = CollectionSpec::new("papers", 2560);
        let ours = ShardSettings::of(&spec);
        assert!(ours.differences_from(&ours.clone()).is_empty());
        let mut reordered = ours.clone();
        reordered.payload_indexes.reverse();
        assert!(ours.differences_from(&reordered).is_empty());

        let mut theirs = ours.clone();
        theirs.vector_size = 1024;
        theirs.hnsw_m = 32;
        theirs.int8_quantization = true;
        let diff: Vec<String> = ours
            .differences_from(&theirs)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            diff,
            [
                "vector size: the run's 1024, here 2560",
                "hnsw m: the run's 32, here 16",
                "int8 quantization: the run's true, here false"
            ]
        );
    }

    #[test]
    fn settings_apply_back_to_a_spec() {
        let mut spec = CollectionSpec::new("papers", 64);
        spec.qdrant.hnsw.m = 32;
        spec.qdrant.int8_quantization = true;
        let settings = ShardSettings::of(&spec);
        let back = settings.apply(&CollectionSpec::new("papers", 64));
        assert_eq!(ShardSettings::of(&back), settings);
    }

    #[test]
    fn bulk_load_is_not_a_setting() {
        let spec = CollectionSpec::new("papers", 8);
        let bulk = CollectionSpec {
            bulk_load: true,
            ..spec.clone()
        };
        assert_eq!(ShardSettings::of(&spec), ShardSettings::of(&bulk));
    }
}
