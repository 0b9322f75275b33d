//! `pk events` and `pk stream` against a real homeserver.

use std::time::Duration;

use crate::support::*;

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
