//! End-to-end tests of the `pk` binary.
//!
//! Offline (no server): `offline_behaviour` (usage errors, key handling, client-side
//! path checks, the unreachable-server message, `host:port` without a scheme, `--json`
//! errors, shell completions), `keys_default_to_the_config_folder` (`pk keygen` saves to
//! ~/.config/pk/keys, 0600, never clobbers; `*.key` is git-ignored) and
//! `config_file_and_profiles` (the layers defaults → config file → environment → flags,
//! profiles, and mistakes named).
//!
//! Against the real `homeserver` binary (the sibling of this test's target directory, or
//! `$HOMESERVER_BIN`) on a free port with a throwaway database, blob store and key:
//! `against_a_real_homeserver` (keygen → signup twice → whoami → put → get, `-o` without
//! clobbering, binary refused on a terminal → stat → ls, `-l`, `--json` → rm, `rm -r`),
//! `events_against_a_real_homeserver` (`pk events` and `pk stream`: history, filters, a
//! live stream fed by another `pk put`, a refused request), `sync_and_cp_against_a_real_
//! homeserver` (folders both ways, only changed files sent, `--delete`, `--dry-run`,
//! single-file `cp`) and `rate_limits_against_a_real_homeserver` (feeds signed with a key
//! escape the IP's limit; `Retry-After` honoured). When the binary has not been built
//! (`cargo test -p pk-client` alone does not build it; `cargo test --workspace` does)
//! these are skipped with a note, unless `PK_E2E_REQUIRE_HOMESERVER=1` or `CI=true`
//! makes them fail instead.
//!
//! Every `pk` runs with a clean environment and a home folder of its own, so the user's
//! own config and keys are never read or written.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PK: &str = env!("CARGO_BIN_EXE_pk");

/// A `pk` command with a clean environment: no `PK_*` variables, and a home folder of
/// its own (so no user's config file or keys are read); `env` goes on top.
fn pk_command(env: &[(&str, &str)]) -> Command {
    clean_command(PK, env)
}

