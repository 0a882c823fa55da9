//! Arrow → points mapping, without any Qdrant.

use crate::upload_common;

use std::sync::Arc;

use arrow_array::{Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use embedfleet_vectordb::{
    build_point_structs, parse_year, point_id, PointsBatch, UploadError, PAPER_NAMESPACE,
};
use qdrant_client::qdrant::{
    point_id::PointIdOptions, value::Kind, vector, vectors::VectorsOptions,
};
use upload_common::*;

#[test]
fn namespace_and_ids_are_the_documented_uuid5() {
    let ns = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, b"embedfleet:paper-id");
    assert_eq!(PAPER_NAMESPACE, ns);
    // Same value as Python's uuid.uuid5(uuid.uuid5(uuid.NAMESPACE_URL, "embedfleet:paper-id"), "W2963403868").
    assert_eq!(
        point_id("W2963403868").to_string(),
        "6f5700bd-86d2-5d9a-9eb6-5a72506f644f"
    );
    assert_eq!(point_id("a"), point_id("a"));
    assert_ne!(point_id("a"), point_id("b"));
    assert_eq!(point_id("a").get_version_num(), 5);
}

#[test]
fn years_come_from_the_leading_digits_of_created() {
    assert_eq!(parse_year("2019-05-02T00:00:00.000Z"), Some(2019));
    assert_eq!(parse_year("2019-05-02"), Some(2019));
    assert_eq!(parse_year("1999"), Some(1999));
    assert_eq!(parse_year(" 2001-01-01"), Some(2001));
    for bad in ["", "19", "20190502", "May 2019", "abcd-01-01", "201x-01-01"] {
        assert_eq!(parse_year(bad), None, "{bad:?}");
    }
}

#[test]
fn points_borrow_rows_with_payload() {
    let batch = shard_batch(10, 20, 12);
    let points = PointsBatch::from_record_batch(&batch).expect("valid");
    assert_eq!((points.len(), points.dim()), (20, 12));
    for (k, p) in points.iter().enumerate() {
        let i = 10 + k;
        assert_eq!(p.paper_id, paper_id(i));
        assert_eq!(p.id(), point_id(&paper_id(i)));
        assert_eq!(p.vector, vector_of(i, 12, 7).as_slice());
        assert_eq!(p.year, year_of(i));
        assert_eq!(p.source, Some(source_of(i)));
        assert_eq!(p.n_chars, Some(1000 + i as i32));
        assert_eq!(p.n_tokens, Some(250 + i as i32));
    }
}

#[test]
fn sliced_batches_see_only_their_rows() {
    let batch = shard_batch(0, 100, 8);
    let slice = batch.slice(37, 5);
    let points = PointsBatch::from_record_batch(&slice).expect("valid");
    assert_eq!(points.len(), 5);
    assert_eq!(points.vectors().len(), 5 * 8);
    for (k, p) in points.iter().enumerate() {
        assert_eq!(p.paper_id, paper_id(37 + k));
        assert_eq!(p.vector, vector_of(37 + k, 8, 7).as_slice());
    }
}

#[test]
fn f16_vectors_are_widened() {
    let batch = shard_batch_f16(0, 4, 16);
    let points = PointsBatch::from_record_batch(&batch).expect("valid");
    for (i, p) in points.iter().enumerate() {
        let want = vector_of(i, 16, 7);
        for (a, b) in p.vector.iter().zip(&want) {
            assert!((a - b).abs() < 1e-3, "{a} vs {b}");
        }
    }
}

#[test]
fn grpc_points_carry_id_vector_and_payload() {
    let batch = shard_batch(0, 32, 40);
    let points = PointsBatch::from_record_batch(&batch).expect("valid");
    let grpc = build_point_structs(&points);
    assert_eq!(grpc.len(), 32);
    for (i, p) in grpc.iter().enumerate() {
        let id = p.id.as_ref().and_then(|id| id.point_id_options.clone());
        assert_eq!(
            id,
            Some(PointIdOptions::Uuid(point_id(&paper_id(i)).to_string()))
        );
        let data = match p.vectors.as_ref().and_then(|v| v.vectors_options.as_ref()) {
            Some(VectorsOptions::Vector(v)) => match &v.vector {
                Some(vector::Vector::Dense(d)) => d.data.clone(),
                other => panic!("expected a dense vector, got {other:?}"),
            },
            other => panic!("expected one vector, got {other:?}"),
        };
        assert_eq!(data, vector_of(i, 40, 7));
        let kind = |k: &str| p.payload.get(k).and_then(|v| v.kind.clone());
        assert_eq!(kind("paper_id"), Some(Kind::StringValue(paper_id(i))));
        assert_eq!(kind("year"), year_of(i).map(Kind::IntegerValue));
        assert_eq!(
            kind("source"),
            Some(Kind::StringValue(source_of(i).to_owned()))
        );
        assert_eq!(kind("n_chars"), Some(Kind::IntegerValue(1000 + i as i64)));
        assert_eq!(kind("n_tokens"), Some(Kind::IntegerValue(250 + i as i64)));
        assert_eq!(p.payload.len(), 4 + usize::from(year_of(i).is_some()));
    }
}

fn without(batch: &RecordBatch, column: &str) -> RecordBatch {
    let idx = batch.schema().index_of(column).expect("column exists");
    let mut b = batch.clone();
    b.remove_column(idx);
    b
}

#[test]
fn missing_or_mistyped_columns_are_typed_errors() {
    let batch = shard_batch(0, 3, 4);
    let no_embedding = without(&batch, "embedding");
    let r = PointsBatch::from_record_batch(&no_embedding);
    assert!(
        matches!(
            r,
            Err(UploadError::MissingColumn {
                column: "embedding"
            })
        ),
        "{r:?}"
    );
    let no_id = without(&batch, "id");
    let r = PointsBatch::from_record_batch(&no_id);
    assert!(
        matches!(r, Err(UploadError::MissingColumn { column: "id" })),
        "{r:?}"
    );
    // Optional columns may be absent.
    let bare = without(&without(&batch, "source"), "created");
    let points = PointsBatch::from_record_batch(&bare).expect("optional columns");
    assert_eq!(points.point(0).year, None);
    assert_eq!(points.point(0).source, None);

    // `embedding` as a plain utf8 column.
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("embedding", DataType::Utf8, false),
    ]);
    let bad = RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(StringArray::from(vec!["a"])),
            Arc::new(StringArray::from(vec!["x"])),
        ],
    )
    .expect("batch");
    let r = PointsBatch::from_record_batch(&bad);
    assert!(
        matches!(
            r,
            Err(UploadError::ColumnType {
                column: "embedding",
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn null_paper_ids_are_refused_with_their_row() {
    let batch = shard_batch(0, 3, 4);
    let ids = StringArray::from(vec![Some("a"), None, Some("c")]);
    let idx = batch.schema().index_of("id").expect("id");
    let mut columns = batch.columns().to_vec();
    columns[idx] = Arc::new(ids);
    let fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| {
            if f.name() == "id" {
                Field::new("id", DataType::Utf8, true)
            } else {
                f.as_ref().clone()
            }
        })
        .collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("batch");
    assert!(batch.column(idx).is_null(1));
    let r = PointsBatch::from_record_batch(&batch);
    assert!(
        matches!(
            r,
            Err(UploadError::NullValue {
                column: "id",
                row: 1
            })
        ),
        "{r:?}"
    );
}
