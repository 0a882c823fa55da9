//! The first error line of a job's log: what the failures table shows beside the log's path.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// How much of a log is read: a job that wrote gigabytes of output is not read whole.
const MAX_LOG_BYTES: u64 = 4 << 20;
/// How long a line the report shows.
const MAX_LINE_CHARS: usize = 300;

/// Words that mark a line as the error (case-insensitive).
const MARKERS: [&str; 6] = ["error", "panicked", "fatal", "killed", "cancelled", "oom"];

/// The first line with an error marker in the log's first [`MAX_LOG_BYTES`], else its last
/// non-empty line; `None` when the log cannot be read or is empty.
pub fn first_error_line(path: &Path) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut last = None;
    for line in BufReader::new(file.take(MAX_LOG_BYTES)).split(b'\n') {
        let line = String::from_utf8_lossy(&line.ok()?).trim().to_string();
        if line.is_empty() {
            continue;
        }
        let lower = line.to_lowercase();
        if MARKERS.iter().any(|m| lower.contains(m)) {
            return Some(shorten(line));
        }
        last = Some(line);
    }
    last.map(shorten)
}

fn shorten(line: String) -> String {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_marked_line_else_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.log");
        std::fs::write(
            &log,
            "loading\nError: <script>x</script> bad\npanicked at y\n",
        )
        .unwrap();
        assert_eq!(
            first_error_line(&log).as_deref(),
            Some("Error: <script>x</script> bad")
        );
        std::fs::write(&log, "one\ntwo\n\n").unwrap();
        assert_eq!(first_error_line(&log).as_deref(), Some("two"));
        std::fs::write(&log, format!("error {}\n", "x".repeat(1000))).unwrap();
        assert_eq!(first_error_line(&log).unwrap().chars().count(), 301);
        assert_eq!(first_error_line(&dir.path().join("none")), None);
    }
}
