//! The `embedfleet` binary: parse the command line, call one library function, map the outcome
//! to an exit code (docs/commands.md, "Exit codes"). Everything else lives in the library crates.

mod cli;
mod commands;

use clap::Parser;
use embedfleet_core::exit;

fn main() {
    let cli = cli::Cli::parse();
    init_tracing(cli.verbose);
    let code = match commands::run(cli) {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                exit::SUCCESS
            } else {
                eprintln!("error: {err}");
                for cause in err.chain().skip(1) {
                    eprintln!("  caused by: {cause}");
                }
                commands::exit_code(&err)
            }
        }
    };
    std::process::exit(code);
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
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
