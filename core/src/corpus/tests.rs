//! Reader tests: every format, every quarantine reason, each built from its own bad input.

use super::*;
use crate::quarantine::QuarantineReason;
use std::io::Write;

fn read_all(
    path: &Path,
    options: &ReadOptions,
) -> (Vec<(u64, Paper)>, Vec<QuarantineEntry>, FileSummary) {
    let (mut papers, mut bad) = (Vec::new(), Vec::new());
    let summary = read_file::<()>(path, options, |r| {
        match r {
            Record::Paper { line, paper } => papers.push((line, paper)),
            Record::Quarantined(q) => bad.push(q),
        }
        Ok(())
    })
    .unwrap();
    (papers, bad, summary)
}

const GOOD: &str = concat!(
    r#"{"id":"a1","text":"First paper.\nWith a second line.","source":"s2orc/train","created":"2019-05-02T00:00:00.000Z","added":"2023-01-01","version":"v3","year":2019,"venue":"X"}"#,
    "\n",
    r#"{"id":17,"text":"Integer id \u00e9","source":"s2ag/train"}"#,
    "\n"
);

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn check_good(papers: &[(u64, Paper)]) {
    assert_eq!(papers.len(), 2);
    assert_eq!(papers[0].0, 1);
    assert_eq!(papers[0].1.id, "a1");
    assert_eq!(papers[0].1.text, "First paper.\nWith a second line.");
    assert_eq!(
        papers[0].1.created.as_deref(),
        Some("2019-05-02T00:00:00.000Z")
    );
    assert_eq!(papers[0].1.version.as_deref(), Some("v3"));
    assert_eq!(papers[1].1.id, "17");
    assert_eq!(papers[1].1.text, "Integer id é");
}

#[test]
fn reads_every_json_lines_format() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("c.jsonl", GOOD.as_bytes().to_vec()),
        ("c.jsonl.gz", gz(GOOD.as_bytes())),
        ("c.json.gz", gz(GOOD.as_bytes())),
        ("c.jsonl.zst", zstd::encode_all(GOOD.as_bytes(), 3).unwrap()),
    ];
    for (name, bytes) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let (papers, bad, summary) = read_all(&path, &ReadOptions::default());
        assert!(bad.is_empty(), "{name}: {bad:?}");
        check_good(&papers);
        assert_eq!(summary.papers, 2, "{name}");
    }
}

#[test]
fn reads_concatenated_gzip_members() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("multi.jsonl.gz");
    let (first, second) = GOOD.split_at(GOOD.find('\n').unwrap() + 1);
    let mut bytes = gz(first.as_bytes());
    bytes.extend(gz(second.as_bytes()));
    std::fs::write(&path, bytes).unwrap();
    check_good(&read_all(&path, &ReadOptions::default()).0);
}

