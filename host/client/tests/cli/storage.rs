//! `pk` against a real homeserver: keys, signup, put/get/stat/ls/rm, posts and replies.

use std::path::Path;
use std::process::Command;

use crate::support::*;

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
