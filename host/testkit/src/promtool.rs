//! `promtool` (Debian's `prometheus` package; .ci/run installs it) for the tests that
//! lint metrics or check alert rules: run it, or skip with the reason printed, and with
//! `CI=true` fail instead of skipping.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// What one promtool run said.
pub struct PromtoolRun {
    pub success: bool,
    /// Its stdout and stderr (promtool writes to both).
    pub output: String,
}

/// Runs `promtool ARGS` in `dir` with `stdin` as its input; `None`, with the reason
/// printed, when promtool is not installed (a failure when `CI=true`).
pub fn promtool(test: &str, dir: &Path, args: &[&str], stdin: &str) -> Option<PromtoolRun> {
    let child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: CI=true and promtool cannot run ({e}); apt-get install prometheus"
            );
            eprintln!("SKIPPED {test}: promtool not installed ({e}); apt-get install prometheus");
            return None;
        }
    };
    // promtool may exit before reading its input (a usage error): not a failure here.
    let _ = child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(stdin.as_bytes());
    let out = child.wait_with_output().expect("promtool runs");
    Some(PromtoolRun {
        success: out.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    })
}

/// `promtool check metrics` on an exposition `text`: it must lint clean (skipped, with
/// the reason printed, without promtool).
pub fn check_metrics(test: &str, text: &str) {
    if let Some(run) = promtool(test, Path::new("."), &["check", "metrics"], text) {
        assert!(
            run.success,
            "promtool check metrics failed:\n{}",
            run.output
        );
    }
}
