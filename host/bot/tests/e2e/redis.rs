//! The bot on the Redis bus, as operators run it at scale: a leader process (poller,
//! router, publisher) with a standby, and worker processes of each type, all real
//! processes on one Redis (127.0.0.1:6379, or `PKBOT_TEST_REDIS_URL`) and one database.
//! Workers and leaders are killed with kill -9 and the AI provider fails; every
//! mention still gets exactly one reply (or a dead letter that an operator replays).

use std::process::Command;
use std::time::{Duration, Instant};

use pk_client::PkClient;

use crate::fixture::*;

fn redis_url() -> String {
    std::env::var("PKBOT_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A key prefix of this test's own, or None when there is no Redis (skipped with the
/// reason; a failure under CI=true).
async fn redis_or_skip(test: &str) -> Option<String> {
    let url = redis_url();
    let reached = async {
        let client = redis::Client::open(url.as_str())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    }
    .await;
    if let Err(e) = reached {
        let why = format!("no Redis at {url}: {e}");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and {why}"
        );
        eprintln!("SKIPPED {test}: {why}");
        return None;
    }
    let mut tag = [0u8; 4];
    getrandom::fill(&mut tag).unwrap();
    Some(format!(
        "e2e-{}-{}-{test}:",
        std::process::id(),
        u32::from_le_bytes(tag)
    ))
}

/// The settings every process of one bot shares.
fn shared_env(prefix: &str, ai_base: &str) -> Vec<(String, String)> {
    [
        ("PKBOT__BUS__KIND", "redis"),
        ("PKBOT__BUS__REDIS_URL", redis_url().as_str()),
        ("PKBOT__BUS__PREFIX", prefix),
        ("PKBOT__BUS__CLAIM_IDLE_MS", "1500"),
        ("PKBOT__BUS__LEASE_TTL_MS", "1500"),
        ("PKBOT__BUS__MAX_DELIVERIES", "3"),
        ("PKBOT__AI__BASE_URL", ai_base),
        ("PKBOT__AI__MAX_RETRIES", "0"),
        ("PKBOT__LIMITS__PER_USER_ACTIONS", "10000"),
        ("PKBOT__LIMITS__PER_THREAD_REPLIES", "10000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn start(
    url: &str,
    dir: &std::path::Path,
    name: &str,
    env: &[(String, String)],
    extra: &[(&str, &str)],
) -> BotProcess {
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    all.extend_from_slice(extra);
    BotProcess::start_named(url, dir, name, &all)
}

/// Waits until `f` holds (a generous deadline; never a timing assertion).
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !f().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn role(bot: &BotProcess) -> String {
    bot.health().await["role"].as_str().unwrap_or("").to_owned()
}

async fn busy(bot: &BotProcess) -> u64 {
    bot.health().await["workers"]["summary"]["busy"]
        .as_u64()
        .unwrap_or(0)
}

fn actions_done(bot: &BotProcess) -> usize {
    bot.log_text().matches("\"action done\"").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_share_the_load_and_one_killed_mid_action_loses_nothing() {
    let test = "two_workers_share";
    let Some(bin) = homeserver_binary_or_skip(test) else {
        return;
    };
    let Some(prefix) = redis_or_skip(test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let hs = Homeserver::start(&bin, &dir.path().join("hs"));
    let fake = FakeProviders::start(Duration::from_millis(300)).await;
    let env = shared_env(&prefix, &format!("{}/v1", fake.base()));
    let data = dir.path().join("bot");
    let leader = start(&hs.url, &data, "leader", &env, &[]);
    let mut w1 = start(
        &hs.url,
        &data,
        "summary-1",
        &env,
        &[
            ("WORKER_TYPE", "summary"),
            ("WORKER_CONCURRENCY_SUMMARY", "1"),
        ],
    );
    let mut w2 = start(
        &hs.url,
        &data,
        "summary-2",
        &env,
        &[
            ("WORKER_TYPE", "summary"),
            ("WORKER_CONCURRENCY_SUMMARY", "1"),
        ],
    );
    assert_eq!(role(&w1).await, "summary-worker");
    eventually("the leader leads", || async {
        role(&leader).await == "leader"
    })
    .await;
    let reader = PkClient::new(&hs.url, None).unwrap();
    let handle = format!("pk:{}", leader.key);
    let user = User::new(&hs.url).await;
    let root = user.post("The bridge opened in 2020.", None).await;

    // Both workers get work.
    let mut mentions = Vec::new();
    for _ in 0..8 {
        mentions.push(user.post(&format!("tl;dr {handle}"), Some(&root)).await);
    }
    for mention in &mentions {
        reply_to(&reader, &leader, mention).await;
    }
    let (a, b) = (actions_done(&w1), actions_done(&w2));
    assert_eq!(a + b, 8, "one action per mention");
    assert!(a > 0 && b > 0, "both workers worked: {a} and {b}");

    // A slow action; the worker running it is killed in the middle.
    fake.delay_ms
        .store(4000, std::sync::atomic::Ordering::SeqCst);
    let mention = user.post(&format!("summarize {handle}"), Some(&root)).await;
    let deadline = Instant::now() + WAIT;
    let killed = loop {
        if busy(&w1).await > 0 {
            break 1;
        }
        if busy(&w2).await > 0 {
            break 2;
        }
        assert!(Instant::now() < deadline, "no worker ran the action");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    fake.delay_ms
        .store(100, std::sync::atomic::Ordering::SeqCst);
    let survivor = if killed == 1 {
        w1.kill();
        &w2
    } else {
        w2.kill();
        &w1
    };
    let reply = reply_to(&reader, &leader, &mention).await;
    assert!(reply.content.starts_with("Summary"), "{}", reply.content);
    assert_eq!(replies_to(&reader, leader.key, &mention).await.len(), 1);
    assert_eq!(leader.finished(&mention).await.0, "completed");
    assert!(
        survivor
            .log_text()
            .contains("took over a message another consumer left unfinished"),
        "the survivor did not take the killed worker's message over"
    );
    for mention in &mentions {
        assert_eq!(replies_to(&reader, leader.key, mention).await.len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_message_is_dead_lettered_then_replayed_once_fixed() {
    let test = "poison";
    let Some(bin) = homeserver_binary_or_skip(test) else {
        return;
    };
    let Some(prefix) = redis_or_skip(test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let hs = Homeserver::start(&bin, &dir.path().join("hs"));
    let fake = FakeProviders::start(Duration::ZERO).await;
    let env = shared_env(&prefix, &format!("{}/v1", fake.base()));
    let data = dir.path().join("bot");
    let leader = start(&hs.url, &data, "leader", &env, &[]);
    let _worker = start(
        &hs.url,
        &data,
        "summary",
        &env,
        &[("WORKER_TYPE", "summary")],
    );
    let reader = PkClient::new(&hs.url, None).unwrap();
    let handle = format!("pk:{}", leader.key);
    let user = User::new(&hs.url).await;
    let root = user.post("The bridge opened in 2020.", None).await;

    // The AI API fails every time: three deliveries, then the dead letters.
    fake.failing
        .store(1_000_000, std::sync::atomic::Ordering::SeqCst);
    let mention = user.post(&format!("tl;dr {handle}"), Some(&root)).await;
    let (status, error) = leader.finished(&mention).await;
    assert_eq!(status, "failed");
    let error = error.unwrap_or_default();
    assert!(error.contains("failed 3 times"), "{error}");
    assert!(error.contains("overloaded"), "{error}");
    assert_eq!(
        fake.calls.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "one AI call per delivery (no retries configured)"
    );

    let pkbot = |args: &[&str]| {
        let out = Command::new(PKBOT)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(
                "PKBOT__STORAGE__DATABASE_URL",
                format!("sqlite://{}/bot.db", data.display()),
            )
            .env(
                "PKBOT__IDENTITY__MNEMONIC_FILE",
                data.join("bot.mnemonic").display().to_string(),
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let listed = pkbot(&["dlq", "list", "--json"]);
    let letters: Vec<serde_json::Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(letters.len(), 1, "{listed}");
    assert_eq!(letters[0]["stream"], "action.summary.requested.v1");
    assert_eq!(letters[0]["deliveries"], 4);
    assert!(
        letters[0]["payload"]
            .as_str()
            .unwrap()
            .contains(&mention.key())
    );
    assert!(replies_to(&reader, leader.key, &mention).await.is_empty());

    // Fixed, replayed: one reply, nothing left dead.
    fake.failing.store(0, std::sync::atomic::Ordering::SeqCst);
    let replayed = pkbot(&["dlq", "replay", letters[0]["id"].as_str().unwrap()]);
    assert!(replayed.contains("replayed"), "{replayed}");
    let reply = reply_to(&reader, &leader, &mention).await;
    assert!(reply.content.starts_with("Summary"), "{}", reply.content);
    assert_eq!(leader.finished(&mention).await, ("completed".into(), None));
    assert_eq!(pkbot(&["dlq", "list", "--json"]), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_standby_takes_over_when_the_leader_is_killed() {
    let test = "standby";
    let Some(bin) = homeserver_binary_or_skip(test) else {
        return;
    };
    let Some(prefix) = redis_or_skip(test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let hs = Homeserver::start(&bin, &dir.path().join("hs"));
    let fake = FakeProviders::start(Duration::from_millis(50)).await;
    let env = shared_env(&prefix, &format!("{}/v1", fake.base()));
    let data = dir.path().join("bot");
    let mut first = start(&hs.url, &data, "leader-1", &env, &[]);
    eventually("the first process leads", || async {
        role(&first).await == "leader"
    })
    .await;
    let second = start(&hs.url, &data, "leader-2", &env, &[]);
    let _worker = start(
        &hs.url,
        &data,
        "summary",
        &env,
        &[("WORKER_TYPE", "summary")],
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(role(&second).await, "standby", "only one process leads");
    assert_eq!(role(&first).await, "leader");

    let reader = PkClient::new(&hs.url, None).unwrap();
    let handle = format!("pk:{}", first.key);
    let user = User::new(&hs.url).await;
    let root = user.post("The bridge opened in 2020.", None).await;
    let mut mentions = Vec::new();
    for _ in 0..3 {
        mentions.push(user.post(&format!("tl;dr {handle}"), Some(&root)).await);
    }
    for mention in &mentions {
        reply_to(&reader, &first, mention).await;
    }
    // Killed while mentions keep coming: the standby takes them all, once.
    first.kill();
    for _ in 3..8 {
        mentions.push(user.post(&format!("tl;dr {handle}"), Some(&root)).await);
    }
    eventually("the standby leads", || async {
        role(&second).await == "leader"
    })
    .await;
    for mention in &mentions {
        reply_to(&reader, &second, mention).await;
        assert_eq!(second.finished(mention).await.0, "completed");
    }
    let received = second
        .query_scalar("SELECT COUNT(*) FROM mentions WHERE content LIKE 'tl;dr %'")
        .await;
    assert_eq!(received, 8, "no mention missed or recorded twice");
}

/// The load test: `BOT_LOAD_MENTIONS` mentions (200 by default; the figures in
/// docs/BENCHMARKS.md are from 1,000; `BOT_LOAD_RATE` paces them), half summaries and half fact-checks, through a
/// leader with a standby and two workers of each type, while a summary worker and the
/// leader are killed with kill -9 and the AI API fails now and then. Every mention
/// gets exactly one reply; throughput and mention-to-reply latency are printed (never
/// asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_every_mention_one_reply_while_processes_are_killed() {
    let test = "load";
    let Some(bin) = homeserver_binary_or_skip(test) else {
        return;
    };
    let Some(prefix) = redis_or_skip(test).await else {
        return;
    };
    let total: usize = std::env::var("BOT_LOAD_MENTIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let hs = Homeserver::start(&bin, &dir.path().join("hs"));
    let fake = FakeProviders::start(Duration::from_millis(20)).await;
    let mut env = shared_env(&prefix, &format!("{}/v1", fake.base()));
    env.push(("PKBOT__SEARCH__PROVIDER".into(), "searxng".into()));
    env.push(("PKBOT__SEARCH__BASE_URL".into(), fake.base()));
    env.push(("PKBOT__AI__MAX_RETRIES".into(), "2".into()));
    env.push(("PKBOT__BUS__MAX_DELIVERIES".into(), "10".into()));
    let data = dir.path().join("bot");
    let mut leader = start(&hs.url, &data, "leader-1", &env, &[]);
    eventually("the leader leads", || async {
        role(&leader).await == "leader"
    })
    .await;
    let standby = start(&hs.url, &data, "leader-2", &env, &[]);
    let worker =
        |name: &str, kind: &str| start(&hs.url, &data, name, &env, &[("WORKER_TYPE", kind)]);
    let mut s1 = worker("summary-1", "summary");
    let _s2 = worker("summary-2", "summary");
    let _f1 = worker("factcheck-1", "factcheck");
    let _f2 = worker("factcheck-2", "factcheck");
    let reader = PkClient::new(&hs.url, None).unwrap();
    let handle = format!("pk:{}", leader.key);
    let bot_key = leader.key;
    let users: Vec<User> =
        futures_util::future::join_all((0..10).map(|_| User::new(&hs.url))).await;
    let roots: Vec<_> = futures_util::future::join_all(
        users
            .iter()
            .map(|u| u.post("The bridge opened in 2020.", None)),
    )
    .await;

    let started = Instant::now();
    fake.failing.store(20, std::sync::atomic::Ordering::SeqCst);
    let mut mentions = Vec::with_capacity(total);
    // BOT_LOAD_RATE paces the mentions (per second); unset, they come as fast as the
    // users can post (a burst: what it measures is throughput, and latency is mostly
    // the queue).
    let rate: Option<f64> = std::env::var("BOT_LOAD_RATE")
        .ok()
        .and_then(|r| r.parse().ok());
    for (n, batch) in (0..total).collect::<Vec<_>>().chunks(10).enumerate() {
        if let Some(rate) = rate {
            let due = started + Duration::from_secs_f64(n as f64 * 10.0 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let posted = futures_util::future::join_all(batch.iter().map(|&i| {
            let (user, root) = (&users[i % 10], &roots[i % 10]);
            let text = if i % 2 == 0 {
                format!("tl;dr {handle}")
            } else {
                format!("verify this {handle}")
            };
            async move { user.post(&text, Some(root)).await }
        }))
        .await;
        mentions.extend(posted);
        if mentions.len() == total / 3 {
            s1.kill(); // a summary worker dies mid-run
        }
        if mentions.len() == total / 2 {
            leader.kill(); // and the leader: the standby takes over
        }
    }
    let posted_in = started.elapsed();
    s1.restart();

    // Every mention answered, once.
    let mut latencies = Vec::with_capacity(total);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let replies = posts_of(&reader, bot_key).await;
        if replies.len() >= total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {total} replies:\n{}",
            replies.len(),
            standby.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let elapsed = started.elapsed();
    // A late duplicate would show after the count was reached: look again once the
    // workers have had a claim time and more to settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let replies = posts_of(&reader, bot_key).await;
    let mut by_parent = std::collections::HashMap::new();
    for (uri, post) in &replies {
        let parent = post.parent.clone().expect("a reply");
        *by_parent.entry(parent.clone()).or_insert(0) += 1;
        let mention = pkbot::post::PostUri::parse(&parent).unwrap();
        latencies.push(uri.timestamp_micros().unwrap() - mention.timestamp_micros().unwrap());
    }
    assert_eq!(replies.len(), total, "no doubled reply");
    for mention in &mentions {
        assert_eq!(by_parent.get(&mention.to_string()), Some(&1), "{mention}");
    }
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)] as f64 / 1000.0
    };
    if let Ok(keep) = std::env::var("BOT_LOAD_LOGS") {
        // For a look at where the time went (each process's JSON log).
        for entry in std::fs::read_dir(&data).unwrap().flatten() {
            if entry.path().extension().is_some_and(|e| e == "log") {
                let _ = std::fs::copy(
                    entry.path(),
                    std::path::Path::new(&keep).join(entry.file_name()),
                );
            }
        }
    }
    eprintln!(
        "LOAD {total} mentions: posted in {:.1} s, all replied in {:.1} s ({:.1} replies/s); \
         mention-to-reply p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; AI calls {}",
        posted_in.as_secs_f64(),
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        pct(0.50),
        pct(0.99),
        pct(1.0),
        fake.calls.load(std::sync::atomic::Ordering::SeqCst),
    );
}
