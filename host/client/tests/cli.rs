//! End-to-end tests of the `pk` binary.
//!
//! `offline_behaviour` needs no server: usage errors, key handling, client-side path
//! checks. `against_a_real_homeserver` starts the real `homeserver` binary (the sibling
//! of this test's target directory, or `$HOMESERVER_BIN`) on a free port with a
//! throwaway database, blob store and key, and drives keygen → signup → put → get → ls →
//! rm through `pk`. When the binary has not been built (`cargo test -p pk-client` alone
//! does not build it; `cargo test --workspace` does) that test is skipped with a note,
//! unless `PK_E2E_REQUIRE_HOMESERVER=1` or `CI=true` makes it fail instead.
//! `events_against_a_real_homeserver` does the same for `pk events` and `pk stream`
//! (history, filters, a live stream fed by another `pk put`, a refused request).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PK: &str = env!("CARGO_BIN_EXE_pk");

/// Runs `pk` with a clean `PK_*` environment plus `env`, feeding `stdin`.
fn pk(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(PK);
    cmd.args(args)
        .env_remove("PK_HOMESERVER")
        .env_remove("PK_SECRET_KEY")
        .env_remove("PK_SECRET_KEY_FILE")
        .envs(env.iter().copied())
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
        pipe.write_all(input).expect("write stdin");
    }
    child.wait_with_output().expect("pk finishes")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "pk failed ({:?}): {}",
        o.status.code(),
        stderr(o)
    );
}

