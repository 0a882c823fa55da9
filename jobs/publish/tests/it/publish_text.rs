//! `with_text`: each row carries its paper's text, from the batch files.

use crate::publish_common::publish;
use crate::publish_common::*;
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_publish::PublishOptions;

#[test]
fn with_text_adds_each_papers_text_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("ds"));
    make_run(
        &run,
        &Spec {
            parts: &[&[60, 40], &[50]],
            dtype: VectorDtype::F32,
        },
    );
    let report = publish(&PublishOptions {
        with_text: true,
        // Rows are ~40 bytes of text bigger: 50 rows a file.
        target_shard_bytes: 50 * (ROW_BYTES + 40),
        ..PublishOptions::new(&run, &out)
    })
    .unwrap();
    assert_eq!((report.rows, report.files), (150, 3));
    let schema = read_batches(&data_files(&out)[0])[0].schema();
    let last = schema.fields().last().unwrap();
    assert_eq!(
        (last.name().as_str(), last.data_type()),
        ("text", &arrow_schema::DataType::Utf8)
    );
    let rows = rows(&out);
    assert_eq!(rows.len(), 150);
    for (id, _, text) in &rows {
        let (b, i) = id[1..].split_once('p').unwrap();
        let want = paper(b.parse().unwrap(), i.parse().unwrap()).text;
        assert_eq!(text.as_deref(), Some(want.as_str()), "the text of {id}");
    }
    assert!(card(&out).contains("| `text` |"));
    assert_eq!(manifest(&out)["with_text"], true);
    sha256sum_check(&out);
}
