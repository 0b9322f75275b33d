//! `pk`: the command-line client of the homeserver. Everything lives in [`cli`].

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
