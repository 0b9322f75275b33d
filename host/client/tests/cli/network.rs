//! `pk` with keys only: a local DHT, raw-public-key TLS, migrating between homeservers.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

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
