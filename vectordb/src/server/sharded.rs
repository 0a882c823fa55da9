//! What a custom-sharded (snapshot-loaded) collection needs of the server beyond the [`Sink`]
//! and [`QdrantExtras`] calls: shard keys placed on chosen peers, where each lives, who owns
//! each, and the collection's settings in the form a built shard's manifest records them. Writes,
//! counts and deletes in a key are the [`Sink`]'s requests naming it.
//!
//! [`Sink`]: crate::Sink
//! [`QdrantExtras`]: crate::QdrantExtras

use qdrant_client::qdrant::{self, shard_key, CreateShardKeyBuilder, CreateShardKeyRequestBuilder};

use super::QdrantServer;
use crate::error::{KeyConflict, UploadError, UploadResult};
use crate::shard_keys::{owner_metadata_key, KeyOwner};
use crate::shard_settings::ShardSettings;

/// Where one shard key's shard is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedShard {
    pub key: String,
    pub shard_id: u32,
    /// The peers holding a replica of it.
    pub peers: Vec<u64>,
    /// Points in the replica the server reported first (exact counts come from a
    /// [`CountRequest`](crate::CountRequest) naming the key).
    pub points: u64,
    /// Every replica is active and no shard transfer involves the shard: each replica holds
    /// the shard's points and serves reads.
    pub settled: bool,
}

/// A collection's settings as the server reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCollection {
    pub settings: ShardSettings,
    /// The collection was created with custom sharding (one shard per key).
    pub custom_sharding: bool,
}

fn key_name(key: Option<&qdrant::ShardKey>) -> Option<String> {
    match key?.key.as_ref()? {
        shard_key::Key::Keyword(k) => Some(k.clone()),
        shard_key::Key::Number(n) => Some(n.to_string()),
    }
}

impl QdrantServer {
    /// The server's version (`1.18.3`).
    pub fn server_version(&self) -> UploadResult<String> {
        let reply = self.retry("check the server's version", || self.client.health_check())?;
        Ok(reply.version)
    }

    /// The collection's settings and sharding, `None` when it does not exist.
    pub fn server_collection(&self, collection: &str) -> UploadResult<Option<ServerCollection>> {
        if !self.exists(collection)? {
            return Ok(None);
        }
        let response = self.retry("read the collection info", || {
            self.client.collection_info(collection)
        })?;
        let Some(info) = response.result else {
            return Ok(None);
        };
        let basic = super::info_from_grpc(info.clone());
        let config = info.config.unwrap_or_default();
        let index = super::collection::index_from_grpc(&config);
        let params = config.params.unwrap_or_default();
        #[allow(deprecated)] // the field `create` sets (VectorParamsBuilder::on_disk)
        let on_disk = match params.vectors_config.and_then(|v| v.config) {
            Some(qdrant::vectors_config::Config::Params(p)) => p.on_disk.unwrap_or(false),
            _ => false,
        };
        let int8 = matches!(
            config.quantization_config.and_then(|q| q.quantization),
            Some(qdrant::quantization_config::Quantization::Scalar(_))
        );
        let mut payload_indexes: Vec<(String, String)> = info
            .payload_schema
            .iter()
            .map(|(field, schema)| {
                let kind = match qdrant::PayloadSchemaType::try_from(schema.data_type) {
                    Ok(qdrant::PayloadSchemaType::Integer) => "integer",
                    Ok(qdrant::PayloadSchemaType::Keyword) => "keyword",
                    _ => "other",
                };
                (field.clone(), kind.to_owned())
            })
            .collect();
        payload_indexes.sort();
        Ok(Some(ServerCollection {
            settings: ShardSettings {
                vector_size: basic.vector_size,
                distance: basic
                    .distance
                    .map_or_else(|| "other".to_owned(), |d| d.to_string()),
                hnsw_m: index.hnsw.m,
                hnsw_ef_construct: index.hnsw.ef_construct,
                indexing_threshold_kb: index.indexing_threshold_kb,
                on_disk_vectors: on_disk,
                int8_quantization: int8,
                payload_indexes,
            },
            custom_sharding: params.sharding_method == Some(qdrant::ShardingMethod::Custom as i32),
        }))
    }