/// `program` with the clean environment of [`pk_command`].
fn clean_command(program: &str, env: &[(&str, &str)]) -> Command {
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
fn empty_home() -> PathBuf {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pk-cli-empty-home");
    std::fs::create_dir_all(&home).expect("create the empty home");
    home
}

/// Runs `pk` with a clean environment plus `env`, feeding `stdin`.
fn pk(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Output {
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

/// Runs `pk` with its standard output on a terminal (a pseudo-terminal made by
/// util-linux `script`); `None`, with a note, where `script` is not installed.
fn pk_in_terminal(args: &[&str], env: &[(&str, &str)]) -> Option<Output> {
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
fn json_error(o: &Output) -> serde_json::Value {
    serde_json::from_str(stderr(o).trim())
        .unwrap_or_else(|e| panic!("stderr is not one JSON object ({e}): {}", stderr(o)))
}

/// The single JSON object `pk --json` wrote on standard output.
#[track_caller]
fn json_out(o: &Output) -> serde_json::Value {
    assert_ok(o);
    serde_json::from_str(stdout(o).trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {}", stdout(o)))
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

    // keygen --print: the secret on stdout, the public key on stderr.
    let o = pk(&["keygen", "--print"], &[], None);
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
    assert_fails_with(
        &pk(&["rm", "/pub/dir/"], &env, None),
        "use `pk rm -r /pub/dir/`",
    );

    // An unreachable homeserver is one clear line too, with a hint.
    let o = pk(&["get", "/pub/x"], &env, None);
    assert_fails_with(
        &o,
        &format!("cannot connect to the homeserver at {nowhere}"),
    );
    assert!(
        stderr(&o).contains("is the homeserver running?"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("PK_HOMESERVER"), "{}", stderr(&o));
    // host:port without a scheme means http://host:port.
    let bare = nowhere.trim_start_matches("http://");
    let o = pk(
        &["--homeserver", bare, "get", "/pub/x"],
        &[("PK_SECRET_KEY_FILE", key_file)],
        None,
    );
    assert_fails_with(
        &o,
        &format!("cannot connect to the homeserver at {nowhere}"),
    );
    assert!(!stderr(&o).contains("relative URL"), "{}", stderr(&o));
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

    // --json: a failure is one JSON object on stderr, with a stable code.
    let o = pk(&["--json", "get", "/etc/passwd"], &env, None);
    assert_eq!(o.status.code(), Some(1));
    let err = json_error(&o);
    assert_eq!(err["error"], "invalid_path");
    assert!(
        err["message"]
            .as_str()
            .expect("message")
            .contains("/etc/passwd")
    );
    assert!(o.stdout.is_empty());
    let err = json_error(&pk(&["--json", "get", "/pub/x"], &env, None));
    assert_eq!(err["error"], "unreachable");
    let o = pk(&["--json", "frobnicate"], &[], None);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(json_error(&o)["error"], "usage");
    let o = pk(
        &["--json", "pubkey"],
        &[("PK_SECRET_KEY_FILE", key_file)],
        None,
    );
    assert_eq!(json_out(&o)["public_key"].as_str().map(str::len), Some(52));

    // Shell completions know the commands.
    for (shell, marker) in [
        ("bash", "complete -F _pk"),
        ("zsh", "#compdef pk"),
        ("fish", "complete -c pk"),
    ] {
        let o = pk(&["completions", shell], &[], None);
        assert_ok(&o);
        let script = stdout(&o);
        assert!(script.contains(marker), "{shell}: {script}");
        for command in ["sync", "whoami", "keygen"] {
            assert!(script.contains(command), "{shell} lacks {command}");
        }
    }
}

#[test]
fn keys_default_to_the_config_folder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let home_str = home.to_str().expect("utf-8");
    let env = [("HOME", home_str)];

    let o = pk(&["keygen"], &env, None);
    assert_ok(&o);
    let public = stdout(&o).trim().to_owned();
    assert_eq!(public.len(), 52);
    let key = home.join(".config/pk/keys/default.key");
    assert!(
        stderr(&o).contains(&key.display().to_string()),
        "{}",
        stderr(&o)
    );
    let content = std::fs::read_to_string(&key).expect("key file");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&key), 0o600);
        assert_eq!(mode(key.parent().expect("keys dir")), 0o700);
    }
    // Never replaced by accident.
    assert_fails_with(&pk(&["keygen"], &env, None), "--force");
    assert_eq!(std::fs::read_to_string(&key).expect("key file"), content);
    // Found without any setting.
    let o = pk(&["pubkey"], &env, None);
    assert_ok(&o);
    assert_eq!(stdout(&o).trim(), public);
    let o = pk(&["--json", "keygen", "--force"], &env, None);
    let made = json_out(&o);
    assert_ne!(made["public_key"], public.as_str());
    assert_eq!(made["key_file"], key.to_str().expect("utf-8"));

    // XDG_CONFIG_HOME moves the folder.
    let xdg = dir.path().join("xdg");
    let xdg_env = [
        ("HOME", home_str),
        ("XDG_CONFIG_HOME", xdg.to_str().expect("utf-8")),
    ];
    assert_ok(&pk(&["keygen"], &xdg_env, None));
    assert!(xdg.join("pk/keys/default.key").is_file());

    // Without a key, the message says where `pk keygen` would put one.
    let empty = dir.path().join("empty");
    let o = pk(
        &["pubkey"],
        &[("HOME", empty.to_str().expect("utf-8"))],
        None,
    );
    assert_fails_with(&o, "pk keygen");
    assert!(stderr(&o).contains(".config/pk/keys"), "{}", stderr(&o));

    // The repository's .gitignore keeps key files out of commits.
    let gitignore = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.gitignore");
    let ignored = std::fs::read_to_string(gitignore).expect(".gitignore");
    assert!(ignored.lines().any(|l| l.trim() == "*.key"), "{ignored}");
}

#[test]
fn config_file_and_profiles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let home_str = home.to_str().expect("utf-8");
    let config_dir = home.join(".config/pk");
    std::fs::create_dir_all(&config_dir).expect("config dir");
    let config = config_dir.join("config.toml");
    // Nothing listens on the work profile's homeserver: commands show where they went.
    let work_port = free_port();
    std::fs::write(
        &config,
        format!(
            "profile = \"work\"\n\
             [profiles.default]\nhomeserver = \"http://127.0.0.1:1\"\n\
             [profiles.work]\nhomeserver = \"127.0.0.1:{work_port}\"\nkey_file = \"keys/work.key\"\n"
        ),
    )
    .expect("write config");
    let env = [("HOME", home_str)];

    // `pk keygen` writes the profile's key file; `pk config` shows every origin.
    let o = pk(&["keygen"], &env, None);
    assert_ok(&o);
    let public = stdout(&o).trim().to_owned();
    let shown = json_out(&pk(&["--json", "config"], &env, None));
    assert_eq!(shown["config_file"], config.to_str().expect("utf-8"));
    assert_eq!(shown["profiles"], serde_json::json!(["default", "work"]));
    assert_eq!(
        (&shown["profile"], &shown["profile_origin"]),
        (&"work".into(), &"config file".into())
    );
    let work_url = format!("127.0.0.1:{work_port}");
    assert_eq!(shown["homeserver"], work_url.as_str());
    assert_eq!(shown["homeserver_origin"], "config file");
    let work_key = config_dir.join("keys/work.key");
    assert_eq!(shown["key"], work_key.to_str().expect("utf-8"));
    assert_eq!(shown["public_key"], public.as_str());
    let text = stdout(&pk(&["config"], &env, None));
    assert!(text.contains("profile      work (config file)"), "{text}");
    // Commands use the profile's homeserver.
    let o = pk(&["ls", "/pub/"], &env, None);
    assert_fails_with(
        &o,
        &format!("cannot connect to the homeserver at http://127.0.0.1:{work_port}"),
    );

    // PK_PROFILE and --profile choose another; the environment beats the file, flags
    // beat the environment.
    let shown = json_out(&pk(
        &["--json", "config"],
        &[("HOME", home_str), ("PK_PROFILE", "default")],
        None,
    ));
    assert_eq!(shown["homeserver"], "http://127.0.0.1:1");
    assert_eq!(shown["profile_origin"], "environment");
    assert!(shown["key"].is_null());
    let shown = json_out(&pk(
        &["--json", "--profile", "default", "config"],
        &[
            ("HOME", home_str),
            ("PK_HOMESERVER", "http://env.example:3"),
        ],
        None,
    ));
    assert_eq!(shown["profile_origin"], "flag");
    assert_eq!(
        (&shown["homeserver"], &shown["homeserver_origin"]),
        (&"http://env.example:3".into(), &"environment".into())
    );
    let shown = json_out(&pk(
        &["--json", "--homeserver", "http://flag.example:4", "config"],
        &[
            ("HOME", home_str),
            ("PK_HOMESERVER", "http://env.example:3"),
        ],
        None,
    ));
    assert_eq!(
        (&shown["homeserver"], &shown["homeserver_origin"]),
        (&"http://flag.example:4".into(), &"flag".into())
    );
    let secret = std::fs::read_to_string(&work_key).expect("key");
    let shown = json_out(&pk(
        &["--json", "config"],
        &[("HOME", home_str), ("PK_SECRET_KEY", secret.trim())],
        None,
    ));
    assert_eq!(shown["key_origin"], "environment");
    assert!(
        !stdout(&pk(
            &["config"],
            &[("HOME", home_str), ("PK_SECRET_KEY", secret.trim())],
            None
        ))
        .contains(secret.trim()),
        "never prints a secret"
    );

    // Mistakes are named: an unknown profile, an unknown key, a missing PK_CONFIG.
    assert_fails_with(
        &pk(&["--profile", "nope", "config"], &env, None),
        "no profile `nope`",
    );
    let other = dir.path().join("other.toml");
    std::fs::write(&other, "[profiles.default]\nhomeservr = \"x\"\n").expect("write");
    let other_str = other.to_str().expect("utf-8");
    let o = pk(
        &["config"],
        &[("HOME", home_str), ("PK_CONFIG", other_str)],
        None,
    );
    assert_fails_with(&o, "homeservr");
    assert!(stderr(&o).contains(other_str), "{}", stderr(&o));
    let missing = dir.path().join("missing.toml");
    assert_fails_with(
        &pk(
            &["config"],
            &[
                ("HOME", home_str),
                ("PK_CONFIG", missing.to_str().expect("utf-8")),
            ],
            None,
        ),
        "cannot read the config file",
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
        Self::start_with(bin, dir, &[])
    }

    /// Starts the server with `env` on top of the test settings.
    fn start_with(bin: &Path, dir: &Path, env: &[(&str, &str)]) -> Self {
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

    // Before signing up, whoami says so.
    let o = pk(&["whoami"], &env, None);
    assert_ok(&o);
    assert!(stdout(&o).contains("not signed up"), "{}", stdout(&o));
    assert_eq!(
        json_out(&pk(&["--json", "whoami"], &env, None))["signed_up"],
        false
    );

    let o = pk(&["signup"], &env, None);
    assert_ok(&o);
    assert!(
        stdout(&o).starts_with(&format!("signed up {user}")),
        "{}",
        stdout(&o)
    );
    // Signing up again is harmless and says so.
    let o = pk(&["signup"], &env, None);
    assert_ok(&o);
    assert!(
        stdout(&o).starts_with(&format!("already signed up: {user}")),
        "{}",
        stdout(&o)
    );
    let again = json_out(&pk(&["--json", "signup"], &env, None));
    assert_eq!(
        (&again["created"], &again["public_key"]),
        (&false.into(), &user.as_str().into())
    );

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
    // -o never replaces a file without --force.
    std::fs::write(out, b"precious").expect("write");
    assert_fails_with(
        &pk(&["get", "/pub/e2e/file.bin", "-o", out], &env, None),
        "--force",
    );
    assert_eq!(std::fs::read(out).expect("output"), b"precious");
    let saved = json_out(&pk(
        &["--json", "get", "/pub/e2e/file.bin", "-o", out, "--force"],
        &env,
        None,
    ));
    assert_eq!(std::fs::read(out).expect("output"), data);
    let hash = pk_client::transfer::content_hash_of(&data);
    assert_eq!(saved["content_hash"], hash.as_str());
    assert_eq!(saved["size"], data.len());
    // A binary value goes to a pipe as it is, but not to a terminal.
    let o = pk(&["get", "/pub/e2e/file.bin"], &env, None);
    assert_ok(&o);
    assert_eq!(o.stdout, data);
    if let Some(o) = pk_in_terminal(&["get", "/pub/e2e/file.bin"], &env) {
        let shown = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "{shown}");
        assert!(
            shown.contains("is not text") && shown.contains("-o FILE"),
            "{shown}"
        );
        assert!(
            shown.len() < 1000,
            "no value bytes on the terminal: {shown}"
        );
        let o = pk_in_terminal(&["get", "/pub/e2e/stdin.txt"], &env).expect("script");
        assert_eq!(o.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&o.stdout).contains("hello from stdin"));
        let o = pk_in_terminal(&["get", "/pub/e2e/file.bin", "--force"], &env).expect("script");
        assert_eq!(o.status.code(), Some(0));
        assert!(o.stdout.len() >= data.len());
    }

    // stat: size, content hash and update time without reading the value.
    let stat = json_out(&pk(&["--json", "stat", "/pub/e2e/file.bin"], &env, None));
    assert_eq!(stat["size"], data.len());
    assert_eq!(stat["content_hash"], hash.as_str());
    assert!(stat["updated_at"].as_i64().expect("updated_at") > 1_600_000_000);
    let o = pk(&["stat", "/pub/e2e/file.bin"], &env, None);
    assert_ok(&o);
    assert!(
        stdout(&o).contains(&format!("content hash  {hash}")),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("size          300000 (293.0 KiB)"),
        "{}",
        stdout(&o)
    );
    assert_fails_with(
        &pk(&["stat", "/pub/e2e/none"], &env, None),
        "no entry at /pub/e2e/none",
    );

    // whoami: the account's usage and quota.
    let me = json_out(&pk(&["--json", "whoami"], &env, None));
    assert_eq!(me["public_key"], user.as_str());
    assert_eq!(me["homeserver"], server.url.as_str());
    assert_eq!(me["signed_up"], true);
    assert_eq!(
        me["account"]["used_bytes"],
        data.len() + b"hello from stdin\n".len()
    );
    assert_eq!(me["account"]["quota_bytes"], 100 * 1024 * 1024);
    let o = pk(&["whoami"], &env, None);
    assert_ok(&o);
    assert!(stdout(&o).contains("used of 100.0 MiB"), "{}", stdout(&o));
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
    // -l: size, update time (UTC) and path.
    let o = pk(&["ls", "-l", "/pub/e2e/"], &env, None);
    assert_ok(&o);
    let long: Vec<Vec<String>> = stdout(&o)
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    assert_eq!(long.len(), 2, "{long:?}");
    assert_eq!(
        (long[0][0].as_str(), long[0][3].as_str()),
        ("300000", "/pub/e2e/file.bin")
    );
    assert_eq!(
        (long[1][0].as_str(), long[1][3].as_str()),
        ("17", "/pub/e2e/stdin.txt")
    );
    assert!(long[0][1].len() == 10 && long[0][2].len() == 8, "{long:?}");
    let columns: Vec<Option<usize>> = stdout(&o).lines().map(|l| l.find("/pub/")).collect();
    assert_eq!(columns[0], columns[1], "paths aligned: {}", stdout(&o));
    // --json: the listing as the API gives it, with content hashes.
    let listing = json_out(&pk(
        &["--json", "ls", "/pub/e2e/", "--limit", "1", "--all"],
        &env,
        None,
    ));
    assert_eq!(listing["entries"][0]["path"], "/pub/e2e/file.bin");
    assert_eq!(listing["entries"][0]["content_hash"], hash.as_str());
    assert_eq!(listing["entries"][1]["size"], 17);
    assert_eq!(listing["has_more"], false);

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

    // rm -r: everything under a folder.
    for path in ["/pub/tree/a", "/pub/tree/b/c", "/pub/treeside"] {
        let put = json_out(&pk(&["--json", "put", path, "-"], &env, Some(b"x")));
        assert_eq!((&put["path"], &put["size"]), (&path.into(), &1.into()));
    }
    assert_fails_with(
        &pk(&["rm", "/pub/tree/"], &env, None),
        "pk rm -r /pub/tree/",
    );
    let removed = json_out(&pk(&["--json", "rm", "-r", "/pub/tree"], &env, None));
    assert_eq!(
        removed["deleted"],
        serde_json::json!(["/pub/tree/a", "/pub/tree/b/c"])
    );
    assert_eq!(
        stdout(&pk(&["ls", "/pub/"], &env, None)),
        "/pub/e2e/stdin.txt\n/pub/treeside\n"
    );
    assert_fails_with(
        &pk(&["rm", "-r", "/pub/tree/"], &env, None),
        "nothing to delete",
    );
    let removed = json_out(&pk(&["--json", "rm", "/pub/treeside"], &env, None));
    assert_eq!(removed["path"], "/pub/treeside");

    drop(server);
}

