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
fn shared_env(prefix: &str, ai_base: &str, db: &TestDb) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
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
    .collect();
    env.push(db.env());
    env
}

/// Which database a test's processes share.
#[derive(Clone, Copy)]
enum Db {
    Sqlite,
    Postgres,
}

/// One bot on Redis, before its processes start: a homeserver, a fake AI and search
/// provider, the settings every process shares, and its database.
struct Setup {
    hs: Homeserver,
    fake: FakeProviders,
    env: Vec<(String, String)>,
    data: std::path::PathBuf,
    _db: TestDb,
    _dir: tempfile::TempDir,
}

/// Everything a test on Redis needs, or None when something is missing (skipped with
/// the reason printed: no homeserver binary, no Redis, no PostgreSQL).
async fn setup(test: &str, db: Db, ai_delay: Duration) -> Option<Setup> {
    let bin = homeserver_binary_or_skip(test)?;
    let prefix = redis_or_skip(test).await?;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("bot");
    let db = match db {
        Db::Sqlite => TestDb::sqlite(&data),
        Db::Postgres => TestDb::postgres(test).await?,
    };
    let hs = Homeserver::start(&bin, &dir.path().join("hs"));
    let fake = FakeProviders::start(ai_delay).await;
    let env = shared_env(&prefix, &format!("{}/v1", fake.base()), &db);
    Some(Setup {
        hs,
        fake,
        env,
        data,
        _db: db,
        _dir: dir,
    })
}

impl Setup {
    /// Starts one process of the bot, logging to `<name>.log`.
    fn start(&self, name: &str, extra: &[(&str, &str)]) -> BotProcess {
        let mut all: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        all.extend_from_slice(extra);
        BotProcess::start_named(&self.hs.url, &self.data, name, &all)
    }

