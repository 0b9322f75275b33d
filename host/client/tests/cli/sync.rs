//! `pk cp` and `pk sync` against a real homeserver: folders both ways.

use std::path::Path;

use crate::support::*;

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