#[test]
fn reads_parquet_with_integer_or_string_ids() {
    use arrow_array::{Int64Array, RecordBatch, StringArray};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.parquet");
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from(vec![Some(5), None, Some(7), Some(8)])) as _,
        ),
        (
            "text",
            Arc::new(StringArray::from(vec![
                Some("a text"),
                Some("x"),
                Some("  "),
                Some("more"),
            ])) as _,
        ),
        (
            "source",
            Arc::new(StringArray::from(vec![
                Some("s2orc"),
                None,
                None,
                Some("s2ag"),
            ])) as _,
        ),
        (
            "year",
            Arc::new(Int64Array::from(vec![2020, 2021, 2022, 2023])) as _,
        ),
    ])
    .unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let options = ReadOptions {
        keep_fields: vec!["year".into()],
        ..Default::default()
    };
    let (papers, bad, _) = read_all(&path, &options);
    assert_eq!(
        papers
            .iter()
            .map(|(_, p)| p.id.as_str())
            .collect::<Vec<_>>(),
        ["5", "8"]
    );
    assert_eq!(papers[0].1.extra.as_deref(), Some(r#"{"year":2020}"#));
    assert_eq!(papers[1].0, 3, "parquet lines are 0-based rows");
    let reasons: Vec<_> = bad.iter().map(|q| (q.line, q.reason)).collect();
    assert_eq!(
        reasons,
        [
            (1, QuarantineReason::MissingId),
            (2, QuarantineReason::EmptyText)
        ]
    );
}

#[test]
fn keeps_allow_listed_fields_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.jsonl");
    std::fs::write(&path, GOOD).unwrap();
    let options = ReadOptions {
        keep_fields: vec!["year".into(), "missing".into()],
        ..Default::default()
    };
    let (papers, _, _) = read_all(&path, &options);
    assert_eq!(papers[0].1.extra.as_deref(), Some(r#"{"year":2019}"#));
    assert_eq!(papers[1].1.extra, None);
}

#[test]
fn source_filter_selects_by_source_and_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.jsonl");
    std::fs::write(&path, GOOD).unwrap();
    let options = ReadOptions {
        sources: vec!["s2orc".into()],
        ..Default::default()
    };
    let (papers, bad, summary) = read_all(&path, &options);
    assert_eq!(papers.len(), 1);
    assert_eq!(papers[0].1.id, "a1");
    assert!(bad.is_empty());
    assert_eq!(summary.filtered, 1);
    let options = ReadOptions {
        sources: vec!["s2or".into()],
        ..Default::default()
    };
    assert_eq!(
        read_all(&path, &options).0.len(),
        0,
        "a prefix must end at '/'"
    );
}

#[test]
fn quarantines_each_bad_record_and_keeps_going() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    let mut bytes = Vec::new();
    let lines: [&[u8]; 10] = [
        br#"{"id":"ok1","text":"fine"}"#,
        br#"{"id":"x","text":"unterminated"#,
        b"[1,2,3]",
        br#"{"text":"no id"}"#,
        br#"{"id":{"a":1},"text":"object id"}"#,
        br#"{"id":"t1"}"#,
        br#"{"id":"t2","text":42}"#,
        br#"{"id":"t3","text":"   \n\t "}"#,
        b"{\"id\":\"u1\",\"text\":\"bad \xff\xfe bytes\"}",
        br#"{"id":"ok2","text":"fine again"}"#,
    ];
    for line in lines {
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(b"\n\n"); // trailing blank lines are not records
    std::fs::write(&path, bytes).unwrap();
    let (papers, bad, summary) = read_all(&path, &ReadOptions::default());
    assert_eq!(
        papers
            .iter()
            .map(|(l, p)| (*l, p.id.as_str()))
            .collect::<Vec<_>>(),
        [(1, "ok1"), (10, "ok2")]
    );
    use QuarantineReason::*;
    let got: Vec<_> = bad.iter().map(|q| (q.line, q.reason)).collect();
    assert_eq!(
        got,
        [
            (2, InvalidJson),
            (3, InvalidJson),
            (4, MissingId),
            (5, MissingId),
            (6, MissingText),
            (7, MissingText),
            (8, EmptyText),
            (9, NonUtf8)
        ]
    );
    assert!(bad
        .iter()
        .all(|q| q.file.ends_with("bad.jsonl") && !q.detail.is_empty()));
    assert_eq!(bad[5].id.as_deref(), Some("t2"));
    assert!(bad[5].detail.contains("a number"), "{}", bad[5].detail);
    assert_eq!(summary.quarantined, 8);
    assert_eq!(summary.corrupt, None);
}

#[test]
fn truncated_gzip_keeps_the_records_before_the_break() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.jsonl.gz");
    let text: String = (0..2000)
        .map(|i| {
            format!(
                "{{\"id\":\"{i}\",\"text\":\"paper number {i} {}\"}}\n",
                "w".repeat(i % 97)
            )
        })
        .collect();
    let full = gz(text.as_bytes());
    std::fs::write(&path, &full[..full.len() * 2 / 3]).unwrap();
    let (papers, bad, summary) = read_all(&path, &ReadOptions::default());
    assert!(
        papers.len() > 100 && papers.len() < 2000,
        "{}",
        papers.len()
    );
    for (i, (line, paper)) in papers.iter().enumerate() {
        assert_eq!(
            (*line, paper.id.as_str()),
            (i as u64 + 1, i.to_string().as_str())
        );
    }
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].reason, QuarantineReason::CorruptFile);
    assert_eq!(bad[0].line, papers.len() as u64 + 1);
    let corrupt = summary.corrupt.unwrap();
    assert!(
        corrupt.contains(&format!("line {}", papers.len() + 1)) && corrupt.contains("byte"),
        "{corrupt}"
    );
}