    /// Runs `pkbot ARGS` with the bot's settings; its standard output.
    fn pkbot(&self, args: &[&str]) -> String {
        let out = Command::new(PKBOT)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(
                "PKBOT__IDENTITY__MNEMONIC_FILE",
                self.data.join("bot.mnemonic").display().to_string(),
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pkbot {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `pkbot dlq list --json`, parsed.
    fn dead_letters(&self) -> Vec<serde_json::Value> {
        self.pkbot(&["dlq", "list", "--json"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn reader(&self) -> PkClient {
        PkClient::new(&self.hs.url, None).unwrap()
    }

    fn user(&self) -> impl std::future::Future<Output = User> + '_ {
        User::new(&self.hs.url)
    }
}

/// Waits until `f` holds (a generous deadline; never a timing assertion).
async fn eventually<F, Fut>(what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    hs_testkit::eventually(what, WAIT, f).await;
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
    let Some(bot) = setup(
        "two_workers_share",
        Db::Postgres,
        Duration::from_millis(300),
    )
    .await
    else {
        return;
    };
    let fake = &bot.fake;
    let leader = bot.start("leader", &[]);
    let worker = |name: &str| {
        bot.start(
            name,
            &[
                ("WORKER_TYPE", "summary"),
                ("WORKER_CONCURRENCY_SUMMARY", "1"),
            ],
        )
    };
    let (mut w1, mut w2) = (worker("summary-1"), worker("summary-2"));
    assert_eq!(role(&w1).await, "summary-worker");
    eventually("the leader leads", || async {
        role(&leader).await == "leader"
    })
    .await;
    let reader = bot.reader();
    let handle = format!("pk:{}", leader.key);
    let user = bot.user().await;
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
    assert_eq!(one_success_each(&leader).await, 9);
}

/// Every mention's action succeeded once: the number of mentions with a success
/// (asserting none has two).
async fn one_success_each(bot: &BotProcess) -> i64 {
    let doubled = bot
        .query_scalar(
            "SELECT COUNT(*) FROM (SELECT mention_id FROM action_executions \
             WHERE status = 'success' GROUP BY mention_id HAVING COUNT(*) > 1) doubled",
        )
        .await;
    assert_eq!(doubled, 0, "an action recorded two successes");
    let routed_twice = bot
        .query_scalar(
            "SELECT COUNT(*) FROM (SELECT mention_id FROM routing_decisions \
             GROUP BY mention_id HAVING COUNT(*) > 1) doubled",
        )
        .await;
    assert_eq!(routed_twice, 0);
    bot.query_scalar("SELECT COUNT(*) FROM action_executions WHERE status = 'success'")
        .await
}

/// Failures that will not pass, each dead-lettered with its reason (in the
/// `dead_letters` table and `dead-letter.v1`), listed by `pkbot dlq list` and answered
/// once after `pkbot dlq replay`: an AI API failing every time (5xx: each delivery
/// tried, then dead), one refusing the request (400: at once), and the router's AI
/// classifier answering twice with the wrong shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_that_will_not_pass_are_dead_lettered_then_replayed_once_fixed() {
    let Some(bot) = setup("dead_letters", Db::Postgres, Duration::ZERO).await else {
        return;
    };
    let fake = &bot.fake;
    let leader = bot.start("leader", &[]);
    let _worker = bot.start("summary", &[("WORKER_TYPE", "summary")]);
    let reader = bot.reader();
    let handle = format!("pk:{}", leader.key);
    let user = bot.user().await;
    let root = user.post("The bridge opened in 2020.", None).await;
    use std::sync::atomic::Ordering::SeqCst;

    // The AI API fails every time: three deliveries, then the dead letters.
    fake.failing.store(1_000_000, SeqCst);
    let overloaded = user.post(&format!("tl;dr {handle}"), Some(&root)).await;
    let (status, error) = leader.finished(&overloaded).await;
    assert_eq!(status, "failed");
    let error = error.unwrap_or_default();
    assert!(error.contains("failed 3 times"), "{error}");
    assert!(error.contains("overloaded"), "{error}");
    assert_eq!(
        fake.calls.load(SeqCst),
        3,
        "one AI call per delivery (no retries configured)"
    );
    fake.failing.store(0, SeqCst);

    // A 400: dead at the first delivery, with the provider's reason.
    fake.rejecting.store(1_000_000, SeqCst);
    let rejected = user.post(&format!("summarize {handle}"), Some(&root)).await;
    let (status, error) = leader.finished(&rejected).await;
    assert_eq!(status, "failed");
    assert!(
        error.as_deref().unwrap_or("").contains("Invalid model"),
        "{error:?}"
    );
    assert_eq!(fake.calls.load(SeqCst), 4, "a 400 is not tried again");
    fake.rejecting.store(0, SeqCst);

    // The router: keywords of both actions go to the AI classifier, which answers
    // twice with the wrong shape.
    fake.off_schema.store(2, SeqCst);
    let unclear = user
        .post(&format!("tl;dr or verify? {handle}"), Some(&root))
        .await;
    let (status, error) = leader.finished(&unclear).await;
    assert_eq!(status, "failed");
    assert!(
        error.as_deref().unwrap_or("").contains("no usable answer"),
        "{error:?}"
    );
    let routed: i64 = leader
        .query_scalar("SELECT COUNT(*) FROM routing_decisions")
        .await;
    assert_eq!(routed, 2, "no decision stored for the unclear mention");

    let letters = bot.dead_letters();
    assert_eq!(letters.len(), 3, "{letters:?}");
    let streams: Vec<&str> = letters
        .iter()
        .map(|l| l["stream"].as_str().unwrap())
        .collect();
    assert_eq!(
        streams,
        [
            "action.summary.requested.v1",
            "action.summary.requested.v1",
            "mention.received.v1"
        ]
    );
    assert_eq!(letters[0]["deliveries"], 4);
    assert!(
        letters[0]["payload"]
            .as_str()
            .unwrap()
            .contains(&overloaded.key())
    );
    let recorded: i64 = leader
        .query_scalar("SELECT COUNT(*) FROM dead_letters WHERE bus_id IS NOT NULL")
        .await;
    assert_eq!(recorded, 3, "every dead letter is in the database too");
    for mention in [&overloaded, &rejected, &unclear] {
        assert!(replies_to(&reader, leader.key, mention).await.is_empty());
    }

    // Fixed, replayed (one by id, then the rest): one reply each, nothing left dead.
    let replayed = bot.pkbot(&["dlq", "replay", letters[0]["id"].as_str().unwrap()]);
    assert!(replayed.contains("replayed"), "{replayed}");
    let reply = reply_to(&reader, &leader, &overloaded).await;
    assert!(reply.content.starts_with("Summary"), "{}", reply.content);
    assert_eq!(
        leader.finished(&overloaded).await,
        ("completed".into(), None)
    );
    bot.pkbot(&["dlq", "replay"]);
    for mention in [&rejected, &unclear] {
        reply_to(&reader, &leader, mention).await;
        assert_eq!(leader.finished(mention).await.0, "completed");
    }
    assert_eq!(bot.pkbot(&["dlq", "list", "--json"]), "");
    let left: i64 = leader
        .query_scalar("SELECT COUNT(*) FROM dead_letters")
        .await;
    assert_eq!(left, 0);
    assert_eq!(one_success_each(&leader).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_standby_takes_over_when_the_leader_is_killed() {
    let Some(bot) = setup("standby", Db::Postgres, Duration::from_millis(50)).await else {
        return;
    };
    let mut first = bot.start("leader-1", &[]);
    eventually("the first process leads", || async {
        role(&first).await == "leader"
    })
    .await;
    let second = bot.start("leader-2", &[]);
    let _worker = bot.start("summary", &[("WORKER_TYPE", "summary")]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(role(&second).await, "standby", "only one process leads");
    assert_eq!(role(&first).await, "leader");

    let reader = bot.reader();
    let handle = format!("pk:{}", first.key);
    let user = bot.user().await;
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

/// The leader is killed in the middle of a burst, and the standby takes over: every
/// mention is routed once and its action runs once (one AI call, one successful
/// execution, one reply each), although the standby's start finds mentions whose
/// messages are still in Redis.
async fn leader_killed_mid_burst(db: Db) {
    let test = "leader_killed_mid_burst";
    let Some(bot) = setup(test, db, Duration::from_millis(150)).await else {
        return;
    };
    let mut leader = bot.start("leader-1", &[]);
    eventually("the leader leads", || async {
        role(&leader).await == "leader"
    })
    .await;
    let standby = bot.start("leader-2", &[]);
    let _w1 = bot.start("summary-1", &[("WORKER_TYPE", "summary")]);
    let _w2 = bot.start("summary-2", &[("WORKER_TYPE", "summary")]);
    let reader = bot.reader();
    let handle = format!("pk:{}", leader.key);
    let user = bot.user().await;
    let root = user.post("The bridge opened in 2020.", None).await;
    let mut mentions = Vec::new();
    for i in 0..24 {
        mentions.push(user.post(&format!("tl;dr {handle}"), Some(&root)).await);
        if i == 8 {
            // Some answered, some routed and running, some not yet routed.
            eventually("a first reply", || async {
                !posts_of(&reader, leader.key).await.is_empty()
            })
            .await;
            leader.kill();
        }
    }
    for mention in &mentions {
        reply_to(&reader, &standby, mention).await;
        assert_eq!(standby.finished(mention).await.0, "completed");
    }
    // A late duplicate would show after the last reply: a claim time more.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    for mention in &mentions {
        assert_eq!(replies_to(&reader, standby.key, mention).await.len(), 1);
    }
    assert_eq!(one_success_each(&standby).await, 24);
    assert_eq!(
        bot.fake.calls.load(std::sync::atomic::Ordering::SeqCst),
        24,
        "each action ran once: one AI call per mention"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_mid_burst_each_action_runs_once_on_sqlite() {
    leader_killed_mid_burst(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_mid_burst_each_action_runs_once_on_postgres() {
    leader_killed_mid_burst(Db::Postgres).await;
}

/// A leader frozen (SIGSTOP) in the middle of routing a mention, past its lease: the
/// standby takes over and answers it; when the frozen process resumes (SIGCONT), it
/// finishes its AI call and goes on (`skip:stop-on-lease-loss` keeps its stages
/// running after its renewal finds the lease gone), and the fence refuses every write
/// and publish of it: one decision, one action run, one reply, and mentions that come
/// after are answered once by the new leader.
async fn a_frozen_leader_that_wakes_changes_nothing(db: Db) {
    let test = "frozen_leader";
    let Some(mut bot) = setup(test, db, Duration::ZERO).await else {
        return;
    };
    // A longer lease than the other tests': the old leader must still lead when it is
    // frozen, on a busy machine too.
    bot.env
        .push(("PKBOT__BUS__LEASE_TTL_MS".into(), "3000".into()));
    use std::sync::atomic::Ordering::SeqCst;
    let old = bot.start(
        "leader-1",
        &[("PKBOT_FAILPOINT", "skip:stop-on-lease-loss")],
    );
    eventually("the first process leads", || async {
        role(&old).await == "leader"
    })
    .await;
    let new = bot.start("leader-2", &[]);
    let _worker = bot.start("summary", &[("WORKER_TYPE", "summary")]);
    let reader = bot.reader();
    let handle = format!("pk:{}", old.key);
    let user = bot.user().await;
    let root = user.post("The bridge opened in 2020.", None).await;

    // Keywords of both actions: the router asks the AI classifier, which is slow.
    bot.fake.delay_ms.store(4000, SeqCst);
    let mention = user
        .post(&format!("tl;dr or verify? {handle}"), Some(&root))
        .await;
    eventually("the leader asks the AI classifier", || async {
        bot.fake.calls.load(SeqCst) >= 1
    })
    .await;
    old.signal("STOP");
    let frozen = Instant::now();
    bot.fake.delay_ms.store(0, SeqCst);
    eventually("the standby leads", || async {
        role(&new).await == "leader"
    })
    .await;
    let reply = reply_to(&reader, &new, &mention).await;
    assert!(reply.content.starts_with("Summary"), "{}", reply.content);
    assert_eq!(new.finished(&mention).await.0, "completed");
    // Frozen until its AI answer has come (it waits in the socket): awake, the old
    // leader goes on routing the mention at once.
    tokio::time::sleep(Duration::from_millis(4300).saturating_sub(frozen.elapsed())).await;
    old.signal("CONT");
    eventually("the old leader's write is refused", || async {
        old.log_text().contains("no longer holds the leader lease")
    })
    .await;
    let log = old.log_text();
    assert!(log.contains("the stages go on"), "{log}");
    assert!(!log.contains("\"mention routed\""), "{log}");
    let another = user.post(&format!("tl;dr {handle}"), Some(&root)).await;
    reply_to(&reader, &new, &another).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for m in [&mention, &another] {
        assert_eq!(replies_to(&reader, new.key, m).await.len(), 1);
    }
    assert_eq!(one_success_each(&new).await, 2);
    let decisions = new
        .query_scalar("SELECT COUNT(*) FROM routing_decisions")
        .await;
    assert_eq!(decisions, 2);
    let log = old.log_text();
    assert!(!log.contains("\"mention routed\""), "{log}");
    assert!(!log.contains("\"reply published\""), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_leader_that_wakes_changes_nothing_on_sqlite() {
    a_frozen_leader_that_wakes_changes_nothing(Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_leader_that_wakes_changes_nothing_on_postgres() {
    a_frozen_leader_that_wakes_changes_nothing(Db::Postgres).await;
}

/// A mention the leader recorded but never handed on (`skip:hand-on`: as if it had
/// died right there) is re-sent by the same running leader, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pending_mention_is_re_sent_while_the_leader_runs() {
    let Some(bot) = setup("pending_re_sent", Db::Postgres, Duration::ZERO).await else {
        return;
    };
    let leader = bot.start(
        "leader",
        &[
            ("PKBOT_FAILPOINT", "skip:hand-on"),
            ("PKBOT__WORKERS__REDRIVE_INTERVAL_SECS", "1"),
        ],
    );
    let _worker = bot.start("summary", &[("WORKER_TYPE", "summary")]);
    let reader = bot.reader();
    let handle = format!("pk:{}", leader.key);
    let user = bot.user().await;
    let root = user.post("The bridge opened in 2020.", None).await;
    let mention = user.post(&format!("tl;dr {handle}"), Some(&root)).await;
    reply_to(&reader, &leader, &mention).await;
    let log = leader.log_text();
    assert!(log.contains("the mention is not handed on"), "{log}");
    assert!(
        log.contains("re-sending a pending mention no message carries"),
        "{log}"
    );
    assert_eq!(
        log.matches("took the leader lease").count(),
        1,
        "no restart, no takeover"
    );
}

/// Redis loses its data (the streams and groups gone) while a mention's action is on
/// its way: the mention stays `processing`, and `pkbot redrive --status processing`
/// sends it on again; it is answered once, and a second redrive finds nothing stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mentions_stuck_after_redis_lost_its_data_are_re_driven() {
    let Some(bot) = setup("redrive", Db::Postgres, Duration::from_millis(2000)).await else {
        return;
    };
    let leader = bot.start("leader", &[]);
    let mut worker = bot.start("summary", &[("WORKER_TYPE", "summary")]);
    let reader = bot.reader();
    let handle = format!("pk:{}", leader.key);
    let user = bot.user().await;
    let root = user.post("The bridge opened in 2020.", None).await;
    let mention = user.post(&format!("tl;dr {handle}"), Some(&root)).await;
    eventually("the worker runs the action", || async {
        busy(&worker).await > 0
    })
    .await;
    // The worker dies and Redis loses every stream with its messages.
    worker.kill();
    let prefix = bot
        .env
        .iter()
        .find(|(k, _)| k == "PKBOT__BUS__PREFIX")
        .map(|(_, v)| v.clone())
        .unwrap();
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for stream in [
        "mention.received.v1",
        "action.summary.requested.v1",
        "action.factcheck.requested.v1",
        "action.completed.v1",
    ] {
        let _: i64 = redis::cmd("DEL")
            .arg(format!("{prefix}{stream}"))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    bot.fake
        .delay_ms
        .store(0, std::sync::atomic::Ordering::SeqCst);
    worker.restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        leader.mention_status(&mention).await.unwrap().0,
        "processing",
        "nothing moves it on by itself"
    );
    let sent = bot.pkbot(&[
        "redrive",
        "--status",
        "processing",
        "--older-than",
        "1s",
        "--json",
    ]);
    let sent: Vec<serde_json::Value> = sent
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["stream"], "action.summary.requested.v1");
    reply_to(&reader, &leader, &mention).await;
    assert_eq!(leader.finished(&mention).await.0, "completed");
    assert_eq!(
        bot.pkbot(&["redrive", "--status", "processing", "--older-than", "0s"]),
        ""
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(replies_to(&reader, leader.key, &mention).await.len(), 1);
    assert_eq!(one_success_each(&leader).await, 1);
}

/// The load test: `BOT_LOAD_MENTIONS` mentions (100 by default; the figures in
/// docs/BENCHMARKS.md are from 2,000; `BOT_LOAD_RATE` paces them; on PostgreSQL, or
/// SQLite with `BOT_LOAD_DATABASE=sqlite`), half summaries and half fact-checks, through a
/// leader with a standby and two workers of each type, while a summary worker and the
/// leader are killed with kill -9 and the AI API fails now and then. Every mention
/// gets exactly one reply; throughput and mention-to-reply latency are printed (never
/// asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_every_mention_one_reply_while_processes_are_killed() {
    let test = "load";
    let db = match std::env::var("BOT_LOAD_DATABASE").as_deref() {
        Ok("sqlite") => Db::Sqlite,
        _ => Db::Postgres,
    };
    let Some(mut bot) = setup(test, db, Duration::from_millis(20)).await else {
        return;
    };
    let total: usize = std::env::var("BOT_LOAD_MENTIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    bot.env
        .push(("PKBOT__SEARCH__PROVIDER".into(), "searxng".into()));
    bot.env
        .push(("PKBOT__SEARCH__BASE_URL".into(), bot.fake.base()));
    bot.env.push(("PKBOT__AI__MAX_RETRIES".into(), "2".into()));
    bot.env
        .push(("PKBOT__BUS__MAX_DELIVERIES".into(), "10".into()));
    let fake = &bot.fake;
    let mut leader = bot.start("leader-1", &[]);
    eventually("the leader leads", || async {
        role(&leader).await == "leader"
    })
    .await;
    let standby = bot.start("leader-2", &[]);
    let worker = |name: &str, kind: &str| bot.start(name, &[("WORKER_TYPE", kind)]);
    let mut s1 = worker("summary-1", "summary");
    let s2 = worker("summary-2", "summary");
    let f1 = worker("factcheck-1", "factcheck");
    let f2 = worker("factcheck-2", "factcheck");
    let mut cpu = CpuUse::default();
    let reader = bot.reader();
    let handle = format!("pk:{}", leader.key);
    let bot_key = leader.key;
    let hs_url = bot.hs.url.clone();
    let users: Vec<User> =
        futures_util::future::join_all((0..10).map(|_| User::new(&hs_url))).await;
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
            cpu.add("summary workers", s1.pid());
            s1.kill(); // a summary worker dies mid-run
        }
        if mentions.len() == total / 2 {
            cpu.add("leader + standby", leader.pid());
            leader.kill(); // and the leader: the standby takes over
        }
    }
    let posted_in = started.elapsed();
    s1.restart();

    // Every mention answered, once. While waiting, the replies are counted in the
    // bot's database (reading them from the homeserver each time would load it more
    // than the bot does); then read from the homeserver once.
    let mut latencies = Vec::with_capacity(total);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let replies = standby
            .query_scalar("SELECT COUNT(*) FROM replies WHERE published_at IS NOT NULL")
            .await;
        if replies >= total as i64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{replies} of {total} replies:\n{}",
            standby.log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let elapsed = started.elapsed();
    // Where the CPU went, per process kind (taken before the settling below).
    cpu.add("leader + standby", standby.pid());
    for (name, process) in [
        ("summary workers", &s1),
        ("summary workers", &s2),
        ("factcheck workers", &f1),
        ("factcheck workers", &f2),
    ] {
        cpu.add(name, process.pid());
    }
    cpu.add("homeserver", bot.hs.pid());
    cpu.add(
        "this test (users, fake providers)",
        Some(std::process::id()),
    );
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
        for entry in std::fs::read_dir(&bot.data).unwrap().flatten() {
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
    eprintln!("LOAD CPU per mention: {}", cpu.per(total));
}

/// CPU seconds used, per kind of process (a killed process's counted before the kill).
#[derive(Default)]
struct CpuUse(Vec<(&'static str, f64)>);

impl CpuUse {
    fn add(&mut self, name: &'static str, pid: Option<u32>) {
        let Some(seconds) = pid.and_then(cpu_seconds) else {
            return;
        };
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += seconds,
            None => self.0.push((name, seconds)),
        }
    }

    /// `name X ms` for each, per mention, and their sum.
    fn per(&self, mentions: usize) -> String {
        let ms = |s: f64| s * 1000.0 / mentions as f64;
        let mut parts: Vec<String> = self
            .0
            .iter()
            .map(|(name, s)| format!("{name} {:.1} ms", ms(*s)))
            .collect();
        let sum: f64 = self.0.iter().map(|(_, s)| s).sum();
        parts.push(format!("total {:.1} ms", ms(sum)));
        parts.join(", ")
    }
}
