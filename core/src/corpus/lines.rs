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

/// The longest line read as a record: far above any paper (peS2o's longest are a few MB), far
/// below what would exhaust memory. A longer line is skipped and quarantined.
pub const MAX_LINE_BYTES: usize = 256 << 20;

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
    read_limited(path, format, options, visit, filtered, MAX_LINE_BYTES)
}

/// [`read`] with lines bounded by `max_line` bytes (tests use small bounds).
pub(super) fn read_limited<E>(
    path: &Path,
    format: Format,
    options: &ReadOptions,
    visit: &mut dyn FnMut(Record) -> Result<(), E>,
    filtered: &mut u64,
    max_line: usize,
) -> Result<Option<String>, ReadError<E>> {
    let file = File::open(path).map_err(|source| CorpusError::Io {
        path: path.into(),
        cause: source,
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
                    cause: source,
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
        match read_line_bounded(&mut reader, &mut buf, max_line) {
            Ok((0, _)) => return Ok(None),
            Ok((n, false)) => decoded_bytes += n,
            Ok((n, true)) => {
                decoded_bytes += n;
                let entry = QuarantineEntry {
                    file: file_name.clone(),
                    line: line_no,
                    reason: QuarantineReason::LineTooLong,
                    detail: format!(
                        "a line of {n} bytes, more than the {max_line} a record may have"
                    ),
                    id: None,
                    first_occurrence: None,
                };
                visit(Record::Quarantined(entry)).map_err(ReadError::Visit)?;
                continue;
            }
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

/// Reads one line into `buf` (newline included), keeping at most `max` bytes: the rest of a
/// longer line is read and dropped. Returns the line's whole length and whether it was cut.
fn read_line_bounded(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<(u64, bool)> {
    let (mut total, mut cut) = (0u64, false);
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok((total, cut));
        }
        let (piece, done) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (&chunk[..=i], true),
            None => (chunk, false),
        };
        let room = max.saturating_sub(buf.len());
        if piece.len() > room {
            cut = true;
            buf.clear();
        } else if !cut {
            buf.extend_from_slice(piece);
        }
        let used = piece.len();
        total += used as u64;
        reader.consume(used);
        if done {
            return Ok((total, cut));
        }
    }
}

fn trim_newline(mut line: &[u8]) -> &[u8] {
    while let [rest @ .., b'\n' | b'\r'] = line {
        line = rest;
    }
    line
}
