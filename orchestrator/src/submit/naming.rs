//! Job names: every job of a run carries the run's tag, so that a restarted loop finds its
//! jobs (and only its own) by name, and each backend gets a name it keeps whole.

use std::path::Path;

use crate::scheduler::Backend;

/// The tag in every job name of the run in `run_dir`: 16 hex digits, all 64 bits of a hash of
/// its absolute path. A restarted loop adopts a job by its name, so the tag must tell this
/// run's jobs from every other run's of the same user; 16 bits did not.
pub fn run_tag(run_dir: &Path) -> String {
    let path = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
    let hash = xxhash_rust::xxh3::xxh3_64(path.as_os_str().as_encoded_bytes());
    format!("{hash:016x}")
}

/// The name of attempt `attempt` of the job whose first batch is `first_batch`, in the run
/// tagged `tag`: `ef<tag>-b<batch, 6 digits>-a<attempt>`, unique to the run, the batch and
/// the attempt (e.g. `ef0123456789abcdef-b000042-a2`), as `backend` keeps it whole (see
/// [`fit_job_name`]).
pub fn job_name(tag: &str, backend: Backend, first_batch: i64, attempt: u32) -> String {
    fit_job_name(backend, format!("ef{tag}-b{first_batch:06}-a{attempt}"))
}

/// `name` as `backend` keeps it whole: a backend with a limit on names
/// ([`BackendKind::max_job_name`](crate::scheduler::BackendKind::max_job_name), PBS's 15) gets a
/// short form of a longer one, `e` and hex digits of a hash of it (56 bits for PBS).
///
/// A name the server cut would not be found again by a restarted loop, and cutting our own
/// would drop the tag or the attempt. The short form is as unique in practice but says nothing
/// to a reader; the job's rows in run.db say which batch and attempt it is. Slurm and the local
/// backend have no such limit and keep the readable name.
pub fn fit_job_name(backend: Backend, name: String) -> String {
    match backend.kind().max_job_name() {
        Some(max) if name.len() > max => {
            let digits = max.saturating_sub(1).clamp(1, 16);
            let hash = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
            format!("e{:0digits$x}", hash >> (64 - 4 * digits))
        }
        _ => name,
    }
}
