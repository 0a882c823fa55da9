//! A run with batches not embedded is refused, naming them; with `allow_partial` it is
//! published and the card and the manifest say exactly what is missing.

use crate::publish_common::publish;
use crate::publish_common::*;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_publish::{staging_dir, MissingBatch, PublishError, PublishOptions};

#[test]
fn a_partial_run_is_refused_unless_allowed_and_then_the_card_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("ds"));
    make_run(
        &run,
        &Spec {
            parts: &[&[30], &[20], &[25]],
            dtype: VectorDtype::F32,
        },
    );
    // Batch 2 never ran: planned, and no shards.
    let db = RunDb::open(&run).unwrap();
    db.conn()
        .execute_batch(
            "UPDATE batches SET state = 'planned' WHERE id = 2;
             DELETE FROM shards WHERE batch_id = 2;",
        )
        .unwrap();
    drop(db);

    let e = publish(&PublishOptions::new(&run, &out)).unwrap_err();
    let PublishError::Partial { missing } = &e else {
        panic!("not a partial refusal: {e}");
    };
    let want = MissingBatch {
        id: 2,
        state: "planned".into(),
        papers: 20,
        missing: 20,
    };
    assert_eq!(missing, std::slice::from_ref(&want));
    assert!(e.is_refusal());
    let text = e.to_string();
    assert!(text.contains("batch 2 (planned)"), "{text}");
    assert!(
        text.contains("use --allow-partial to publish what is there"),
        "{text}"
    );
    assert!(
        !out.exists() && !staging_dir(&out).exists(),
        "nothing written"
    );

    let report = publish(&PublishOptions {
        allow_partial: true,
        ..PublishOptions::new(&run, &out)
    })
    .unwrap();
    assert!(report.partial);
    assert_eq!(report.rows, 55);
    sha256sum_check(&out);
    let card = card(&out);
    assert!(card.contains("**Partial.** 1 batch(es) are not done or fall short; 20 of their 20 papers are missing"), "{card}");
    assert!(
        card.contains("- batch 2 (planned): 20 of 20 papers missing"),
        "{card}"
    );
    assert!(card.contains("| papers missing | 20 |"), "{card}");
    let m = manifest(&out);
    assert_eq!(m["partial"], true);
    assert_eq!(m["missing_batches"], serde_json::json!([want]));
    assert_eq!(m["counts"]["papers_planned"], 75);
    assert_eq!(m["counts"]["papers_embedded"], 55);
}

#[test]
fn a_done_batch_whose_shards_fall_short_is_missing_too() {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("ds"));
    make_run(
        &run,
        &Spec {
            parts: &[&[10, 10]],
            dtype: VectorDtype::F32,
        },
    );
    // The second part's shard is gone from run.db although the batch says done.
    let db = RunDb::open(&run).unwrap();
    db.conn()
        .execute("DELETE FROM shards WHERE part = 1", [])
        .unwrap();
    drop(db);
    let e = publish(&PublishOptions::new(&run, &out)).unwrap_err();
    assert!(
        e.to_string()
            .contains("batch 1 (done): 10 of 20 papers missing"),
        "{e}"
    );

    // Papers the embed job could not embed are accounted for by their quarantine.
    let db = RunDb::open(&run).unwrap();
    db.conn()
        .execute_batch(
            "WITH RECURSIVE n(value) AS (SELECT 0 UNION ALL SELECT value + 1 FROM n WHERE value < 19)
             INSERT INTO papers (id, batch_id, row, line, n_chars)
                 SELECT 'b0p' || value, 1, value, value + 1, 40 FROM n;
             WITH RECURSIVE n(value) AS (SELECT 10 UNION ALL SELECT value + 1 FROM n WHERE value < 19)
             INSERT INTO quarantine (file_id, line, reason, detail, paper_id)
                 SELECT 1, value + 1, 'embed_failed', 'too long', 'b0p' || value FROM n;",
        )
        .unwrap();
    drop(db);
    let report = publish(&PublishOptions::new(&run, &out)).unwrap();
    assert_eq!((report.rows, report.partial), (10, false));
    assert!(card(&out).contains("| quarantined: embed_failed | 10 |"));
}
