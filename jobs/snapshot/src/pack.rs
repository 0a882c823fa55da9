//! An edge shard directory packed as a Qdrant server's shard snapshot.
//!
//! The server recovers a shard only from its own layout (`lib/collection`'s shard snapshot, in
//! the "streamable" segment format), which is what [`pack`] writes, in one pass, hashing as it
//! goes:
//!
//! ```text
//! segments/<uuid>/files/...     each segment's files (the edge segment directory, as it is)
//! wal/closed-<V+1>              an empty WAL whose first index is above every segment version V
//! replica_state.json            one local, active replica (the server renames the peer)
//! shard_config.json             {"type": "ReplicaSet"}
//! newest_clocks.json            no clocks yet
//! ```
//!
//! The edge shard's own WAL is not shipped: its entries are edge operations, not the server's
//! (they carry no clock tags), and everything in it is already applied to the segments. The
//! empty WAL starts above the highest segment version so that the server's next operation gets
//! a number no segment has seen (otherwise it skips it as already applied).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{io_err, SnapshotError};

/// What [`pack`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// Hex SHA-256 of the snapshot file (the server's upload endpoint checks it).
    pub sha256: String,
    /// Size of the snapshot file.
    pub bytes: u64,
    /// Segments in it (the engine keeps one empty appendable segment beside the built ones).
    pub segments: usize,
    /// The highest operation number applied to any segment.
    pub max_version: u64,
    /// The segments' storage version (their `version.info`; one for all of them).
    pub segment_format: String,
}

/// The WAL header: magic `wal`, format version 0, then a CRC seed (`lib/wal`'s segment format).
const WAL_HEADER: [u8; 8] = *b"wal\0\x2a\x2a\x2a\x2a";
/// The empty WAL segment's size: the header and room for nothing else. The server opens new
/// segments of its own capacity for what comes next.
const WAL_SEGMENT_BYTES: usize = 4096;

