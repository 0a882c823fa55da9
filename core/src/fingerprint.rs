//! Corpus file fingerprints: size, modification time and a hash of the first and last MiB.
//! Cheap on a 2 GB file, and it catches the usual ways a corpus changes (re-download, append,
//! truncation, regeneration) without reading the whole file.

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;
use std::time::UNIX_EPOCH;

const EDGE: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub size: u64,
    pub mtime_ns: i64,
    /// xxh3-128 of the first and the last MiB, hex.
    pub edges: String,
}

impl Fingerprint {
    pub fn of(path: &Path) -> io::Result<Self> {
        let mut file = File::open(path)?;
        let meta = file.metadata()?;
        let size = meta.len();
        let mtime_ns = meta
            .modified()?
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut buf = vec![0u8; EDGE.min(size) as usize];
        file.read_exact(&mut buf)?;
        hasher.update(&buf);
        if size > EDGE {
            let tail = EDGE.min(size - EDGE);
            file.seek(SeekFrom::Start(size - tail))?;
            buf.resize(tail as usize, 0);
            file.read_exact(&mut buf)?;
            hasher.update(&buf);
        }
        Ok(Self {
            size,
            mtime_ns,
            edges: format!("{:032x}", hasher.digest128()),
        })
    }

    /// What differs from `other`, in words, or `None` when they are the same.
    pub fn difference(&self, other: &Fingerprint) -> Option<String> {
        if self.size != other.size {
            Some(format!("size {} -> {} bytes", other.size, self.size))
        } else if self.edges != other.edges {
            Some("content changed".into())
        } else if self.mtime_ns != other.mtime_ns {
            Some("modification time changed".into())
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_content_change_at_the_end_of_a_large_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        let mut bytes = vec![b'a'; 3 << 20];
        std::fs::write(&path, &bytes).unwrap();
        let first = Fingerprint::of(&path).unwrap();
        assert_eq!(first.difference(&Fingerprint::of(&path).unwrap()), None);
        *bytes.last_mut().unwrap() = b'b';
        std::fs::write(&path, &bytes).unwrap();
        let second = Fingerprint::of(&path).unwrap();
        assert!(second.difference(&first).is_some());
    }
}
