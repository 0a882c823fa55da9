//! The `embedfleet` binary: parse the command line, call one library function, map the outcome
//! to an exit code (docs/commands.md, "Exit codes"). Everything else lives in the library crates.

mod cli;
mod commands;

fn main() {
    end_quietly_when_the_reader_goes();
    let cli = cli::parse();
    init_tracing(cli.verbose);
    let code = match commands::run(cli) {
        Ok(code) => code,
        Err(failure) => {
            for line in failure.lines() {
                eprintln!("{line}");
            }
            failure.process_exit_code()
        }
    };
    std::process::exit(code);
}

/// A command whose stdout or stderr reader has gone (`status | head -1`, a log pipe whose
/// reader exited) ends as coreutils do, by SIGPIPE, quietly, instead of the panic Rust's
/// printing raises on a closed pipe. SIGPIPE itself stays ignored otherwise: a scheduler
/// command that exits before reading its script from stdin must fail that one call, not kill
/// the submit loop. One whose stderr is on a full disk (a job's log) ends with exit code 6, the
/// full disk's, never a panic's 101. Nothing is half-written at any moment the process ends:
/// every file the run keeps is written atomically, run.db in transactions.
fn end_quietly_when_the_reader_goes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        let printing = message.starts_with("failed printing to std");
        let closed_pipe = printing
            && message.contains(&std::io::Error::from_raw_os_error(libc::EPIPE).to_string());
        if printing && embedfleet_core::space::says_disk_full(message) {
            // Its log is on a full filesystem (a job's stderr on the run directory's disk):
            // nothing more can be said there. The exit code says it (docs/commands.md, "Exit
            // codes"); the owner reads it from the scheduler.
            std::process::exit(embedfleet_core::exit::DISK_FULL);
        }
        if closed_pipe {
            // SAFETY: restoring the default action of a signal and raising it on this very
            // process: the process ends here, as `cat` would on a closed pipe.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::raise(libc::SIGPIPE);
            }
        }
        default(info);
    }));
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        // qdrant-edge warns about its own uninitialised globals (feature flags, mmap check) on
        // every open; nothing a user can act on.
        0 => "warn,qdrant_edge=error",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("EMBEDFLEET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