#[test]
fn corrupt_zstd_and_parquet_are_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let zst = dir.path().join("c.jsonl.zst");
    let mut bytes = zstd::encode_all(GOOD.repeat(500).as_bytes(), 3).unwrap();
    let n = bytes.len();
    bytes.truncate(n - 20);
    std::fs::write(&zst, bytes).unwrap();
    let (_, bad, summary) = read_all(&zst, &ReadOptions::default());
    assert!(summary.corrupt.is_some());
    assert_eq!(bad.last().unwrap().reason, QuarantineReason::CorruptFile);

    let pq = dir.path().join("c.parquet");
    std::fs::write(&pq, b"PAR1 this is not parquet").unwrap();
    let (papers, bad, summary) = read_all(&pq, &ReadOptions::default());
    assert!(papers.is_empty());
    assert_eq!(bad[0].reason, QuarantineReason::CorruptFile);
    assert!(summary.corrupt.unwrap().contains("row 0"));
}

#[test]
fn discovers_directories_recursively_in_sorted_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("b/inner")).unwrap();
    for name in [
        "b/inner/z.jsonl.gz",
        "b/a.parquet",
        "a.jsonl",
        "notes.txt",
        "c.json.gz",
    ] {
        std::fs::write(root.join(name), b"").unwrap();
    }
    let files = discover(&[root.to_path_buf()]).unwrap();
    let names: Vec<_> = files
        .iter()
        .map(|p| p.strip_prefix(root).unwrap().to_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        ["a.jsonl", "b/a.parquet", "b/inner/z.jsonl.gz", "c.json.gz"]
    );
    assert!(matches!(
        discover(&[root.join("notes.txt")]),
        Err(CorpusError::UnknownFormat(_))
    ));
    assert!(matches!(
        discover(&[root.join("nope")]),
        Err(CorpusError::NotFound(_))
    ));
    std::fs::create_dir(root.join("empty")).unwrap();
    assert!(matches!(
        discover(&[root.join("empty")]),
        Err(CorpusError::Empty(_))
    ));
}

