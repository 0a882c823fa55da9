//! Upload progress belongs to the collection, not to the path that reaches it: a run directory
//! moved or copied after release 1, then updated to release 2, ends with exactly release 2's
//! papers in its collection (the withdrawn ones deleted), and `status` has no line left for
//! the old path.

use crate::update::{make_releases, Shape};
use crate::util::TestDir;
use embedfleet_upload::{point_id, CountRequest, QdrantEdge, Sink};
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
