//! The snapshot cluster suite: a real three-peer Qdrant cluster on loopback
//! (`.ci/qdrant/qdrant-cluster.sh start`, which `.ci/run` starts); without one these say they
//! are skipped.

use crate::snapshot::small_run;
use crate::snapshot_server::{query_vectors, rows_of, top_ids, upload};
use crate::util::TestDir;
use embedfleet_vectordb::{
    CountRequest, QdrantServer, QueryRequest, SearchOptions, ServerConfig, Sink,
};

// ---- The cluster suite: a real three-peer cluster on loopback (.ci/qdrant/qdrant-cluster.sh) ----

/// The peers of the three-peer cluster the cluster tests run against (gRPC and REST URLs),
/// from the environment `qdrant-cluster.sh start` prints; `None` without it, `test` said to be
/// skipped.
pub(crate) fn cluster_peers(test: &str) -> Option<(Vec<String>, Vec<String>)> {
    let list = |var: &str| -> Option<Vec<String>> {
        let urls = crate::util::qdrant_env(&format!("the cluster test `{test}`"), var)?;
        Some(urls.split(',').map(str::to_owned).collect())
    };
    Some((
        list("QDRANT_PEER_GRPC_URLS")?,
        list("QDRANT_PEER_REST_URLS")?,
    ))
}

/// Runs `QDRANT_PEER_KILL_CMD` or `QDRANT_PEER_START_CMD` (the cluster script's `kill-peer`,
/// `start-peer`) for peer `peer` (1-based).
fn peer_cmd(var: &str, peer: usize) {
    let cmd = std::env::var(var)
        .unwrap_or_else(|_| panic!("the cluster tests need {var} (docs/testing.md)"));
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cmd} {peer}"))
        .status()
        .unwrap();
    assert!(status.success(), "{cmd} {peer}");
}

#[test]
fn cluster_groups_go_round_three_peers_and_survive_one_killed_under_replication_two() {
    let Some((grpc, rest)) = cluster_peers(
        "cluster_groups_go_round_three_peers_and_survive_one_killed_under_replication_two",
    ) else {
        return;
    };
    assert!(grpc.len() >= 3, "{grpc:?}");
    let sink = QdrantServer::connect(ServerConfig::new(grpc[0].clone())).unwrap();
    let name = format!("embedfleet-cluster-{}", std::process::id());
    let _ = sink.delete_collection(&name);
    let t = TestDir::new();
    small_run(&t, "run", 120, 20);
    let run = t.join("run");
    let rows = rows_of(&run);
    let err = upload(
        &t,
        &grpc[0],
        &rest[0],
        &name,
        &[
            "--mode",
            "snapshot",
            "--group-count",
            "6",
            "--replication-factor",
            "2",
        ],
        0,
    );
    assert!(err.contains("6 batches in 6 groups of 1"), "{err}");
    // Each group's key: two replicas on two peers, the first replicas going round the peers.
    let placed = sink.keyed_shards(&name).unwrap();
    assert_eq!(placed.len(), 6);
    let mut per_peer = std::collections::BTreeMap::<u64, usize>::new();
    for s in &placed {
        let mut peers = s.peers.clone();
        peers.sort();
        peers.dedup();
        assert_eq!(peers.len(), 2, "{s:?}");
        for p in peers {
            *per_peer.entry(p).or_default() += 1;
        }
    }
    assert_eq!(per_peer.len(), 3, "every peer holds replicas: {per_peer:?}");
    assert!(per_peer.values().all(|&n| n == 4), "{per_peer:?}");
    // Every peer answers the exact count from its replicas (or forwards).
    for url in &grpc {
        let peer = QdrantServer::connect(ServerConfig::new(url.clone())).unwrap();
        assert_eq!(peer.count(CountRequest::new(&name)).unwrap(), rows, "{url}");
    }
    let queries = query_vectors(&run, 20);
    let before = top_ids(&sink, &name, &queries, 10);

    // Peer 3 dies: counts stay exact and searches answer through peer 1.
    peer_cmd("QDRANT_PEER_KILL_CMD", 3);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows);
        for s in &placed {
            let n = sink
                .count(CountRequest::new(&name).shard_key(Some(&s.key)))
                .unwrap();
            assert!(n > 0, "{}", s.key);
        }
        assert_eq!(top_ids(&sink, &name, &queries, 10), before);
        for v in &queries {
            assert!(!sink
                .query(QueryRequest::one(&name, v, SearchOptions::new(5)))
                .unwrap()
                .remove(0)
                .is_empty());
        }
    }));
    peer_cmd("QDRANT_PEER_START_CMD", 3);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    sink.delete_collection(&name).unwrap();
}