#[test]
fn a_symlink_loop_in_the_corpus_tree_is_reported_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("a/b");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::write(
        dir.path().join("a/c.jsonl"),
        "{\"id\": 1, \"text\": \"x\"}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(dir.path().join("a"), inner.join("loop")).unwrap();
    let err = discover(&[dir.path().to_path_buf()]).unwrap_err();
    assert!(matches!(err, CorpusError::SymlinkLoop { .. }), "{err}");
    assert!(err.to_string().contains("symbolic link loop"), "{err}");
    // A link to a sibling directory is not a loop: its files are found once through it.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(other.path().join("x")).unwrap();
    std::fs::write(
        other.path().join("x/d.jsonl"),
        "{\"id\": 2, \"text\": \"y\"}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(other.path().join("x"), other.path().join("y")).unwrap();
    assert_eq!(discover(&[other.path().to_path_buf()]).unwrap().len(), 2);
}

#[test]
fn a_line_too_long_for_any_paper_is_quarantined_without_being_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.jsonl.gz");
    let huge = format!("{{\"id\":\"h\",\"text\":\"{}\"}}", "x".repeat(10_000));
    let text = format!(
        "{{\"id\":\"a\",\"text\":\"ok\"}}\n{huge}\n{{\"id\":\"b\",\"text\":\"ok too\"}}\n{huge}"
    );
    std::fs::write(&path, gz(text.as_bytes())).unwrap();
    let (mut papers, mut bad, mut filtered) = (Vec::new(), Vec::new(), 0);
    let mut visit = |r: Record| {
        match r {
            Record::Paper { line, paper } => papers.push((line, paper.id)),
            Record::Quarantined(q) => bad.push(q),
        }
        Ok::<(), ()>(())
    };
    let options = ReadOptions::default();
    let end = lines::read_limited(
        &path,
        Format::JsonlGz,
        &options,
        &mut visit,
        &mut filtered,
        1000,
    )
    .unwrap();
    assert_eq!(end, None, "the file is read to its end");
    assert_eq!(papers, [(1, "a".to_string()), (3, "b".to_string())]);
    assert_eq!(
        bad.len(),
        2,
        "the middle line and the last one (no newline)"
    );
    assert!(bad
        .iter()
        .all(|q| q.reason == QuarantineReason::LineTooLong));
    assert_eq!((bad[0].line, bad[1].line), (2, 4));
    assert!(
        bad[0].detail.contains(&format!("{} bytes", huge.len() + 1)),
        "{}",
        bad[0].detail
    );
    assert!(
        bad[1].detail.contains(&format!("{} bytes", huge.len())),
        "{}",
        bad[1].detail
    );
}

