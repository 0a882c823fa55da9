//! The folder itself: the staging folder beside `out` and what it may hold, the query results
//! copied in, `SHA256SUMS`, and the final rename. `out` is never written into: a folder under
//! that name that has `manifest.json` and `SHA256SUMS` only ever appears whole, by the rename.

use crate::error::{io, PublishError};
use crate::facts::FileEntry;
use crate::manifest::GENERATOR;
use embedfleet_core::atomic;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The files at the top of a published folder, besides `data/` and `queries/`.
pub const CARD: &str = "README.md";
pub const MANIFEST: &str = "manifest.json";
pub const SUMS: &str = "SHA256SUMS";

/// `<out>.partial`, beside `out`: where the folder is built.
pub fn staging_dir(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    out.with_file_name(name)
}

/// Refuses an `out` that exists and is not a publish of the same run (which is replaced).
pub fn check_out(out: &Path, plan_sha256: &str) -> Result<(), PublishError> {
    if out.file_name().is_none() {
        return Err(PublishError::Io {
            path: out.into(),
            cause: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "--out must name a folder (not `/`, `.` or `..`)",
            ),
        });
    }
    if !out.exists() {
        return Ok(());
    }
    let manifest: Option<serde_json::Value> = std::fs::read(out.join(MANIFEST))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let Some(manifest) = manifest.filter(|m| {
        m["generator"]
            .as_str()
            .is_some_and(|g| g.starts_with(GENERATOR))
    }) else {
        return Err(PublishError::OutExists(out.into()));
    };
    if manifest["plan_sha256"].as_str() != Some(plan_sha256) {
        return Err(PublishError::OutOfAnotherRun(out.into()));
    }
    Ok(())
}

/// Creates the staging folder and clears it of anything this publish will not write: a killed
/// writer's `.tmp` files, data files of another split, query results no longer asked for.
pub fn prepare(
    staging: &Path,
    data_files: &[String],
    query_files: &[String],
) -> Result<(), PublishError> {
    let data = staging.join("data");
    std::fs::create_dir_all(&data).map_err(io(&data))?;
    let top: HashSet<String> = ["data", "queries", CARD, MANIFEST, SUMS]
        .into_iter()
        .map(String::from)
        .collect();
    prune(staging, &top)?;
    prune(&data, &names(data_files))?;
    let queries = staging.join("queries");
    if query_files.is_empty() {
        if queries.exists() {
            std::fs::remove_dir_all(&queries).map_err(io(&queries))?;
        }
    } else {
        std::fs::create_dir_all(&queries).map_err(io(&queries))?;
        prune(&queries, &names(query_files))?;
    }
    Ok(())
}

/// The file names of relative paths (`data/x.parquet` → `x.parquet`).
fn names(paths: &[String]) -> HashSet<String> {
    paths
        .iter()
        .filter_map(|p| p.rsplit('/').next())
        .map(String::from)
        .collect()
}

/// Removes every entry of `dir` whose name is not in `keep` (and every `.tmp` file).
fn prune(dir: &Path, keep: &HashSet<String>) -> Result<(), PublishError> {
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if keep.contains(&name) {
            continue;
        }
        let path = entry.path();
        if entry.file_type().map_err(io(&path))?.is_dir() {
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
        } else {
            std::fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    Ok(())
}

/// Where each query-result file goes (`queries/<its name>`); two with one name are refused.
pub fn query_names(results: &[PathBuf]) -> Result<Vec<String>, PublishError> {
    let mut seen = BTreeMap::new();
    for source in results {
        let name = source
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(atomic::TMP_SUFFIX))
            .ok_or_else(|| PublishError::Queries {
                path: source.clone(),
                message: "not a file name".into(),
            })?;
        if let Some(other) = seen.insert(name.clone(), source.clone()) {
            return Err(PublishError::Queries {
                path: source.clone(),
                message: format!(
                    "has the same file name as {}; both would be queries/{name} — rename one",
                    other.display()
                ),
            });
        }
    }
    Ok(results
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| format!("queries/{}", n.to_string_lossy()))
        .collect())
}

/// Copies the query results in (through `.tmp` and a rename each); returns their rows.
pub fn copy_queries(
    results: &[PathBuf],
    names: &[String],
    staging: &Path,
) -> Result<Vec<u64>, PublishError> {
    let mut rows = Vec::with_capacity(results.len());
    for (source, rel) in results.iter().zip(names) {
        let n = embedfleet_core::shardfile::row_count(source).ok().ok_or_else(|| PublishError::Queries {
            path: source.clone(),
            message: "is not a readable parquet file of query results; run `embedfleet query` again or leave it out".into(),
        })?;
        let path = staging.join(rel);
        atomic::copy(source, &path).map_err(io(&path))?;
        rows.push(n);
    }
    Ok(rows)
}

/// Writes `SHA256SUMS` as `sha256sum` prints it — `<hex>  <relative path>`, sorted — over
/// every file of the folder but itself; `known` spares hashing the big files twice. Returns
/// the folder's bytes.
pub fn write_sums(dir: &Path, known: &[FileEntry]) -> Result<u64, PublishError> {
    let mut files = Vec::new();
    list_files(dir, dir, &mut files)?;
    files.sort();
    let (mut sums, mut bytes) = (String::new(), 0u64);
    for rel in files.iter().filter(|f| f.as_str() != SUMS) {
        let path = dir.join(rel);
        let sha = match known.iter().find(|f| &f.path == rel) {
            Some(entry) => entry.sha256.clone(),
            None => embedfleet_core::shardfile::sha256_of(&path).map_err(io(&path))?,
        };
        bytes += std::fs::metadata(&path).map_err(io(&path))?.len();
        sums.push_str(&format!("{sha}  {rel}\n"));
    }
    let path = dir.join(SUMS);
    atomic::write(&path, sums.as_bytes()).map_err(io(&path))?;
    Ok(bytes + sums.len() as u64)
}

