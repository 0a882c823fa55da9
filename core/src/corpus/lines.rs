//! JSON lines, plain or compressed.

use super::json::{parse_line, Parsed};
use super::{CorpusError, CountingReader, Format, ReadError, ReadOptions, Record};
use crate::quarantine::{QuarantineEntry, QuarantineReason};
use std::cell::Cell;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;

const BUF: usize = 1 << 20;

/// Keeps the count of compressed bytes consumed where the error message can see it, since the
/// counting reader itself is owned by the decoder.
struct Tracked<R> {
    inner: CountingReader<R>,
    position: Rc<Cell<u64>>,
}

impl<R: Read> Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.position.set(self.inner.count);
        Ok(n)
    }
}

pub(super) fn read<E>(
    path: &Path,
    format: Format,
    options: &ReadOptions,
    visit: &mut dyn FnMut(Record) -> Result<(), E>,
    filtered: &mut u64,
) -> Result<Option<String>, ReadError<E>> {
    let file = File::open(path).map_err(|source| CorpusError::Io {
        path: path.into(),
        source,
    })?;
    let position = Rc::new(Cell::new(0));
    let raw = Tracked {
        inner: CountingReader::new(file, options.bytes_read.clone()),
        position: position.clone(),
    };
    let decoded: Box<dyn Read> = match format {
        Format::JsonlGz => Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(
            BUF, raw,
        ))),
        Format::JsonlZst => {
            Box::new(
                zstd::stream::read::Decoder::new(raw).map_err(|source| CorpusError::Io {
                    path: path.into(),
                    source,
                })?,
            )
        }
        _ => Box::new(raw),
    };
    let mut reader = BufReader::with_capacity(BUF, decoded);
    let file_name = path.display().to_string();
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut line_no = 0u64;
    let mut decoded_bytes = 0u64;
    loop {
        buf.clear();
        line_no += 1;
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => decoded_bytes += n as u64,
            Err(err) => {
                let detail = format!(
                    "reading stopped at line {line_no} (byte {} of the file, byte {} decompressed): {err}",
                    position.get(),
                    decoded_bytes + buf.len() as u64
                );
                let entry = QuarantineEntry {
                    file: file_name,
                    line: line_no,
                    reason: QuarantineReason::CorruptFile,
                    detail: detail.clone(),
                    id: None,
                    first_occurrence: None,
                };
                visit(Record::Quarantined(entry)).map_err(ReadError::Visit)?;
                return Ok(Some(detail));
            }
        }
        let line = trim_newline(&buf);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue; // blank lines (a trailing newline, say) are not records
        }
        let record = match parse_line(line, options) {
            Parsed::Paper(paper) => Record::Paper {
                line: line_no,
                paper,
            },
            Parsed::Filtered => {
                *filtered += 1;
                continue;
            }
            Parsed::Bad { reason, detail, id } => Record::Quarantined(QuarantineEntry {
                file: file_name.clone(),
                line: line_no,
                reason,
                detail,
                id,
                first_occurrence: None,
            }),
        };
        visit(record).map_err(ReadError::Visit)?;
    }
}

fn trim_newline(mut line: &[u8]) -> &[u8] {
    while let [rest @ .., b'\n' | b'\r'] = line {
        line = rest;
    }
    line
}
