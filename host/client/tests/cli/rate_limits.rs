//! `pk` and the server's rate limits: signed feeds escape the IP's limit, `Retry-After` is honoured.

use crate::support::*;

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