/// Writes `files` (relative path, content) under `root`.
fn write_tree(root: &Path, files: &[(&str, &[u8])]) {
    for (rel, content) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, content).expect("write");
    }
}

/// The relative paths of a `pk --json cp/sync` report's list `field`, sorted.
fn reported(report: &serde_json::Value, field: &str, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = report[field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field} in {report}"))
        .iter()
        .map(|v| {
            let path = v["path"].as_str().or_else(|| v.as_str()).expect("a path");
            path.strip_prefix(prefix).unwrap_or(path).to_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn sync_and_cp_against_a_real_homeserver() {
    let Some(bin) = homeserver_binary_or_skip("sync_and_cp_against_a_real_homeserver") else {
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
    let o = pk(&["keygen", "--out", key_file], &[], None);
    assert_ok(&o);
    let user = stdout(&o).trim().to_owned();
    assert_ok(&pk(&["signup"], &env, None));

    let site = dir.path().join("site");
    let blob: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    write_tree(
        &site,
        &[
            ("index.html", b"one"),
            ("a/b/deep.txt", b"two"),
            ("a/blob.bin", &blob),
        ],
    );
    let site_str = site.to_str().expect("utf-8");
    let sync_up = |extra: &[&str]| {
        let mut args = vec!["--json", "sync", site_str, "/pub/site/"];
        args.extend_from_slice(extra);
        json_out(&pk(&args, &env, None))
    };

    // First sync: everything goes up; the second sends nothing.
    let report = sync_up(&[]);
    assert_eq!(
        reported(&report, "uploaded", "/pub/site/"),
        ["a/b/deep.txt", "a/blob.bin", "index.html"]
    );
    assert_eq!(report["bytes"], blob.len() + 6);
    let report = sync_up(&[]);
    assert!(reported(&report, "uploaded", "").is_empty(), "{report}");
    assert_eq!(report["unchanged"], 3);
    assert_eq!(
        stdout(&pk(&["get", "/pub/site/a/b/deep.txt"], &env, None)),
        "two"
    );

    // Changes: one file grows, one changes at the same size (only the hash tells), one
    // is removed, one is new. Without --delete the server keeps the removed one.
    write_tree(
        &site,
        &[
            ("index.html", b"one!"),
            ("a/b/deep.txt", b"tw0"),
            ("new.txt", b"3"),
        ],
    );
    std::fs::remove_file(site.join("a/blob.bin")).expect("rm");
    let report = sync_up(&[]);
    assert_eq!(
        reported(&report, "uploaded", "/pub/site/"),
        ["a/b/deep.txt", "index.html", "new.txt"]
    );
    assert!(reported(&report, "deleted", "").is_empty());
    let report = sync_up(&["--delete", "--dry-run"]);
    assert_eq!(report["dry_run"], true);
    assert_eq!(reported(&report, "deleted", "/pub/site/"), ["a/blob.bin"]);
    assert_ok(&pk(&["stat", "/pub/site/a/blob.bin"], &env, None));
    let report = sync_up(&["--delete"]);
    assert_eq!(reported(&report, "deleted", "/pub/site/"), ["a/blob.bin"]);
    assert_eq!(report["unchanged"], 3);
    assert_eq!(
        stdout(&pk(&["ls", "/pub/site/"], &env, None)),
        "/pub/site/a/b/deep.txt\n/pub/site/index.html\n/pub/site/new.txt\n"
    );

    // Down: into a new folder, then only what changed on the server.
    let out = dir.path().join("out");
    let out_str = out.to_str().expect("utf-8");
    let sync_down = |extra: &[&str]| {
        let mut args = vec!["--json", "sync", "/pub/site/", out_str];
        args.extend_from_slice(extra);
        json_out(&pk(&args, &env, None))
    };
    let report = sync_down(&[]);
    assert_eq!(
        reported(&report, "downloaded", "/pub/site/"),
        ["a/b/deep.txt", "index.html", "new.txt"]
    );
    for rel in ["a/b/deep.txt", "index.html", "new.txt"] {
        assert_eq!(
            std::fs::read(out.join(rel)).expect("downloaded"),
            std::fs::read(site.join(rel)).expect("source"),
            "{rel}"
        );
    }
    assert_eq!(sync_down(&[])["unchanged"], 3);
    assert_ok(&pk(
        &["put", "/pub/site/index.html", "-"],
        &env,
        Some(b"edited on the server"),
    ));
    write_tree(&out, &[("extra.txt", b"local only")]);
    let report = sync_down(&[]);
    assert_eq!(
        reported(&report, "downloaded", "/pub/site/"),
        ["index.html"]
    );
    assert_eq!(
        std::fs::read(out.join("index.html")).expect("updated"),
        b"edited on the server"
    );
    assert!(out.join("extra.txt").exists());
    let report = sync_down(&["--delete"]);
    assert_eq!(report["deleted"].as_array().map(Vec::len), Some(1));
    assert!(!out.join("extra.txt").exists());
    // Anyone can mirror public data, without a key.
    let public = dir.path().join("public");
    let report = json_out(&pk(
        &[
            "--json",
            "sync",
            "/pub/site/",
            public.to_str().expect("utf-8"),
            "--user",
            &user,
        ],
        &[("PK_HOMESERVER", server.url.as_str())],
        None,
    ));
    assert_eq!(report["downloaded"].as_array().map(Vec::len), Some(3));

    // Text output: one line per action, a summary on stderr. (index.html was edited on
    // the server, so the local one goes up again.)
    write_tree(&site, &[("new.txt", b"4")]);
    let o = pk(&["sync", site_str, "/pub/site/"], &env, None);
    assert_ok(&o);
    assert_eq!(
        stdout(&o),
        format!(
            "uploaded {} → /pub/site/index.html (4 B)\nuploaded {} → /pub/site/new.txt (1 B)\n",
            site.join("index.html").display(),
            site.join("new.txt").display()
        )
    );
    assert!(
        stderr(&o).contains("2 uploaded, 0 downloaded, 0 deleted, 1 unchanged"),
        "{}",
        stderr(&o)
    );

    // cp: single files both ways; an identical file is left alone, a different one
    // needs --force.
    let single = site.join("new.txt");
    let report = json_out(&pk(
        &[
            "--json",
            "cp",
            single.to_str().expect("utf-8"),
            "/pub/single/",
        ],
        &env,
        None,
    ));
    assert_eq!(reported(&report, "uploaded", ""), ["/pub/single/new.txt"]);
    let copy = dir.path().join("copy.txt");
    let copy_str = copy.to_str().expect("utf-8");
    let report = json_out(&pk(
        &["--json", "cp", "/pub/single/new.txt", copy_str],
        &env,
        None,
    ));
    assert_eq!(report["downloaded"].as_array().map(Vec::len), Some(1));
    assert_eq!(std::fs::read(&copy).expect("copy"), b"4");
    let report = json_out(&pk(
        &["--json", "cp", "/pub/single/new.txt", copy_str],
        &env,
        None,
    ));
    assert_eq!(report["unchanged"], 1);
    std::fs::write(&copy, b"mine").expect("write");
    assert_fails_with(
        &pk(&["cp", "/pub/single/new.txt", copy_str], &env, None),
        "--force",
    );
    assert_eq!(std::fs::read(&copy).expect("copy"), b"mine");
    assert_ok(&pk(
        &["cp", "/pub/single/new.txt", copy_str, "--force"],
        &env,
        None,
    ));
    assert_eq!(std::fs::read(&copy).expect("copy"), b"4");
    // cp -r of a folder; without -r a folder is refused.
    let tree = dir.path().join("tree");
    let tree_str = tree.to_str().expect("utf-8");
    let report = json_out(&pk(
        &["--json", "cp", "-r", "/pub/site/", tree_str],
        &env,
        None,
    ));
    assert_eq!(report["downloaded"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        std::fs::read(tree.join("a/b/deep.txt")).expect("copied"),
        b"tw0"
    );
    assert_fails_with(&pk(&["cp", "/pub/site/", tree_str], &env, None), "cp -r");
    assert_fails_with(&pk(&["cp", site_str, "/pub/x/"], &env, None), "cp -r");
    assert_fails_with(&pk(&["cp", site_str, tree_str], &env, None), "neither path");

    // A file name the server would refuse: nothing is sent at all.
    let bad = dir.path().join("bad");
    write_tree(&bad, &[("fine.txt", b"1"), ("not fine.txt", b"2")]);
    let o = pk(
        &["sync", bad.to_str().expect("utf-8"), "/pub/bad/"],
        &env,
        None,
    );
    assert_fails_with(&o, "nothing was sent");
    assert!(stderr(&o).contains("not fine.txt"), "{}", stderr(&o));
    assert_eq!(stdout(&pk(&["ls", "/pub/bad/"], &env, None)), "");

    drop(server);
}

#[test]
fn rate_limits_against_a_real_homeserver() {
    let Some(bin) = homeserver_binary_or_skip("rate_limits_against_a_real_homeserver") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // One anonymous request a minute per IP (the signup below uses it), plenty per key.
    let strict = [
        ("HOMESERVER__RATE_LIMIT__ENABLED", "true"),
        ("HOMESERVER__RATE_LIMIT__ANONYMOUS_PER_MINUTE", "1"),
        ("HOMESERVER__RATE_LIMIT__AUTHENTICATED_PER_MINUTE", "1000"),
    ];
    let server = Homeserver::start_with(&bin, dir.path(), &strict);
    let key_path = dir.path().join("user.key");
    let key_file = key_path.to_str().expect("utf-8 temp path");
    let env = [
        ("PK_HOMESERVER", server.url.as_str()),
        ("PK_SECRET_KEY_FILE", key_file),
    ];
    let anonymous = [("PK_HOMESERVER", server.url.as_str())];
    assert_ok(&pk(&["keygen", "--out", key_file], &[], None));
    assert_ok(&pk(&["signup"], &env, None));
    assert_ok(&pk(&["put", "/pub/r/a", "-"], &env, Some(b"a")));

    // Without a key, the IP's limit (already used up by the signup) answers at once
    // with the server's message (--retries 0: no waiting).
    let mut refused = None;
    for _ in 0..5 {
        let o = pk(&["--json", "--retries", "0", "events"], &anonymous, None);
        if !o.status.success() {
            refused = Some(o);
            break;
        }
    }
    let refused = refused.expect("one anonymous request a minute is exceeded");
    let err = json_error(&refused);
    assert_eq!(
        (&err["error"], &err["status"]),
        (&"rate_limit_exceeded".into(), &429.into())
    );
    assert!(
        err["message"]
            .as_str()
            .expect("message")
            .contains("retry in"),
        "{err}"
    );
    // With a key, feed and stream requests are signed: the key's limit applies, not the
    // IP's exhausted one.
    for _ in 0..3 {
        let o = pk(&["--retries", "0", "events"], &env, None);
        assert_ok(&o);
        assert_eq!(stdout(&o).lines().count(), 1);
    }
    assert_ok(&pk(&["--retries", "0", "stream", "me"], &env, None));
    drop(server);

    // A limit that refills every second: pk waits as the server asks and goes on.
    let dir = tempfile::tempdir().expect("tempdir");
    let per_second = [
        ("HOMESERVER__RATE_LIMIT__ENABLED", "true"),
        ("HOMESERVER__RATE_LIMIT__ANONYMOUS_PER_MINUTE", "60"),
    ];
    let server = Homeserver::start_with(&bin, dir.path(), &per_second);
    let anonymous = [("PK_HOMESERVER", server.url.as_str())];
    let mut waited = None;
    for _ in 0..500 {
        let o = pk(&["events"], &anonymous, None);
        assert_ok(&o);
        if stderr(&o).contains("retrying in") {
            waited = Some(stderr(&o));
            break;
        }
    }
    let waited = waited.expect("60 requests a minute were exceeded");
    assert!(
        waited.starts_with(
            "pk: the homeserver is rate limiting this client (429); retrying in 1 s (retry 1 of 5)"
        ),
        "{waited}"
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

#[test]
fn posts_and_replies_against_a_real_homeserver() {
    let Some(bin) = homeserver_binary_or_skip("posts_and_replies_against_a_real_homeserver") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Homeserver::start(&bin, dir.path());
    let (alice_key, bob_key) = (dir.path().join("alice.key"), dir.path().join("bob.key"));
    let (alice_file, bob_file) = (alice_key.to_str().unwrap(), bob_key.to_str().unwrap());
    let alice_env = [
        ("PK_HOMESERVER", server.url.as_str()),
        ("PK_SECRET_KEY_FILE", alice_file),
    ];
    let bob_env = [
        ("PK_HOMESERVER", server.url.as_str()),
        ("PK_SECRET_KEY_FILE", bob_file),
    ];
    assert_ok(&pk(&["keygen", "--out", alice_file], &[], None));
    let bob = stdout(&pk(&["keygen", "--out", bob_file], &[], None))
        .trim()
        .to_owned();
    assert_ok(&pk(&["signup"], &alice_env, None));
    assert_ok(&pk(&["signup"], &bob_env, None));

    let o = pk(&["post", "The bridge opens on Monday."], &alice_env, None);
    assert_ok(&o);
    let root = stdout(&o).trim().to_owned();
    assert!(
        root.starts_with("pubky://") && root.contains("/pub/pubky.app/posts/"),
        "{root}"
    );
    let reply = json_out(&pk(
        &["--json", "post", "Finally!", "--reply-to", &root],
        &bob_env,
        None,
    ));
    assert_eq!(reply["post"]["parent"], root.as_str());
    assert_eq!(reply["post"]["kind"], "short");

    // Anyone can read Bob's replies to the post.
    let o = pk(
        &["replies", &root, "--user", &bob],
        &[("PK_HOMESERVER", server.url.as_str())],
        None,
    );
    assert_ok(&o);
    assert!(stdout(&o).contains("Finally!"), "{}", stdout(&o));
    // None by Alice: an error saying so.
    let alice = stdout(&pk(&["pubkey"], &alice_env, None)).trim().to_owned();
    let o = pk(&["replies", &root, "--user", &alice], &alice_env, None);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no reply"), "{}", stderr(&o));
    // Bad input gets a clear message.
    let o = pk(
        &["post", "x", "--reply-to", "https://example.org"],
        &alice_env,
        None,
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("post URI"), "{}", stderr(&o));
    let long = "x".repeat(2001);
    let o = pk(&["post", &long], &alice_env, None);
    assert!(stderr(&o).contains("at most 2000"), "{}", stderr(&o));
}

/// Only keys, a local DHT and two real homeservers: `pk` finds a homeserver by key and
/// talks to it over raw-public-key TLS, finds a user's homeserver from the user's
/// record, and moves a user to another homeserver (killed halfway, then resumed) with
/// every value copied exactly once and the record updated.
#[test]
fn keys_records_and_migrating_between_homeservers() {
    let Some(bin) = homeserver_binary_or_skip("keys_records_and_migrating_between_homeservers")
    else {
        return;
    };
    let dht = mainline::Testnet::builder(5)
        .bind_address(std::net::Ipv4Addr::LOCALHOST)
        .build()
        .expect("a local DHT");
    let bootstrap = dht.bootstrap.join(",");
    let bootstrap_toml = format!(
        "[{}]",
        dht.bootstrap
            .iter()
            .map(|b| format!("\"{b}\""))
            .collect::<Vec<_>>()
            .join(",")
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let start = |name: &str| {
        let data = dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        let tls = format!("127.0.0.1:{}", free_port());
        let server = Homeserver::start_with(
            &bin,
            &data,
            &[
                ("HOMESERVER__TLS__LISTEN", tls.as_str()),
                ("HOMESERVER__PKARR__ENABLED", "true"),
                ("HOMESERVER__PKARR__BOOTSTRAP", bootstrap_toml.as_str()),
                ("HOMESERVER__PKARR__REQUEST_TIMEOUT_MS", "500"),
            ],
        );
        let info: serde_json::Value = json_out(
            &Command::new("curl")
                .args(["-fsS", &format!("{}/info", server.url)])
                .output()
                .expect("curl"),
        );
        let key = info["public_key"].as_str().unwrap().to_owned();
        (server, key, tls)
    };
    let (a, a_key, a_tls) = start("a");
    let (b, _, b_tls) = start("b");
    let key_path = dir.path().join("alice.key");
    let key_file = key_path.to_str().unwrap();
    let env = |homeserver: &str| {
        vec![
            ("PK_HOMESERVER".to_owned(), homeserver.to_owned()),
            ("PK_SECRET_KEY_FILE".to_owned(), key_file.to_owned()),
            ("PK_PKARR_BOOTSTRAP".to_owned(), bootstrap.clone()),
        ]
    };
    let run = |homeserver: &str, args: &[&str]| {
        let env = env(homeserver);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        pk(args, &env, None)
    };
    assert_ok(&pk(&["keygen", "--out", key_file], &[], None));
    // Signing up on A with --publish hands A the record naming it; `pk publish` puts it
    // on the DHT too.
    assert_ok(&run(&a.url, &["signup", "--publish"]));
    let o = run(&a.url, &["publish"]);
    assert_ok(&o);
    assert!(stdout(&o).contains(&a_key), "{}", stdout(&o));
    // Signing up on B as well (no --publish) does not make B her home: the lookups by
    // her key below still find A.
    let o = run(&b.url, &["signup"]);
    assert_ok(&o);
    assert!(stderr(&o).contains("pk publish"), "{}", stderr(&o));
    for i in 0..40 {
        let value = format!("value {i} ").repeat(50_000);
        let file = dir.path().join("v");
        std::fs::write(&file, value).unwrap();
        assert_ok(&run(
            &a.url,
            &["put", &format!("/pub/v/{i:02}"), file.to_str().unwrap()],
        ));
    }

    // By the server's key alone (its record on the DHT): TLS that accepts only it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = run(&a_key, &["--json", "whoami"]);
        if o.status.success() {
            let who = json_out(&o);
            assert_eq!(who["homeserver"], format!("https://{a_tls}"), "{who}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A's record never resolved: {}",
            stderr(&o)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // By the user's key: her record names A.
    let o = run("pkarr", &["get", "/pub/v/07"]);
    assert_ok(&o);
    assert!(stdout(&o).starts_with("value 7 "));

    // Move to B, killed halfway.
    let mut migrate = {
        let env = env(&a.url);
        let mut cmd = pk_command(
            &env.iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
        );
        cmd.args(["migrate", "--to", &b.url])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pk migrate")
    };
    let alice = stdout(&pk(&["pubkey"], &[("PK_SECRET_KEY_FILE", key_file)], None))
        .trim()
        .to_owned();
    let on_b = |b: &Homeserver| -> usize {
        let o = Command::new("curl")
            .args([
                "-s",
                &format!("{}/pub/v/?limit=1000&pubky-host={alice}", b.url),
            ])
            .output()
            .expect("curl");
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .ok()
            .and_then(|v| v["entries"].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if on_b(&b) >= 5 {
            let _ = migrate.kill();
            break;
        }
        if let Some(status) = migrate.try_wait().unwrap() {
            let mut said = String::new();
            use std::io::Read;
            migrate
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut said)
                .unwrap();
            panic!("migrate ended ({status}) before it could be killed: {said}");
        }
        assert!(Instant::now() < deadline, "migrate copied nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = migrate.wait();
    let copied_before = on_b(&b);
    assert!(copied_before < 40, "killed halfway ({copied_before} of 40)");
    // Resumed: only what is missing is copied; everything verified; the record moves.
    let o = run(&a.url, &["--json", "migrate", "--to", &b.url]);
    assert_ok(&o);
    let summary = json_out(&o);
    assert_eq!(summary["verified"], 40, "{summary}");
    assert_eq!(
        summary["copied"].as_u64().unwrap() + summary["skipped"].as_u64().unwrap(),
        40
    );
    assert!(
        summary["skipped"].as_u64().unwrap() >= copied_before as u64 - 1,
        "{summary}"
    );
    // Identical data, and each value written to B exactly once.
    for i in [0, 13, 39] {
        let path = format!("/pub/v/{i:02}");
        assert_eq!(
            stdout(&run(&a.url, &["get", &path])),
            stdout(&run(&b.url, &["get", &path]))
        );
    }
    let feed = json_out(
        &Command::new("curl")
            .args(["-fsS", &format!("{}/events/?limit=1000", b.url)])
            .output()
            .expect("curl"),
    );
    let puts = feed["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "PUT" && e["url"].as_str().unwrap().contains("/pub/v/"))
        .count();
    assert_eq!(puts, 40, "every value written to B exactly once");
    // Her record now names B.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = run("pkarr", &["--json", "whoami"]);
        if o.status.success() && json_out(&o)["homeserver"] == format!("https://{b_tls}") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the record never named B: {}",
            stdout(&o)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(dht);
}
