//! `pk` without a server: usage errors, key handling, client-side checks, config layers and profiles.

use std::path::Path;

use crate::support::*;

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
