//! What every `pk` test uses: a clean `pk` command, output checks, a real `homeserver`
//! process and a `pk` whose output is read as it is written.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The `homeserver` process; killed when dropped, its log shown if the test failed.
pub struct Homeserver {
    pub child: Child,
    pub log: PathBuf,
    pub url: String,
}

impl Homeserver {
    pub fn binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os("HOMESERVER_BIN") {
            return Some(PathBuf::from(path));
        }
        // target/<profile>/deps/cli-xxxx → target/<profile>/homeserver
        let exe = std::env::current_exe().ok()?;
        let profile_dir = exe.parent()?.parent()?;
        let bin = profile_dir.join(format!("homeserver{}", std::env::consts::EXE_SUFFIX));
        bin.is_file().then_some(bin)
    }

    pub fn start(bin: &Path, dir: &Path) -> Self {
        Self::start_with(bin, dir, &[])
    }

    /// Starts the server with `env` on top of the test settings.
    pub fn start_with(bin: &Path, dir: &Path, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let log = dir.join("homeserver.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        // The e2e tests make many requests from one address, faster than any person
        // would (rate limits have tests of their own), and several servers may run at
        // once: no fixed metrics port.
        let child = Command::new(bin)
            .env("HOMESERVER__RATE_LIMIT__ENABLED", "false")
            .env("HOMESERVER__PKARR__ENABLED", "false")
            .env("HOMESERVER__METRICS__LISTEN", "")
            // Compiled guests shared across test servers (safe: written by rename).
            .env(
                "HOMESERVER__POLICIES__CACHE_DIR",
                std::env::temp_dir().join("homeserver-test-guest-cache"),
            )
            .current_dir(dir)
            .env("HOMESERVER__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "HOMESERVER__STORAGE__DATABASE_URL",
                format!("sqlite://{}/hs.db", dir.display()),
            )
            .env(
                "HOMESERVER__STORAGE__BLOBS",
                format!("file://{}/blobs", dir.display()),
            )
            .env(
                "HOMESERVER__KEYS__SECRET_KEY_FILE",
                dir.join("server.key").display().to_string(),
            )
            .env(
                "HOMESERVER__POLICIES__DIR",
                dir.join("policies").display().to_string(),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log fd"))
            .stderr(log_file)
            .spawn()
            .expect("homeserver starts");
        let mut server = Self {
            child,
            log,
            url: format!("http://127.0.0.1:{port}"),
        };
        server.wait_ready(port);
        server
    }

    pub fn wait_ready(&mut self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "homeserver exited with {status} before listening:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "homeserver did not listen on {port} within 60 s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Homeserver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- homeserver log ---\n{}", self.log_text());
        }
    }
}

/// The homeserver binary, or `None` (with a note) when the test should be skipped.
pub fn homeserver_binary_or_skip(test: &str) -> Option<PathBuf> {
    let bin = Homeserver::binary();
    if bin.is_none() {
        let msg = "homeserver binary not built next to this test (run `cargo build -p homeserver` \
                   with the same target dir, or set HOMESERVER_BIN)";
        // In CI (CI=true) a missing binary is a failure, never a silent pass.
        assert!(
            std::env::var_os("PK_E2E_REQUIRE_HOMESERVER").is_none()
                && std::env::var("CI").as_deref() != Ok("true"),
            "{msg}"
        );
        eprintln!("SKIPPED {test}: {msg}");
    }
    bin
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
