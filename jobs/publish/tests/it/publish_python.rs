//! The folder read back by the tools its users have: pyarrow, and Hugging Face `datasets`
//! loading it through the card's configs as the Hub would. Skipped where python3 lacks the
//! module, unless EMBEDFLEET_REQUIRE_PYARROW / EMBEDFLEET_REQUIRE_DATASETS is set.

use crate::publish_common::publish;
use crate::publish_common::*;
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_publish::PublishOptions;

#[test]
fn pyarrow_and_datasets_read_the_published_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("ds"));
    make_run(
        &run,
        &Spec {
            parts: &[&[300, 200], &[250]],
            dtype: VectorDtype::F32,
        },
    );
    let queries = dir.path().join("hits.parquet");
    write_query_results(&queries, 12);
    let report = publish(&PublishOptions {
        target_shard_bytes: 300 * ROW_BYTES,
        query_results: vec![queries],
        ..PublishOptions::new(&run, &out)
    })
    .unwrap();
    assert_eq!((report.rows, report.files), (750, 3));
    let home = dir.path().join("hf-home");

    let code = format!(
        "import pyarrow.parquet as pq; t = pq.read_table('{}'); print(t.num_rows, t.schema.field('embedding').type)",
        out.join("data").display()
    );
    if let Some(said) = python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW", &home) {
        assert_eq!(said, "750 fixed_size_list<item: float not null>[16]");
    }

    let code = format!(
        "import datasets; d = datasets.load_dataset('parquet', data_dir='{}', split='train'); print(len(d), len(d[0]['embedding']), d[0]['id'])",
        out.join("data").display()
    );
    if let Some(said) = python(&code, "datasets", "EMBEDFLEET_REQUIRE_DATASETS", &home) {
        assert_eq!(said, "750 16 b0p0");
    }

    // As the Hub loads a repository: through the card's YAML configs.
    let code = format!(
        "import datasets, yaml\n\
         card = open('{dir}/README.md').read()\n\
         header = yaml.safe_load(card.split('---')[1])\n\
         d = datasets.load_dataset('{dir}', split='train')\n\
         q = datasets.load_dataset('{dir}', 'queries', split='train')\n\
         print(header['license'], header['size_categories'][0], len(d), len(q))",
        dir = out.display()
    );
    if let Some(said) = python(&code, "datasets", "EMBEDFLEET_REQUIRE_DATASETS", &home) {
        assert_eq!(said, "odc-by n<1K 750 12");
    }
}
