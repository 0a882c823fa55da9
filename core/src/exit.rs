//! Process exit codes, documented in docs/commands.md, "Exit codes". Stable: scripts depend on
//! them.

/// Everything asked for was done.
pub const SUCCESS: i32 = 0;
/// The command failed; the message says why and what to do.
pub const FAILURE: i32 = 1;
/// The command line was wrong (clap's own code).
pub const USAGE: i32 = 2;
/// The command finished, but some input could not be used whole (a corrupt corpus file, a failed
/// batch): the run is usable and `embedfleet status` lists what is missing.
pub const PARTIAL: i32 = 3;
/// The run directory refused the command (changed corpus, different settings).
pub const REFUSED: i32 = 4;
/// The node's device refused what the run asks (a GPU without FP8 tensor cores, no usable
/// cuDNN, a kernel that failed its check there): another node, or another queue, may not. The
/// submit loop sets the job's queue aside at the first and retries its batch on the others.
pub const DEVICE_REFUSED: i32 = 5;
/// The run directory's filesystem (or a log's) is full, or the user's quota there exceeded: the
/// environment's fault, not the input's. Nothing partial is kept; the same command goes on once
/// there is room (the submit loop waits for it instead of ending: docs/commands.md, "Exit codes").
pub const DISK_FULL: i32 = 6;
