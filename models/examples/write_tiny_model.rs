//! Writes the tiny random model (the default family's: Qwen3) used by tests and the golden
//! script.
//!
//! `cargo run -p embedfleet-models --example write_tiny_model -- DIR [SEED]`

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: write_tiny_model DIR [SEED]");
        return ExitCode::from(2);
    };
    let seed = match args.next().map(|s| s.parse::<u64>()) {
        None => 0,
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            eprintln!("error: SEED must be an unsigned integer: {e}");
            return ExitCode::from(2);
        }
    };
    match embedfleet_models::write_tiny_model(&dir, seed) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