/// A seeded generator for the property test (splitmix64): the same lines on every run.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One corpus line as the property test makes it: a good record, or a good record broken in
/// one of the ways real files break. `None` expected means the line must be quarantined.
fn corrupted_line(
    rng: &mut Seeded,
    i: usize,
    max_line: usize,
) -> (Vec<u8>, Option<(String, String)>) {
    let id = format!("p{i:05}");
    let words = [
        "graphene",
        "β-decay",
        "naïve",
        "模型",
        "\\u0000 escaped NUL",
        "tab\\there",
        "\\\"quoted\\\"",
    ];
    let mut text = String::new();
    for _ in 0..1 + rng.below(12) {
        text.push_str(words[rng.below(words.len())]);
        text.push(' ');
    }
    let good = format!(
        r#"{{"id":"{id}","text":"{text}","source":"s2orc/train","meta":{{"a":[1,{{"b":[2,3]}}],"c":null}}}}"#
    );
    let decoded = text
        .replace("\\u0000", "\0")
        .replace("\\t", "\t")
        .replace("\\\"", "\"");
    let mut line = good.clone().into_bytes();
    let bad = match rng.below(9) {
        0 | 1 => return (line, Some((id, decoded))),
        // Truncated anywhere (a record cut by a crash or a partial copy).
        2 => {
            line.truncate(1 + rng.below(line.len() - 1));
            line
        }
        // Bytes that are not UTF-8, anywhere in the line.
        3 => {
            let at = rng.below(line.len());
            let junk = [0x80 | rng.below(0x40) as u8, 0xff, 0xc3];
            line.splice(at..at, junk[..1 + rng.below(3)].iter().copied());
            line
        }
        // Longer than any paper can be.
        4 => format!(
            r#"{{"id":"{id}","text":"{}"}}"#,
            "y".repeat(max_line + rng.below(5_000))
        )
        .into_bytes(),
        // JSON nested where a string must be, or nested past any parser's depth.
        5 => match rng.below(3) {
            0 => format!(r#"{{"id":"{id}","text":{{"nested":{{"text":"{text}"}}}}}}"#).into_bytes(),
            1 => format!(r#"{{"id":[{{"id":"{id}"}}],"text":"{text}"}}"#).into_bytes(),
            // Past any recursive parser's depth: where a string must be it is bad; in a field
            // nobody reads it is still a good record (and must not overflow the stack).
            _ => {
                let depth = 200 + rng.below(1_800); // under MAX_LINE: depth, not length
                let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
                if rng.below(2) == 0 {
                    format!(r#"{{"id":"{id}","text":{deep}}}"#).into_bytes()
                } else {
                    let line = format!(r#"{{"id":"{id}","text":"{text}","deep":{deep}}}"#);
                    return (line.into_bytes(), Some((id, decoded)));
                }
            }
        },
        // Raw NUL bytes (JSON allows them only escaped).
        6 => {
            let at = 1 + rng.below(line.len() - 1);
            line.splice(at..at, std::iter::repeat_n(0u8, 1 + rng.below(4)));
            line
        }
        // Fields missing, empty or of the wrong type.
        7 => match rng.below(4) {
            0 => format!(r#"{{"text":"{text}"}}"#).into_bytes(),
            1 => format!(r#"{{"id":"{id}"}}"#).into_bytes(),
            2 => format!(r#"{{"id":"{id}","text":"  \t "}}"#).into_bytes(),
            _ => format!(r#"{{"id":"","text":"{text}"}}"#).into_bytes(),
        },
        // Random bytes (no white space: a newline would make two lines, and a blank line is
        // no record).
        _ => (0..1 + rng.below(300))
            .map(|_| match rng.next() as u8 {
                b if b.is_ascii_whitespace() || b == 0x0b => b'#',
                b => b,
            })
            .collect(),
    };
    (bad, None)
}

#[test]
fn ten_thousand_randomly_corrupted_lines_never_panic_and_every_bad_one_is_quarantined() {
    const LINES: usize = 10_000;
    const MAX_LINE: usize = 4_096;
    let mut rng = Seeded(0x5eed_2026);
    let mut bytes = Vec::new();
    let mut expected = Vec::new();
    for i in 0..LINES {
        let (line, good) = corrupted_line(&mut rng, i, MAX_LINE);
        assert!(!line.contains(&b'\n') && !line.iter().all(u8::is_ascii_whitespace));
        bytes.extend_from_slice(&line);
        bytes.push(b'\n');
        expected.push(good);
    }
    let bad_lines = expected.iter().filter(|e| e.is_none()).count();
    assert!(bad_lines > LINES / 2, "most lines are broken: {bad_lines}");
    let dir = tempfile::tempdir().unwrap();
    for (name, format, content) in [
        ("c.jsonl", Format::Jsonl, bytes.clone()),
        ("c.jsonl.gz", Format::JsonlGz, gz(&bytes)),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let mut seen: Vec<Option<Result<(String, String), QuarantineEntry>>> = vec![None; LINES];
        let mut visit = |r: Record| {
            let (line, got) = match r {
                Record::Paper { line, paper } => (line, Ok((paper.id, paper.text))),
                Record::Quarantined(q) => (q.line, Err(q)),
            };
            let slot = &mut seen[line as usize - 1];
            assert!(slot.is_none(), "line {line} reported twice");
            *slot = Some(got);
            Ok::<(), ()>(())
        };
        let end = lines::read_limited(
            &path,
            format,
            &ReadOptions::default(),
            &mut visit,
            &mut 0,
            MAX_LINE,
        )
        .unwrap();
        assert_eq!(end, None, "{name}: read to its end");
        for (i, (got, want)) in seen.iter().zip(&expected).enumerate() {
            let line = i + 1;
            match (got, want) {
                (Some(Ok(paper)), Some(want)) => assert_eq!(paper, want, "{name} line {line}"),
                (Some(Err(q)), None) => {
                    assert!(!q.detail.is_empty(), "{name} line {line}: {q:?}");
                    assert!(q.file.ends_with(name), "{name} line {line}: {q:?}");
                }
                (got, want) => panic!(
                    "{name} line {line}: read {got:?}, expected {want:?}; the line: {:?}",
                    String::from_utf8_lossy(bytes.split(|b| *b == b'\n').nth(i).unwrap())
                ),
            }
        }
    }
}