/// Relative paths (with `/`) of the files under `dir`.
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), PublishError> {
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        if entry.file_type().map_err(io(&path))?.is_dir() {
            list_files(root, &path, out)?;
            continue;
        }
        let rel = path
            .strip_prefix(root)
            .expect("a listed file is under the folder listed. This is a bug.");
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        out.push(parts.join("/"));
    }
    Ok(())
}

/// Where an earlier publish waits, inside the folder that replaces it, to be removed.
pub const PREVIOUS: &str = ".previous";

/// Puts the finished staging folder in place of `out`. An earlier publish of the same run is
/// moved into the staging folder first (one rename), the staging folder renamed to `out`, and
/// only then the earlier one removed: a kill at any point leaves either `out` whole or the
/// complete staging folder (which a re-run keeps), never a half-removed `out` that a re-run
/// would take for a folder not its own. A leftover `.previous` is always inside a folder of
/// ours: the next publish prunes it from staging, or removes it here.
pub fn replace(staging: &Path, out: &Path) -> Result<(), PublishError> {
    let previous = staging.join(PREVIOUS);
    if out.exists() {
        if previous.exists() {
            std::fs::remove_dir_all(&previous).map_err(io(&previous))?;
        }
        std::fs::rename(out, &previous).map_err(io(out))?;
    }
    std::fs::rename(staging, out).map_err(io(out))?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        // Makes the renames durable; some filesystems refuse a directory fsync, which is fine.
        let _ = File::open(parent).and_then(|d| d.sync_all());
    }
    let left = out.join(PREVIOUS);
    match std::fs::remove_dir_all(&left) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&left)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_staging_folder_sits_beside_out() {
        assert_eq!(
            staging_dir(Path::new("/x/ds")),
            PathBuf::from("/x/ds.partial")
        );
    }

    /// A published folder of this run at `dir`: a manifest of ours and a data file.
    fn publish_at(dir: &Path, version: &str) {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let manifest =
            serde_json::json!({"generator": GENERATOR, "plan_sha256": "p", "v": version});
        std::fs::write(dir.join(MANIFEST), manifest.to_string()).unwrap();
        std::fs::write(dir.join("data/x.parquet"), version).unwrap();
    }

    fn version_at(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("data/x.parquet")).unwrap()
    }

    #[test]
    fn replacing_a_publish_leaves_out_whole_or_the_staging_folder_at_any_kill() {
        let tmp = tempfile::tempdir().unwrap();
        let (out, staging) = (tmp.path().join("ds"), staging_dir(&tmp.path().join("ds")));
        publish_at(&out, "v1");
        publish_at(&staging, "v2");
        replace(&staging, &out).unwrap();
        assert_eq!(version_at(&out), "v2");
        assert!(!staging.exists() && !out.join(PREVIOUS).exists());

        // Killed after the earlier publish went into the staging folder: `out` is gone, the
        // re-run finds no folder in the way and its staging folder complete (`.previous` pruned).
        publish_at(&staging, "v3");
        std::fs::rename(&out, staging.join(PREVIOUS)).unwrap();
        check_out(&out, "p").unwrap();
        prepare(&staging, &["data/x.parquet".into()], &[]).unwrap();
        assert!(!staging.join(PREVIOUS).exists());
        replace(&staging, &out).unwrap();
        assert_eq!(version_at(&out), "v3");

        // Killed while the earlier one was being removed (a half-removed folder inside `out`):
        // `out` is whole and ours, and the next replace removes what was left.
        std::fs::create_dir_all(out.join(PREVIOUS).join("data")).unwrap();
        check_out(&out, "p").unwrap();
        publish_at(&staging, "v4");
        replace(&staging, &out).unwrap();
        assert_eq!(version_at(&out), "v4");
        assert!(!out.join(PREVIOUS).exists() && !staging.exists());
    }

    #[test]
    fn a_foreign_folder_is_refused_and_a_missing_one_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        check_out(&out, "p").unwrap();
        std::fs::create_dir(&out).unwrap();
        assert!(matches!(
            check_out(&out, "p"),
            Err(PublishError::OutExists(_))
        ));
        let manifest = format!(r#"{{"generator": "{GENERATOR} 0.1.0", "plan_sha256": "q"}}"#);
        std::fs::write(out.join(MANIFEST), manifest).unwrap();
        assert!(matches!(
            check_out(&out, "p"),
            Err(PublishError::OutOfAnotherRun(_))
        ));
        check_out(&out, "q").unwrap();
    }

    #[test]
    fn two_query_files_of_one_name_are_refused() {
        let ok = query_names(&[PathBuf::from("a/x.parquet"), PathBuf::from("y.parquet")]);
        assert_eq!(ok.unwrap(), ["queries/x.parquet", "queries/y.parquet"]);
        let clash = query_names(&[PathBuf::from("a/x.parquet"), PathBuf::from("b/x.parquet")]);
        assert!(matches!(clash, Err(PublishError::Queries { .. })));
    }
}
