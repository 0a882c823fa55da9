//! Papers deleted from the run (`embedfleet delete`, run.db's tombstones) are not in the
//! published dataset, and the manifest and card count them; a folder published before the
//! delete is rewritten where it held them, with text too.

use crate::publish_common::publish;
use crate::publish_common::*;
use embedfleet_core::rundb::{RunDb, Tombstone};
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_publish::PublishOptions;

const PARTS: &[&[u64]] = &[&[700, 300], &[500]];

#[test]
fn deleted_papers_are_left_out_of_the_dataset_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("ds"));
    make_run(
        &run,
        &Spec {
            parts: PARTS,
            dtype: VectorDtype::F32,
        },
    );
    // 400 rows a file: 1,500 rows make 4 files.
    let options = PublishOptions {
        target_shard_bytes: 400 * ROW_BYTES,
        with_text: true,
        ..PublishOptions::new(&run, &out)
    };
    let before = publish(&options).unwrap();
    assert_eq!(before.rows, 1500);
    assert_eq!(manifest(&out)["counts"]["papers_deleted"], 0);

    // Paper 5 of batch 0 (the first file), 799 (batch 0's second part, the second file) and
    // the last of batch 1 (the last file).
    let deleted = [(0, 5), (0, 799), (1, 499)];
    let tombstones: Vec<Tombstone> = deleted
        .iter()
        .map(|&(b, i)| Tombstone {
            batch_id: b as i64 + 1,
            paper_id: paper(b, i).id,
        })
        .collect();
    RunDb::open(&run)
        .unwrap()
        .record_tombstones(&tombstones)
        .unwrap();

    let report = publish(&options).unwrap();
    assert_eq!(report.rows, 1497);
    let rows = rows(&out);
    assert_eq!(rows.len(), 1497);
    for t in &tombstones {
        assert!(
            rows.iter().all(|(id, _, _)| *id != t.paper_id),
            "{} published",
            t.paper_id
        );
    }
    // The others in order, each with its own text.
    let expected: Vec<(usize, u64)> = PARTS
        .iter()
        .enumerate()
        .flat_map(|(b, parts)| (0..parts.iter().sum::<u64>()).map(move |i| (b, i)))
        .filter(|bi| !deleted.contains(bi))
        .collect();
    assert_eq!(expected.len(), rows.len());
    for ((b, i), (id, _, text)) in expected.iter().zip(&rows) {
        let want = paper(*b, *i);
        assert_eq!(*id, want.id);
        assert_eq!(text.as_deref(), Some(want.text.as_str()), "{id}");
    }
    let manifest = manifest(&out);
    assert_eq!(manifest["counts"]["papers_deleted"], 3);
    assert_eq!(manifest["rows"], 1497);
    let card = card(&out);
    assert!(card.contains("| papers deleted (left out) | 3 |"), "{card}");
    sha256sum_check(&out);
}
