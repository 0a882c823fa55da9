//! Upload progress belongs to the collection, not to the path that reaches it: a run directory
//! moved or copied after release 1, then updated to release 2, ends with exactly release 2's
//! papers in its collection (the withdrawn ones deleted), and `status` has no line left for
//! the old path.

use crate::update::{make_releases, Shape};
use crate::util::TestDir;
use embedfleet_vectordb::{point_id, CountRequest, QdrantEdge, QdrantServer, ServerConfig, Sink};
use std::collections::BTreeSet;

const SHAPE: Shape = Shape {
    release_1: 100,
    withdrawn: 5,
    changed: 3,
    new: 10,
};

/// Plans release 2 into `run` and runs it; checks the collection holds exactly release 2.
fn update_and_check(t: &TestDir, run: &str, release_2: &BTreeSet<String>, withdrawn: &[String]) {
    let out = t.run(&["plan", "--update", "r2.jsonl", "--run-dir", run], 0);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("5 withdrawn"), "{said}");
    let (_, stderr) = t.run_corpus(run, "r2.jsonl", 50, &[]);
    let edge = QdrantEdge::open(t.join(run).join("qdrant")).unwrap();
    let ids = |list: &[String]| list.iter().map(|p| point_id(p)).collect::<Vec<_>>();
    let all: Vec<String> = release_2.iter().cloned().collect();
    assert_eq!(
        edge.count(CountRequest::new("papers")).unwrap(),
        release_2.len() as u64,
        "{run}: exactly release 2"
    );
    assert_eq!(
        edge.count(CountRequest::new("papers").ids(&ids(&all)))
            .unwrap(),
        release_2.len() as u64
    );
    assert_eq!(
        edge.count(CountRequest::new("papers").ids(&ids(withdrawn)))
            .unwrap(),
        0,
        "{run}: the withdrawn papers are deleted"
    );
    drop(edge);
    assert!(
        stderr.contains("its progress carries over"),
        "the collection is recognised by its marker: {stderr}"
    );
    let status = t.status(run);
    let keys: Vec<&String> = status["uploads_by_collection"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(keys.len(), 1, "one line, for the path used now: {keys:?}");
    assert!(keys[0].contains(run), "{keys:?}");
}

#[test]
fn a_moved_and_a_copied_run_directory_update_their_collection_exactly() {
    let t = TestDir::new();
    let (withdrawn, _changed, new) = make_releases(&t, &SHAPE);
    t.run_corpus("run", "r1.jsonl", 50, &[]);
    let release_2: BTreeSet<String> = (0..SHAPE.release_1)
        .map(|i| format!("W{i:05}"))
        .filter(|id| !withdrawn.contains(id))
        .chain(new.iter().cloned())
        .collect();
    let copy = std::process::Command::new("cp")
        .args(["-a", "run", "run-copy"])
        .current_dir(t.path())
        .status()
        .unwrap();
    assert!(copy.success());
    std::fs::rename(t.join("run"), t.join("run-moved")).unwrap();
    update_and_check(&t, "run-moved", &release_2, &withdrawn);
    update_and_check(&t, "run-copy", &release_2, &withdrawn);
}

/// The same on a three-peer Qdrant cluster: release 1 uploaded through peer 1's URL, release 2
/// through peer 2's. The collection is one, whichever peer is asked: its marker carries the
/// progress over, and the update deletes what release 2 withdrew.
#[test]
fn cluster_an_update_uploaded_through_another_peers_url_ends_exact() {
    let Some((grpc, _)) = crate::snapshot_cluster::cluster_peers(
        "cluster_an_update_uploaded_through_another_peers_url_ends_exact",
    ) else {
        return;
    };
    assert!(grpc.len() >= 2, "{grpc:?}");
    let name = format!("embedfleet-update-peers-{}", std::process::id());
    let peer = |i: usize| QdrantServer::connect(ServerConfig::new(grpc[i].clone())).unwrap();
    let _ = peer(0).delete_collection(&name);
    let t = TestDir::new();
    let (withdrawn, _changed, new) = make_releases(&t, &SHAPE);
    let release_2: Vec<String> = (0..SHAPE.release_1)
        .map(|i| format!("W{i:05}"))
        .filter(|id| !withdrawn.contains(id))
        .chain(new.iter().cloned())
        .collect();
    let upload = |url: &str| -> String {
        let out = t.run(
            &[
                "upload",
                "--run-dir",
                "run",
                "--qdrant",
                url,
                "--collection",
                &name,
            ],
            0,
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    t.run_corpus("run", "r1.jsonl", 50, &[]);
    upload(&grpc[0]);
    assert_eq!(
        peer(0).count(CountRequest::new(&name)).unwrap(),
        SHAPE.release_1 as u64
    );
    t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    t.run_corpus("run", "r2.jsonl", 50, &[]);
    let said = upload(&grpc[1]);
    assert!(said.contains("its progress carries over"), "{said}");
    let ids = |list: &[String]| list.iter().map(|p| point_id(p)).collect::<Vec<_>>();
    for i in 0..grpc.len() {
        let p = peer(i);
        assert_eq!(
            p.count(CountRequest::new(&name)).unwrap(),
            release_2.len() as u64,
            "peer {}: exactly release 2",
            i + 1
        );
        assert_eq!(
            p.count(CountRequest::new(&name).ids(&ids(&release_2)))
                .unwrap(),
            release_2.len() as u64
        );
        assert_eq!(
            p.count(CountRequest::new(&name).ids(&ids(&withdrawn)))
                .unwrap(),
            0,
            "the withdrawn papers are deleted"
        );
    }
    peer(0).delete_collection(&name).unwrap();
}