    /// Every shard key of the collection with its shard and the peers holding it.
    pub fn keyed_shards(&self, collection: &str) -> UploadResult<Vec<KeyedShard>> {
        let info = self.retry("read the collection's cluster info", || {
            self.client.collection_cluster_info(collection)
        })?;
        let mut out: Vec<KeyedShard> = Vec::new();
        let moving: Vec<u32> = info.shard_transfers.iter().map(|t| t.shard_id).collect();
        let mut add = |key: Option<String>, shard_id: u32, peer: u64, points: u64, state: i32| {
            let Some(key) = key else { return };
            let active = state == qdrant::ReplicaState::Active as i32;
            match out.iter_mut().find(|s| s.shard_id == shard_id) {
                Some(s) => {
                    s.peers.push(peer);
                    s.settled &= active;
                }
                None => out.push(KeyedShard {
                    key,
                    shard_id,
                    peers: vec![peer],
                    points,
                    settled: active && !moving.contains(&shard_id),
                }),
            }
        };
        for s in &info.local_shards {
            add(
                key_name(s.shard_key.as_ref()),
                s.shard_id,
                info.peer_id,
                s.points_count,
                s.state,
            );
        }
        for s in &info.remote_shards {
            add(
                key_name(s.shard_key.as_ref()),
                s.shard_id,
                s.peer_id,
                0,
                s.state,
            );
        }
        out.sort_by_key(|s| s.shard_id);
        Ok(out)
    }

    /// Creates shard key `key` with one shard, its replicas on the peers `placement` when
    /// given (else where the server chooses). The server gives a key min(replication factor,
    /// placement's peers) replicas, so a replicated key's placement names a peer per replica.
    /// Creating a key that exists is refused by the server: look first.
    pub fn create_shard_key(
        &self,
        collection: &str,
        key: &str,
        placement: &[u64],
        replication_factor: Option<u32>,
    ) -> UploadResult<()> {
        self.retry("create a shard key", || {
            let mut request = CreateShardKeyBuilder::default()
                .shard_key(key.to_owned())
                .shards_number(1);
            if !placement.is_empty() {
                request = request.placement(placement.to_vec());
            }
            if let Some(n) = replication_factor {
                request = request.replication_factor(n);
            }
            self.client
                .create_shard_key(CreateShardKeyRequestBuilder::new(collection).request(request))
        })?;
        Ok(())
    }

    /// The owner of each shard key the collection records (keys made by a load or upload of
    /// this embedfleet; legacy `b<batch>` keys have none).
    pub fn key_owners(
        &self,
        collection: &str,
    ) -> UploadResult<std::collections::BTreeMap<String, KeyOwner>> {
        let metadata = self.collection_metadata(collection)?;
        let prefix = owner_metadata_key("");
        Ok(metadata
            .iter()
            .filter_map(|(name, value)| {
                let key = name.strip_prefix(&prefix)?;
                let Some(qdrant::value::Kind::StringValue(json)) = value.kind.as_ref() else {
                    return None;
                };
                Some((key.to_owned(), serde_json::from_str(json).ok()?))
            })
            .collect())
    }

    /// Records `owner` as the owner of shard key `key`, before the key is made or written.
    /// Refused when the collection records another owner (another run, or this run's files
    /// seen from another directory: a copy), unless `replace`. A legacy owner (no run id) is
    /// not recorded.
    pub fn claim_shard_key(
        &self,
        collection: &str,
        key: &str,
        owner: &KeyOwner,
        replace: bool,
    ) -> UploadResult<()> {
        if owner.run.is_empty() {
            return Ok(());
        }
        let owners = self.key_owners(collection)?;
        match owners.get(key) {
            Some(found) if found == owner => return Ok(()),
            Some(found) if !replace && (found.run != owner.run || found.dir != owner.dir) => {
                return Err(UploadError::KeyOfAnotherRun(Box::new(KeyConflict {
                    collection: collection.to_owned(),
                    key: key.to_owned(),
                    owner_run: found.run.clone(),
                    owner_dir: found.dir.clone(),
                    run: owner.run.clone(),
                })));
            }
            _ => {}
        }
        let mut request = qdrant::UpdateCollectionBuilder::new(collection).build();
        request.metadata.insert(
            owner_metadata_key(key),
            super::points::string_value(&serde_json::to_string(owner).expect("plain data")),
        );
        self.retry("record a shard key's owner", || {
            self.client.update_collection(request.clone())
        })?;
        Ok(())
    }
}