/// Packs the edge shard in `shard_dir` (an `EdgeShard`'s directory, flushed and closed) into a
/// shard snapshot at `out`.
pub fn pack(shard_dir: &Path, out: &Path) -> Result<Packed, SnapshotError> {
    let segments = segment_dirs(shard_dir)?;
    if segments.is_empty() {
        return Err(SnapshotError::Layout {
            path: shard_dir.to_owned(),
            message: "no segment directories in it".into(),
        });
    }
    let mut max_version = 0;
    let mut segment_format = None::<String>;
    for dir in &segments {
        max_version = max_version.max(segment_version(dir)?);
        let version = std::fs::read_to_string(dir.join("version.info"))
            .map_err(io_err("read", &dir.join("version.info")))?;
        let version = version.trim().to_owned();
        match &segment_format {
            Some(v) if *v != version => {
                return Err(SnapshotError::Layout {
                    path: dir.clone(),
                    message: format!("a segment in storage version {version}, another in {v}"),
                })
            }
            _ => segment_format = Some(version),
        }
    }

    // `out` is a temporary name others may predict: never written through a link.
    let file = embedfleet_core::atomic::create_fresh(out).map_err(io_err("create", out))?;
    let mut hashing = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    {
        let mut tar = tar::Builder::new(&mut hashing);
        tar.mode(tar::HeaderMode::Deterministic);
        tar.follow_symlinks(false);
        for dir in &segments {
            let name = dir.file_name().unwrap_or_default().to_string_lossy();
            let inside = PathBuf::from("segments").join(&*name).join("files");
            append_tree(&mut tar, dir, &inside)?;
        }
        let wal = wal_segment();
        append_bytes(
            &mut tar,
            &format!("wal/closed-{}", max_version + 1),
            &wal,
            out,
        )?;
        append_bytes(
            &mut tar,
            "replica_state.json",
            br#"{"is_local":true,"this_peer_id":0,"peers":{"0":"Active"}}"#,
            out,
        )?;
        append_bytes(
            &mut tar,
            "shard_config.json",
            br#"{"type":"ReplicaSet"}"#,
            out,
        )?;
        append_bytes(&mut tar, "newest_clocks.json", br#"{"clocks":[]}"#, out)?;
        tar.finish().map_err(io_err("write", out))?;
    }
    let (writer, sha256, bytes) = hashing.finish();
    let file = writer
        .into_inner()
        .map_err(|e| io_err("write", out)(e.into_error()))?;
    file.sync_all().map_err(io_err("sync", out))?;
    Ok(Packed {
        sha256,
        bytes,
        segments: segments.len(),
        max_version,
        segment_format: segment_format.unwrap_or_default(),
    })
}

/// The segment directories of an edge shard, sorted (hidden ones are the engine's temporaries).
fn segment_dirs(shard_dir: &Path) -> Result<Vec<PathBuf>, SnapshotError> {
    let root = shard_dir.join("segments");
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(&root).map_err(io_err("read", &root))? {
        let entry = entry.map_err(io_err("read", &root))?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if !hidden && entry.path().is_dir() {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// The segment's version: the highest operation number applied to it (`segment.json`).
fn segment_version(dir: &Path) -> Result<u64, SnapshotError> {
    let path = dir.join("segment.json");
    let text = std::fs::read(&path).map_err(io_err("read", &path))?;
    let state: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| SnapshotError::Layout {
            path: path.clone(),
            message: e.to_string(),
        })?;
    // An empty appendable segment has seen no operation: `version` is null.
    Ok(state.get("version").and_then(|v| v.as_u64()).unwrap_or(0))
}

fn wal_segment() -> Vec<u8> {
    let mut bytes = vec![0u8; WAL_SEGMENT_BYTES];
    bytes[..WAL_HEADER.len()].copy_from_slice(&WAL_HEADER);
    bytes
}

/// Every regular file under `dir`, at `inside/<relative path>`, in a stable order.
fn append_tree<W: Write>(
    tar: &mut tar::Builder<W>,
    dir: &Path,
    inside: &Path,
) -> Result<(), SnapshotError> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(io_err("read", dir))?
        .collect::<Result<_, _>>()
        .map_err(io_err("read", dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let kind = entry.file_type().map_err(io_err("read", &path))?;
        let name = inside.join(entry.file_name());
        if kind.is_dir() {
            append_tree(tar, &path, &name)?;
        } else if kind.is_file() {
            let mut file = File::open(&path).map_err(io_err("read", &path))?;
            tar.append_file(&name, &mut file)
                .map_err(io_err("pack", &path))?;
        }
    }
    Ok(())
}

fn append_bytes<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    bytes: &[u8],
    out: &Path,
) -> Result<(), SnapshotError> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_cksum();
    tar.append_data(&mut header, name, bytes)
        .map_err(io_err("write", out))
}

/// A writer that hashes and counts what passes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
        let hex = self
            .hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        (self.inner, hex, self.bytes)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_segment(root: &Path, uuid: &str, version: Option<u64>) {
        let dir = root.join("segments").join(uuid);
        std::fs::create_dir_all(dir.join("vector_storage")).unwrap();
        let v = version.map_or("null".to_string(), |v| v.to_string());
        std::fs::write(dir.join("segment.json"), format!(r#"{{"version":{v}}}"#)).unwrap();
        std::fs::write(dir.join("version.info"), "0.6.0").unwrap();
        std::fs::write(dir.join("vector_storage").join("vectors.dat"), b"abc").unwrap();
    }

    #[test]
    fn the_layout_is_the_servers_and_the_wal_starts_above_every_segment_version() {
        let tmp = tempfile::tempdir().unwrap();
        let shard = tmp.path().join("shard");
        fake_segment(&shard, "0b5c1f4e-0000-4000-8000-000000000001", Some(41));
        fake_segment(&shard, "0b5c1f4e-0000-4000-8000-000000000002", None);
        std::fs::create_dir_all(shard.join("segments").join(".tmp-optimizer")).unwrap();
        std::fs::create_dir_all(shard.join("wal")).unwrap();
        std::fs::write(shard.join("wal").join("open-1"), b"edge ops").unwrap();
        let out = tmp.path().join("s.snapshot");
        let packed = pack(&shard, &out).unwrap();
        assert_eq!(packed.segments, 2);
        assert_eq!(packed.max_version, 41);
        assert_eq!(packed.segment_format, "0.6.0");
        assert_eq!(packed.bytes, std::fs::metadata(&out).unwrap().len());
        assert_eq!(
            packed.sha256,
            embedfleet_core::shardfile::sha256_of(&out).unwrap()
        );

        let mut archive = tar::Archive::new(File::open(&out).unwrap());
        let mut names = Vec::new();
        let mut wal = Vec::new();
        let mut replica = String::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            if name.starts_with("wal/") {
                io::Read::read_to_end(&mut entry, &mut wal).unwrap();
            }
            if name == "replica_state.json" {
                io::Read::read_to_string(&mut entry, &mut replica).unwrap();
            }
            names.push(name);
        }
        let seg1 = "segments/0b5c1f4e-0000-4000-8000-000000000001/files";
        assert!(names.contains(&format!("{seg1}/segment.json")), "{names:?}");
        assert!(names.contains(&format!("{seg1}/vector_storage/vectors.dat")));
        assert!(names.contains(&"wal/closed-42".to_string()), "{names:?}");
        assert!(!names
            .iter()
            .any(|n| n.contains(".tmp-optimizer") || n.contains("open-1")));
        assert_eq!(&wal[..3], b"wal");
        assert_eq!(wal[3], 0, "WAL format version");
        let replica: serde_json::Value = serde_json::from_str(&replica).unwrap();
        assert_eq!(replica["is_local"], true);
        assert_eq!(replica["peers"]["0"], "Active");

        // The same directory packs to the same bytes: a rebuilt snapshot has the same checksum.
        let again = pack(&shard, &tmp.path().join("t.snapshot")).unwrap();
        assert_eq!(again.sha256, packed.sha256);
    }

    #[test]
    fn a_directory_without_segments_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("segments")).unwrap();
        let err = pack(tmp.path(), &tmp.path().join("x")).unwrap_err();
        assert!(err.to_string().contains("no segment"), "{err}");
    }
}
