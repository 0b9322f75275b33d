//! `hs-load`: parse the command line and hand over to [`hs_loadgen::cli`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = hs_loadgen::cli::Cli::parse();
    match hs_loadgen::cli::execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hs-load: {error:#}");
            ExitCode::FAILURE
        }
    }
}