/// A failure with exit code 1 and one `pk: ...` line containing `needle`.
#[track_caller]
fn assert_fails_with(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(err.starts_with("pk: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn offline_behaviour() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_path = dir.path().join("user.key");
    let key_file = key_path.to_str().expect("utf-8 temp path");

    // Usage errors are clap's: exit code 2.
    for args in [
        &[][..],
        &["frobnicate"],
        &["put", "/pub/x"],
        &["ls", "/pub/", "--limit", "0"],
        &["get", "/pub/x", "--user", "nope"],
    ] {
        let o = pk(args, &[], None);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }

    // keygen without --out: the secret on stdout, the public key on stderr.
    let o = pk(&["keygen"], &[], None);
    assert_ok(&o);
    let secret = stdout(&o).trim().to_owned();
    assert_eq!(secret.len(), 64);
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(stderr(&o).contains("public key: "));

    // keygen --out: file of 64 hex chars, mode 0600, public key on stdout.
    let o = pk(&["keygen", "--out", key_file], &[], None);
    assert_ok(&o);
    let public = stdout(&o).trim().to_owned();
    assert_eq!(public.len(), 52);
    let content = std::fs::read_to_string(&key_path).expect("key file");
    assert_eq!(content.trim().len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_path)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_fails_with(&pk(&["keygen", "--out", key_file], &[], None), "--force");
    assert_eq!(
        std::fs::read_to_string(&key_path).expect("key file"),
        content
    );

    // pubkey from the file (flag or env) and from PK_SECRET_KEY agree.
    let o = pk(&["pubkey", "--key-file", key_file], &[], None);
    assert_ok(&o);
    assert_eq!(stdout(&o).trim(), public);
    let o = pk(&["pubkey"], &[("PK_SECRET_KEY_FILE", key_file)], None);
    assert_eq!(stdout(&o).trim(), public);
    let o = pk(&["pubkey"], &[("PK_SECRET_KEY", content.trim())], None);
    assert_eq!(stdout(&o).trim(), public);

    // --force replaces the key.
    let o = pk(&["keygen", "--out", key_file, "--force"], &[], None);
    assert_ok(&o);
    assert_ne!(stdout(&o).trim(), public);

    // Missing or bad key: says how to provide one.
    let o = pk(&["put", "/pub/x", "-"], &[], Some(b"x"));
    assert_fails_with(&o, "PK_SECRET_KEY");
    assert!(stderr(&o).contains("--key-file"));
    assert_fails_with(
        &pk(&["pubkey"], &[("PK_SECRET_KEY", "zz")], None),
        "invalid secret key",
    );
    let missing = dir.path().join("missing.key");
    let o = pk(
        &["pubkey", "--key-file", missing.to_str().expect("utf-8")],
        &[],
        None,
    );
    assert_fails_with(&o, "cannot read the secret key file");

    // Paths are checked before anything is sent (nothing listens on this port).
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let env = [
        ("PK_SECRET_KEY_FILE", key_file),
        ("PK_HOMESERVER", nowhere.as_str()),
    ];
    assert_fails_with(&pk(&["get", "/etc/passwd"], &env, None), "invalid path");
    assert_fails_with(&pk(&["rm", "/pub/dir/"], &env, None), "must not end with /");

    // An unreachable homeserver is one clear line too.
    assert_fails_with(
        &pk(&["get", "/pub/x"], &env, None),
        "request to the homeserver failed",
    );
    assert_fails_with(
        &pk(
            &["ls", "/pub/"],
            &[
                ("PK_SECRET_KEY_FILE", key_file),
                ("PK_HOMESERVER", "ftp://x"),
            ],
            None,
        ),
        "invalid homeserver URL",
    );
}

/// The `homeserver` process; killed when dropped, its log shown if the test failed.
struct Homeserver {
    child: Child,
    log: PathBuf,
    url: String,
}

impl Homeserver {
    fn binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os("HOMESERVER_BIN") {
            return Some(PathBuf::from(path));
        }
        // target/<profile>/deps/cli-xxxx → target/<profile>/homeserver
        let exe = std::env::current_exe().ok()?;
        let profile_dir = exe.parent()?.parent()?;
        let bin = profile_dir.join(format!("homeserver{}", std::env::consts::EXE_SUFFIX));
        bin.is_file().then_some(bin)
    }

    fn start(bin: &Path, dir: &Path) -> Self {
        let port = free_port();
        let log = dir.join("homeserver.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        // The e2e tests make more anonymous requests than the default limit (10 a
        // minute per IP) allows, and several may run at once: no fixed metrics port.
        let child = Command::new(bin)
            .env("HOMESERVER__RATE_LIMIT__ENABLED", "false")
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

    fn wait_ready(&mut self, port: u16) {
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

    fn log_text(&self) -> String {
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
fn homeserver_binary_or_skip(test: &str) -> Option<PathBuf> {
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

#[test]
fn against_a_real_homeserver() {
    let Some(bin) = homeserver_binary_or_skip("against_a_real_homeserver") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Homeserver::start(&bin, dir.path());
    let key_path = dir.path().join("user.key");
    let key_file = key_path.to_str().expect("utf-8 temp path");
    let env = [
        ("PK_HOMESERVER", server.url.as_str()),
        ("PK_SECRET_KEY_FILE", key_file),
    ];
    let anonymous = [("PK_HOMESERVER", server.url.as_str())];

    let o = pk(&["keygen", "--out", key_file], &[], None);
    assert_ok(&o);
    let user = stdout(&o).trim().to_owned();

    assert_ok(&pk(&["signup"], &env, None));

    // A session limited to /pub/app/: its token writes there and nowhere else.
    let o = pk(
        &["session", "--cap", "write:/pub/app/", "--ttl", "600"],
        &env,
        None,
    );
    assert_ok(&o);
    let token = stdout(&o).trim().to_owned();
    assert_eq!(token.len(), 43, "{token}");
    let put = |path: &str| {
        Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
            .args([
                "-H",
                &format!("Authorization: Bearer {token}"),
                "--data-binary",
                "v",
            ])
            .arg(format!("{}{path}", server.url))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    if let (Ok(inside), Ok(outside)) = (put("/pub/app/x"), put("/pub/other/x")) {
        assert_eq!((inside.as_str(), outside.as_str()), ("200", "403"));
        assert_ok(&pk(&["rm", "/pub/app/x"], &env, None));
    }
    let o = pk(&["session", "--cap", "nonsense"], &env, None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("bad_request"), "{}", stderr(&o));

    // A file, streamed; stored twice in a row (two processes, the same second: the
    // second is an identical signed request and must still go through).
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let input = dir.path().join("data.bin");
    std::fs::write(&input, &data).expect("write input");
    let input = input.to_str().expect("utf-8");
    assert_ok(&pk(&["put", "/pub/e2e/file.bin", input], &env, None));
    assert_ok(&pk(&["put", "/pub/e2e/file.bin", input], &env, None));
    // Standard input.
    assert_ok(&pk(
        &["put", "/pub/e2e/stdin.txt", "-"],
        &env,
        Some(b"hello from stdin\n"),
    ));

    // Read back: to a file, and to stdout.
    let out = dir.path().join("out.bin");
    let out = out.to_str().expect("utf-8");
    assert_ok(&pk(&["get", "/pub/e2e/file.bin", "-o", out], &env, None));
    assert_eq!(std::fs::read(out).expect("output"), data);
    let o = pk(&["get", "/pub/e2e/stdin.txt"], &env, None);
    assert_ok(&o);
    assert_eq!(o.stdout, b"hello from stdin\n");
    // Public read by anyone, without a key.
    let o = pk(
        &["get", "/pub/e2e/stdin.txt", "--user", &user],
        &anonymous,
        None,
    );
    assert_ok(&o);
    assert_eq!(o.stdout, b"hello from stdin\n");

    // Listing: all, paged, followed, reversed, public.
    let both = "/pub/e2e/file.bin\n/pub/e2e/stdin.txt\n";
    let o = pk(&["ls", "/pub/e2e/"], &env, None);
    assert_ok(&o);
    assert_eq!(stdout(&o), both);
    let o = pk(&["ls", "/pub/e2e", "--limit", "1"], &env, None);
    assert_ok(&o);
    assert_eq!(stdout(&o), "/pub/e2e/file.bin\n");
    let cursor_line = stderr(&o);
    let cursor = cursor_line
        .trim()
        .strip_prefix("next cursor: ")
        .unwrap_or_else(|| panic!("no cursor on stderr: {cursor_line}"))
        .to_owned();
    let o = pk(
        &["ls", "/pub/e2e/", "--limit", "1", "--cursor", &cursor],
        &env,
        None,
    );
    assert_ok(&o);
    assert_eq!(stdout(&o), "/pub/e2e/stdin.txt\n");
    let o = pk(&["ls", "/pub/e2e/", "--limit", "1", "--all"], &env, None);
    assert_ok(&o);
    assert_eq!(stdout(&o), both);
    let o = pk(&["ls", "/pub/e2e/", "--reverse"], &env, None);
    assert_eq!(stdout(&o), "/pub/e2e/stdin.txt\n/pub/e2e/file.bin\n");
    let o = pk(&["ls", "/pub/", "--shallow"], &env, None);
    assert_ok(&o);
    assert_eq!(stdout(&o), "/pub/e2e/\n");
    let o = pk(&["ls", "/pub/e2e/", "--user", &user], &anonymous, None);
    assert_ok(&o);
    assert_eq!(stdout(&o), both);

    // Delete, then the entry is gone.
    assert_ok(&pk(&["rm", "/pub/e2e/file.bin"], &env, None));
    let o = pk(&["get", "/pub/e2e/file.bin"], &env, None);
    assert_fails_with(&o, "not_found");
    assert!(stderr(&o).contains("(404)"), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    // A failed read does not create or truncate the output file.
    let untouched = dir.path().join("untouched.bin");
    let untouched = untouched.to_str().expect("utf-8");
    let o = pk(&["get", "/pub/e2e/file.bin", "-o", untouched], &env, None);
    assert_fails_with(&o, "not_found");
    assert!(!Path::new(untouched).exists());
    assert_fails_with(&pk(&["rm", "/pub/e2e/file.bin"], &env, None), "not_found");
    let o = pk(&["ls", "/pub/e2e/"], &env, None);
    assert_eq!(stdout(&o), "/pub/e2e/stdin.txt\n");

    // Writing without a key is refused before anything is sent.
    assert_fails_with(
        &pk(&["rm", "/pub/e2e/stdin.txt"], &anonymous, None),
        "PK_SECRET_KEY",
    );

    drop(server);
}

/// A `pk` process whose standard output is read line by line as it is written.
struct Streaming {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Streaming {
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(PK)
            .args(args)
            .env_remove("PK_HOMESERVER")
            .env_remove("PK_SECRET_KEY")
            .env_remove("PK_SECRET_KEY_FILE")
            .envs(env.iter().copied())
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
    fn next_line(&self, within: Duration) -> String {
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
fn ok_lines(o: &Output) -> Vec<String> {
    assert_ok(o);
    stdout(o).lines().map(str::to_owned).collect()
}

#[test]
fn events_against_a_real_homeserver() {
    let Some(bin) = homeserver_binary_or_skip("events_against_a_real_homeserver") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Homeserver::start(&bin, dir.path());
    let key_path = dir.path().join("user.key");
    let key_file = key_path.to_str().expect("utf-8 temp path");
    let env = [
        ("PK_HOMESERVER", server.url.as_str()),
        ("PK_SECRET_KEY_FILE", key_file),
    ];
    let anonymous = [("PK_HOMESERVER", server.url.as_str())];

    let o = pk(&["keygen", "--out", key_file], &[], None);
    assert_ok(&o);
    let user = stdout(&o).trim().to_owned();
    assert_ok(&pk(&["signup"], &env, None));

    // Two values, then one of them deleted: three events.
    assert_ok(&pk(&["put", "/pub/ev/a", "-"], &env, Some(b"first")));
    assert_ok(&pk(&["put", "/pub/ev/b", "-"], &env, Some(b"second")));
    assert_ok(&pk(&["rm", "/pub/ev/a"], &env, None));

    // The feed, in order, with strictly increasing cursors.
    let feed = ok_lines(&pk(&["events"], &anonymous, None));
    assert_eq!(feed.len(), 3, "{feed:?}");
    let fields: Vec<Vec<&str>> = feed.iter().map(|l| l.split(' ').collect()).collect();
    let url_a = format!("pk://{user}/pub/ev/a");
    let url_b = format!("pk://{user}/pub/ev/b");
    assert_eq!(fields[0][1..3], ["PUT", url_a.as_str()]);
    assert_eq!(fields[1][1..3], ["PUT", url_b.as_str()]);
    assert_eq!(fields[2][1..], ["DEL", url_a.as_str()]);
    assert_eq!((fields[0].len(), fields[1].len()), (4, 4), "{feed:?}");
    assert_ne!(
        fields[0][3], fields[1][3],
        "different values, different hashes"
    );
    let cursors: Vec<u64> = fields
        .iter()
        .map(|f| f[0].parse().expect("numeric cursor"))
        .collect();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "{cursors:?}");
    let (c1, c3) = (cursors[0].to_string(), cursors[2].to_string());

    // JSON lines carry the same events.
    let json = ok_lines(&pk(&["events", "--json"], &anonymous, None));
    let parsed: Vec<serde_json::Value> = json
        .iter()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(parsed.len(), 3);
    assert_eq!(parsed[0]["type"], "PUT");
    assert_eq!(parsed[0]["url"], url_a.as_str());
    assert_eq!(parsed[0]["cursor"], cursors[0]);
    assert_eq!(parsed[0]["content_hash"], fields[0][3]);
    assert_eq!(parsed[2]["type"], "DEL");
    assert!(parsed[2].get("content_hash").is_none());

    // Paging: one full page says where to go on; --all follows to the end.
    let o = pk(&["events", "--limit", "1"], &anonymous, None);
    assert_eq!(ok_lines(&o), feed[..1]);
    assert_eq!(stderr(&o).trim(), format!("next cursor: {c1}"));
    let o = pk(&["events", "--limit", "1", "--all"], &anonymous, None);
    assert_eq!(ok_lines(&o), feed);
    let o = pk(&["events", "--cursor", &c1], &anonymous, None);
    assert_eq!(ok_lines(&o), feed[1..]);
    let o = pk(&["events", "--cursor", &c3], &anonymous, None);
    assert!(ok_lines(&o).is_empty());

    // The user's stream without --live: exactly the history, then the command ends.
    let o = pk(&["stream", &user], &anonymous, None);
    assert_eq!(ok_lines(&o), feed);
    // `me` is the configured key; filters are the server's.
    assert_eq!(ok_lines(&pk(&["stream", "me"], &env, None)), feed);
    let o = pk(&["stream", &user, "--reverse"], &anonymous, None);
    let reversed: Vec<String> = feed.iter().rev().cloned().collect();
    assert_eq!(ok_lines(&o), reversed);
    let o = pk(&["stream", &user, "--cursor", &c1], &anonymous, None);
    assert_eq!(ok_lines(&o), feed[1..]);
    let o = pk(&["stream", &format!("{user}:{c1}")], &anonymous, None);
    assert_eq!(ok_lines(&o), feed[1..]);
    let o = pk(&["stream", &user, "--path", "/pub/ev/b"], &anonymous, None);
    assert_eq!(ok_lines(&o), feed[1..2]);
    let o = pk(&["stream", &user, "--limit", "2"], &anonymous, None);
    assert_eq!(ok_lines(&o), feed[..2]);
    let o = pk(&["stream", &user, "--json"], &anonymous, None);
    assert_eq!(ok_lines(&o), json);

    // Live: the history first, then a new event shortly after another `pk put`.
    let live = Streaming::spawn(&["stream", &user, "--live"], &anonymous);
    for expected in &feed {
        assert_eq!(&live.next_line(Duration::from_secs(10)), expected);
    }
    assert_ok(&pk(&["put", "/pub/ev/c", "-"], &env, Some(b"third")));
    let line = live.next_line(Duration::from_secs(10));
    let new: Vec<&str> = line.split(' ').collect();
    assert_eq!(
        new[1..3],
        ["PUT", format!("pk://{user}/pub/ev/c").as_str()],
        "{line}"
    );
    assert!(new[0].parse::<u64>().expect("numeric cursor") > cursors[2]);
    drop(live);

    // Refused requests: the server's message, exit code 1.
    let o = pk(&["stream", &user, "--limit", "0"], &anonymous, None);
    assert_fails_with(&o, "bad_request (400)");
    assert!(stderr(&o).contains("limit"), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    assert_fails_with(
        &pk(&["stream", &user, "--live", "--reverse"], &anonymous, None),
        "bad_request (400)",
    );
    // `me` without a key says how to configure one.
    assert_fails_with(&pk(&["stream", "me"], &anonymous, None), "PK_SECRET_KEY");

    drop(server);
}
