//! What every `pk` test uses: a clean `pk` command, output checks and a `pk` whose
//! output is read as it is written; the real `homeserver` process comes from hs-testkit
//! (shared with pkbot's end-to-end tests).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub use hs_testkit::{Homeserver, free_port, homeserver_binary_or_skip};

pub const PK: &str = env!("CARGO_BIN_EXE_pk");

/// A `pk` command with a clean environment: no `PK_*` variables, and a home folder of
/// its own (so no user's config file or keys are read); `env` goes on top.
pub fn pk_command(env: &[(&str, &str)]) -> Command {
    clean_command(PK, env)
}

/// `program` with the clean environment of [`pk_command`].
pub fn clean_command(program: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(program);
    for name in [
        "PK_HOMESERVER",
        "PK_SECRET_KEY",
        "PK_SECRET_KEY_FILE",
        "PK_CONFIG",
        "PK_PROFILE",
        "PK_RETRIES",
        "PK_PKARR_BOOTSTRAP",
        "PK_PKARR_RELAYS",
        "XDG_CONFIG_HOME",
    ] {
        cmd.env_remove(name);
    }
    cmd.env("HOME", empty_home()).envs(env.iter().copied());
    cmd
}

/// A home folder with nothing in it, shared by the tests that do not make their own.
pub fn empty_home() -> PathBuf {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pk-cli-empty-home");
    std::fs::create_dir_all(&home).expect("create the empty home");
    home
}

/// Runs `pk` with a clean environment plus `env`, feeding `stdin`.
pub fn pk(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Output {
    let mut cmd = pk_command(env);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("pk starts");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin piped");
        // pk may refuse (no key, say) and exit before it reads its input.
        if let Err(e) = pipe.write_all(input) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
        }
    }
    child.wait_with_output().expect("pk finishes")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
pub fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "pk failed ({:?}): {}",
        o.status.code(),
        stderr(o)
    );
}

/// A failure with exit code 1 and one `pk: ...` line containing `needle`.
#[track_caller]
pub fn assert_fails_with(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(err.starts_with("pk: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

/// Runs `pk` with its standard output on a terminal (a pseudo-terminal made by
/// util-linux `script`); `None`, with a note, where `script` is not installed.
pub fn pk_in_terminal(args: &[&str], env: &[(&str, &str)]) -> Option<Output> {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIPPED terminal checks: util-linux `script` is not installed");
        return None;
    }
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let line: Vec<String> = std::iter::once(PK)
        .chain(args.iter().copied())
        .map(quote)
        .collect();
    let output = clean_command("script", env)
        .args(["-q", "-e", "-c", &line.join(" "), "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script runs");
    Some(output)
}

/// The single JSON object `pk --json` wrote on standard error.
#[track_caller]
pub fn json_error(o: &Output) -> serde_json::Value {
    serde_json::from_str(stderr(o).trim())
        .unwrap_or_else(|e| panic!("stderr is not one JSON object ({e}): {}", stderr(o)))
}

/// The single JSON object `pk --json` wrote on standard output.
#[track_caller]
pub fn json_out(o: &Output) -> serde_json::Value {
    assert_ok(o);
    serde_json::from_str(stdout(o).trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {}", stdout(o)))
}

/// A `pk` process whose standard output is read line by line as it is written.
pub struct Streaming {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Streaming {
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = pk_command(env)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("pk starts");
        let out = child.stdout.take().expect("stdout piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    #[track_caller]
    pub fn next_line(&self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("no line from pk within {within:?}: {e}"))
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pk` stdout as lines, after checking that it succeeded.
#[track_caller]
pub fn ok_lines(o: &Output) -> Vec<String> {
    assert_ok(o);
    stdout(o).lines().map(str::to_owned).collect()
}
