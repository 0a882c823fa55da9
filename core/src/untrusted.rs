//! Reading files that others may have planted. A run directory sits on a shared filesystem
//! where other users can often write (project spaces with umask 002); a name the owner reads
//! (a result manifest, a shard) may be a symlink to `/dev/zero`, a FIFO whose `open` blocks for
//! ever, or a device. These reads take regular files only: the last component is never
//! followed (`O_NOFOLLOW`), the open never waits (`O_NONBLOCK`, so a FIFO opens at once and is
//! then refused by its type), and whole-file reads are capped, so no read hangs a command or
//! grows without bound.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Opens `path` for reading when it is a regular file; a link, FIFO, socket or device is an
/// [`io::ErrorKind::InvalidInput`] error saying so.
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => not_regular("a symbolic link"),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    if kind.is_dir() {
        // Not a lasting verdict: a name briefly a directory is what a stale NFS handle or a
        // rename in flight looks like from here; it is read again later.
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "a directory, not a regular file (for now?)",
        ));
    }
    if !kind.is_file() {
        use std::os::unix::fs::FileTypeExt;
        return Err(not_regular(if kind.is_fifo() {
            "a FIFO"
        } else {
            "a device or socket"
        }));
    }
    Ok(file)
}

/// Whether a failed read will fail the same way until someone changes the file: not a regular
/// file (a link, a FIFO, a device: [`open_regular`]), larger than such a file can be
/// ([`read_capped`]), or not readable by this user (`EACCES`: another user's file). Other
/// errors (a stale NFS handle, `EIO`, a directory for now) are worth reading again.
pub fn is_lasting(e: &io::Error) -> bool {
    use io::ErrorKind::{InvalidData, InvalidInput, PermissionDenied};
    matches!(e.kind(), InvalidData | InvalidInput | PermissionDenied)
}

/// The bytes of the regular file `path`, refused ([`io::ErrorKind::InvalidData`]) when it holds
/// more than `max` bytes.
pub fn read_capped(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than the {max} bytes such a file can hold: not one of ours"),
        ));
    }
    Ok(bytes)
}

fn not_regular(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}, not a regular file: never read (someone else's, planted in the run directory?)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_fifos_and_devices_are_refused_at_once_and_big_files_capped() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo only makes the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let zero = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for (path, what) in [
            (&fifo, "a FIFO"),
            (&zero, "a symbolic link"),
            (&Path::new("/dev/zero").to_path_buf(), "a device"),
        ] {
            let err = read_capped(path, 1024).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{path:?}: {err}");
            assert!(err.to_string().contains(what), "{err}");
        }
        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b'x'; 2048]).unwrap();
        let err = read_capped(&big, 1024).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(read_capped(&big, 2048).unwrap().len(), 2048);
    }
}
