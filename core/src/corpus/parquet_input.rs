//! Parquet corpus files: one row a record, columns named like the JSON fields. Read a row
//! group at a time; every column is cast to text first so `id` may be a string or an integer.

use super::{CorpusError, ReadError, ReadOptions, Record};
use crate::paper::Paper;
use crate::quarantine::{QuarantineEntry, QuarantineReason};
use arrow_array::{Array, RecordBatch, StringArray};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use std::fs::File;
use std::path::Path;

const METADATA: [&str; 4] = ["source", "created", "added", "version"];

pub(super) fn read<E>(
    path: &Path,
    options: &ReadOptions,
    visit: &mut dyn FnMut(Record) -> Result<(), E>,
    filtered: &mut u64,
) -> Result<Option<String>, ReadError<E>> {
    let file_name = path.display().to_string();
    let corrupt = |row: u64, err: &dyn std::fmt::Display| {
        let detail = format!("reading stopped at row {row}: {err}");
        let entry = QuarantineEntry {
            file: file_name.clone(),
            line: row,
            reason: QuarantineReason::CorruptFile,
            detail: detail.clone(),
            id: None,
            first_occurrence: None,
        };
        (entry, detail)
    };
    let file = File::open(path).map_err(|source| CorpusError::Io {
        path: path.into(),
        cause: source,
    })?;
    if let Some(counter) = &options.bytes_read {
        // Parquet is read by row group, not as a stream: count the file once, up front.
        counter.fetch_add(
            file.metadata().map(|m| m.len()).unwrap_or(0),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    let builder = match ParquetRecordBatchReaderBuilder::try_new(file) {
        Ok(builder) => builder,
        Err(err) => {
            let (entry, detail) = corrupt(0, &err);
            visit(Record::Quarantined(entry)).map_err(ReadError::Visit)?;
            return Ok(Some(detail));
        }
    };
    // Said when a record lacks `id` or `text`: a file that names them otherwise is the usual
    // cause, and its columns show it.
    let all_columns: Vec<&str> = builder
        .schema()
        .fields()
        .iter()
        .take(20)
        .map(|f| f.name().as_str())
        .collect();
    let all_columns = all_columns.join(", ");
    let wanted: Vec<usize> = builder
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| is_wanted(f.name(), options))
        .map(|(i, _)| i)
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
    let reader = match builder.with_projection(mask).with_batch_size(1024).build() {
        Ok(reader) => reader,
        Err(err) => {
            let (entry, detail) = corrupt(0, &err);
            visit(Record::Quarantined(entry)).map_err(ReadError::Visit)?;
            return Ok(Some(detail));
        }
    };
    let mut row = 0u64;
    for batch in reader {
        let batch = match batch {
            Ok(batch) => batch,
            Err(err) => {
                let (entry, detail) = corrupt(row, &err);
                visit(Record::Quarantined(entry)).map_err(ReadError::Visit)?;
                return Ok(Some(detail));
            }
        };
        let columns = Columns::of(&batch, options);
        for i in 0..batch.num_rows() {
            match columns.record(i, row, &file_name, options, &all_columns) {
                Some(record) => visit(record).map_err(ReadError::Visit)?,
                None => *filtered += 1,
            }
            row += 1;
        }
    }
    Ok(None)
}

fn is_wanted(name: &str, options: &ReadOptions) -> bool {
    name == "id"
        || name == "text"
        || METADATA.contains(&name)
        || options.keep_fields.iter().any(|k| k == name)
}

/// The record batch's columns as text, `None` where the column is absent or cannot be text.
struct Columns {
    id: Option<StringArray>,
    text: Option<StringArray>,
    text_type: Option<DataType>,
    metadata: [Option<StringArray>; 4],
    extra: Vec<(String, StringArray, bool)>,
}

fn as_text(batch: &RecordBatch, name: &str) -> Option<StringArray> {
    let column = batch.column_by_name(name)?;
    let cast = arrow_cast::cast(column, &DataType::Utf8).ok()?;
    cast.as_any().downcast_ref::<StringArray>().cloned()
}

impl Columns {
    fn of(batch: &RecordBatch, options: &ReadOptions) -> Self {
        let text_type = batch.column_by_name("text").map(|c| c.data_type().clone());
        let text = match &text_type {
            Some(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {
                as_text(batch, "text")
            }
            _ => None,
        };
        let extra = options
            .keep_fields
            .iter()
            .filter_map(|name| {
                let numeric = batch.column_by_name(name)?.data_type().is_numeric();
                Some((name.clone(), as_text(batch, name)?, numeric))
            })
            .collect();
        Columns {
            id: as_text(batch, "id"),
            text,
            text_type,
            metadata: METADATA.map(|name| as_text(batch, name)),
            extra,
        }
    }

    fn record(
        &self,
        i: usize,
        row: u64,
        file: &str,
        options: &ReadOptions,
        all_columns: &str,
    ) -> Option<Record> {
        let get = |col: &Option<StringArray>| {
            col.as_ref()
                .filter(|c| c.is_valid(i))
                .map(|c| c.value(i).to_owned())
        };
        let quarantine = |reason, detail: String, id| {
            Some(Record::Quarantined(QuarantineEntry {
                file: file.to_owned(),
                line: row,
                reason,
                detail,
                id,
                first_occurrence: None,
            }))
        };
        let Some(id) = get(&self.id).filter(|id| !id.is_empty()) else {
            let detail = match &self.id {
                None => format!("no `id` column (its columns: {all_columns})"),
                Some(_) => "no `id` value".into(),
            };
            return quarantine(QuarantineReason::MissingId, detail, None);
        };
        let Some(text) = get(&self.text) else {
            let detail = match &self.text_type {
                Some(t) if self.text.is_none() => format!("`text` column is {t}, not a string"),
                None => format!("no `text` column (its columns: {all_columns})"),
                _ => "no `text` value".into(),
            };
            return quarantine(QuarantineReason::MissingText, detail, Some(id));
        };
        if text.trim().is_empty() {
            return quarantine(
                QuarantineReason::EmptyText,
                "`text` is empty or white space".into(),
                Some(id),
            );
        }
        let [source, created, added, version] = self.metadata.each_ref().map(get);
        if !options.source_selected(source.as_deref()) {
            return None;
        }
        let extra = self.extra_object(i);
        Some(Record::Paper {
            line: row,
            paper: Paper {
                id,
                text,
                source,
                created,
                added,
                version,
                extra,
            },
        })
    }

    fn extra_object(&self, i: usize) -> Option<String> {
        let mut object = serde_json::Map::new();
        for (name, column, numeric) in &self.extra {
            if column.is_valid(i) {
                let text = column.value(i);
                let value = match numeric {
                    true => serde_json::from_str(text).unwrap_or_else(|_| text.into()),
                    false => serde_json::Value::from(text),
                };
                object.insert(name.clone(), value);
            }
        }
        (!object.is_empty()).then(|| serde_json::Value::Object(object).to_string())
    }
}
