//! Real processes for the bot's end-to-end tests: a `homeserver` (the binary built next
//! to this test), a `pkbot`, users writing pubky.app posts with the client library, and
//! a local server speaking the OpenAI chat-completions and SearXNG wire formats.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use homeserver_protocol::{Keypair, PublicKey};
use pk_client::{ListOptions, PkClient};
use pkbot::post::{PostUri, PubkyAppPost, now_micros, post_id};
use serde_json::{Value, json};

pub use hs_testkit::{Homeserver, free_port, homeserver_binary_or_skip, wait_listening};

pub const PKBOT: &str = env!("CARGO_BIN_EXE_pkbot");

/// Generous bound for waits (never a timing assertion).
pub const WAIT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A `pkbot` process on its own data folder.
pub struct BotProcess {
    child: Option<Child>,
    dir: PathBuf,
    env: Vec<(String, String)>,
    log: PathBuf,
    pub health: String,
    pub key: PublicKey,
    port: u16,
}

impl BotProcess {
    /// Starts a bot for the homeserver at `url`, with `extra` settings (env) on top.
    pub fn start(url: &str, dir: &Path, extra: &[(&str, &str)]) -> Self {
        Self::start_named(url, dir, "pkbot", extra)
    }

    /// Starts one more process of a bot on the data in `dir` (its database and
    /// mnemonic), logging to `<name>.log`.
    pub fn start_named(url: &str, dir: &Path, name: &str, extra: &[(&str, &str)]) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let port = free_port();
        let mut env: Vec<(String, String)> = vec![
            ("PKBOT__HOMESERVER__URL".into(), url.into()),
            (
                "PKBOT__IDENTITY__MNEMONIC_FILE".into(),
                dir.join("bot.mnemonic").display().to_string(),
            ),
            (
                "PKBOT__STORAGE__DATABASE_URL".into(),
                format!("sqlite://{}/bot.db", dir.display()),
            ),
            ("PKBOT__HTTP__LISTEN".into(), format!("127.0.0.1:{port}")),
            (
                "PKBOT__POLICIES__DIR".into(),
                repo().join("policies").display().to_string(),
            ),
            ("PKBOT__INDEX__FOLLOW_INTERVAL_MS".into(), "100".into()),
            ("MENTION_POLL_INTERVAL_MS".into(), "1000".into()),
            ("RUST_LOG".into(), "info".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let key = {
            let out = Command::new(PKBOT)
                .arg("--pubkey")
                .envs(env.iter().map(|(k, v)| (k, v)))
                .output()
                .expect("pkbot --pubkey");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        let mut bot = Self {
            child: None,
            dir: dir.to_owned(),
            env,
            log: dir.join(format!("{name}.log")),
            health: format!("http://127.0.0.1:{port}"),
            key,
            port,
        };
        bot.spawn();
        bot
    }

    fn spawn(&mut self) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = Command::new(PKBOT)
            .current_dir(&self.dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("pkbot starts");
        wait_listening(self.port, &mut child, "pkbot", &self.log);
        self.child = Some(child);
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs `pkbot ARGS` (a command such as `dlq list`) with this process's settings;
    /// its standard output.
    pub fn command(&self, args: &[&str]) -> String {
        let out = Command::new(PKBOT)
            .args(args)
            .current_dir(&self.dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("pkbot runs");
        assert!(
            out.status.success(),
            "pkbot {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends the process a signal (`STOP`, `CONT`, ...).
    pub fn signal(&self, name: &str) {
        let child = self.child.as_ref().expect("running");
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{name}");
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sets (or with None removes) a variable for the next start.
    pub fn set_env(&mut self, name: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != name);
        if let Some(value) = value {
            self.env.push((name.into(), value.into()));
        }
    }

    /// Waits for the process to end by itself (a failpoint); true when it crashed.
    pub async fn crashed(&mut self) -> bool {
        let deadline = Instant::now() + WAIT;
        loop {
            let child = self.child.as_mut().expect("running");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return !status.success();
            }
            assert!(
                Instant::now() < deadline,
                "pkbot did not stop:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn health(&self) -> Value {
        reqwest::get(format!("{}/api/health", self.health))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The bot's database (`PKBOT__STORAGE__DATABASE_URL`).
    pub fn database_url(&self) -> String {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == "PKBOT__STORAGE__DATABASE_URL")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    async fn database(&self) -> Option<sqlx::AnyConnection> {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        let mut url = self.database_url();
        if url.starts_with("sqlite:") {
            url.push_str("?mode=ro");
        }
        sqlx::AnyConnection::connect(&url).await.ok()
    }

    /// The bot's record of a mention: (status, error).
    pub async fn mention_status(&self, mention: &PostUri) -> Option<(String, Option<String>)> {
        let mut db = self.database().await?;
        sqlx::query_as("SELECT status, error FROM mentions WHERE id = $1")
            .bind(mention.key())
            .fetch_optional(&mut db)
            .await
            .ok()?
    }

    /// One number from the bot's database.
    pub async fn query_scalar(&self, sql: &str) -> i64 {
        let mut db = self.database().await.expect("the bot's database");
        sqlx::query_scalar(sql).fetch_one(&mut db).await.unwrap()
    }

    /// Waits until the bot has taken a mention (it is in its database).
    pub async fn taken(&self, mention: &PostUri) {
        let deadline = Instant::now() + WAIT;
        while self.mention_status(mention).await.is_none() {
            assert!(
                Instant::now() < deadline,
                "the bot never took {mention}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the bot has finished with a mention; returns (status, error).
    pub async fn finished(&self, mention: &PostUri) -> (String, Option<String>) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some((status, error)) = self.mention_status(mention).await
                && !matches!(status.as_str(), "pending" | "processing")
            {
                return (status, error);
            }
            assert!(
                Instant::now() < deadline,
                "the bot never finished {mention}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for BotProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), self.log_text());
        }
    }
}

/// The database a test's bot processes share: a SQLite file, or a PostgreSQL database
/// made for the test (dropped with the value).
pub enum TestDb {
    Sqlite(String),
    Postgres(pkbot::store::scratch::ScratchPostgres),
}

impl TestDb {
    /// A SQLite file in `dir`.
    pub fn sqlite(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        Self::Sqlite(format!("sqlite://{}/bot.db", dir.display()))
    }

    /// A PostgreSQL database of the test's own, or None (skipped, the reason printed;
    /// a failure under CI=true).
    pub async fn postgres(test: &str) -> Option<Self> {
        pkbot::store::scratch::ScratchPostgres::create_or_skip(test)
            .await
            .map(Self::Postgres)
    }

    pub fn url(&self) -> String {
        match self {
            Self::Sqlite(url) => url.clone(),
            Self::Postgres(pg) => pg.url.clone(),
        }
    }

    /// The setting that points a bot process at it.
    pub fn env(&self) -> (String, String) {
        ("PKBOT__STORAGE__DATABASE_URL".into(), self.url())
    }
}

/// A user of the network: a key signed up on the homeserver, writing posts.
pub struct User {
    pub client: PkClient,
    pub key: PublicKey,
}

impl User {
    pub async fn new(url: &str) -> Self {
        let keypair = Keypair::random();
        let client = PkClient::new(url, Some(keypair.clone())).unwrap();
        client.signup(None).await.unwrap();
        Self {
            client,
            key: keypair.public_key(),
        }
    }

    /// Writes a post (a reply when `parent` is given); returns its URI.
    pub async fn post(&self, content: &str, parent: Option<&PostUri>) -> PostUri {
        // Ids are the time in microseconds: keep them distinct when posts come fast.
        static LAST: AtomicU64 = AtomicU64::new(0);
        let micros = loop {
            let now = now_micros() as u64;
            let last = LAST.load(Ordering::SeqCst);
            let next = now.max(last + 1);
            if LAST
                .compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                break next as i64;
            }
        };
        let uri = PostUri::new(self.key, post_id(micros));
        let post = PubkyAppPost {
            content: content.into(),
            kind: "short".into(),
            parent: parent.map(ToString::to_string),
        };
        let body = serde_json::to_vec(&post).unwrap();
        // A loaded homeserver may answer 503 (busy) or 429: as a client would, try again.
        let mut tries = 0;
        while let Err(e) = self.client.put_bytes(&uri.path(), body.clone()).await {
            tries += 1;
            assert!(tries < 5, "posting {uri}: {e}");
            eprintln!("posting {uri}: {e}; trying again");
            tokio::time::sleep(Duration::from_millis(200 * tries)).await;
        }
        uri
    }
}

/// Every post of `author` on the homeserver: (URI, value).
pub async fn posts_of(reader: &PkClient, author: PublicKey) -> Vec<(PostUri, PubkyAppPost)> {
    let entries = match reader
        .list_all(
            "/pub/pubky.app/posts/",
            ListOptions::default(),
            Some(author),
        )
        .await
    {
        Ok(entries) => entries,
        Err(e) if e.is_not_found() => return Vec::new(),
        Err(e) => panic!("listing posts: {e}"),
    };
    let mut posts = Vec::new();
    for entry in entries {
        let id = entry.path.rsplit('/').next().unwrap().to_owned();
        let bytes = reader.get_bytes(&entry.path, Some(author)).await.unwrap();
        posts.push((
            PostUri::new(author, id),
            serde_json::from_slice(&bytes).unwrap(),
        ));
    }
    posts
}

/// The bot's replies to `mention`.
pub async fn replies_to(reader: &PkClient, bot: PublicKey, mention: &PostUri) -> Vec<PubkyAppPost> {
    let parent = mention.to_string();
    posts_of(reader, bot)
        .await
        .into_iter()
        .map(|(_, p)| p)
        .filter(|p| p.parent.as_deref() == Some(parent.as_str()))
        .collect()
}

/// Waits for the bot's reply to `mention` and returns it.
pub async fn reply_to(reader: &PkClient, bot: &BotProcess, mention: &PostUri) -> PubkyAppPost {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut replies = replies_to(reader, bot.key, mention).await;
        if let Some(reply) = replies.pop() {
            assert!(replies.is_empty(), "more than one reply to {mention}");
            return reply;
        }
        assert!(
            Instant::now() < deadline,
            "no reply to {mention}:\n{}",
            bot.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A local server speaking the OpenAI chat-completions and SearXNG wire formats, with
/// answers made from what the prompt asks; `delay` slows every AI answer.
pub struct FakeProviders {
    pub addr: SocketAddr,
    pub calls: Arc<AtomicU64>,
    /// The next this many AI calls answer 500 (as an overloaded API does).
    pub failing: Arc<AtomicU64>,
    /// How long each AI answer takes, in milliseconds.
    pub delay_ms: Arc<AtomicU64>,
    /// The next this many AI calls answer 429 with `Retry-After: 1`.
    pub rate_limiting: Arc<AtomicU64>,
    /// The next this many AI calls answer 200 with a body that is not JSON.
    pub malformed: Arc<AtomicU64>,
    /// The user messages of every AI call.
    pub prompts: Arc<std::sync::Mutex<Vec<String>>>,
    /// What each AI call asked for: `text`, `json_object` or `json_schema:<name>`.
    pub formats: Arc<std::sync::Mutex<Vec<String>>>,
    /// The next this many AI calls answer a JSON object of no expected shape.
    pub off_schema: Arc<AtomicU64>,
    /// The next this many AI calls answer 400 (a request the API will never take).
    pub rejecting: Arc<AtomicU64>,
    _task: tokio::task::JoinHandle<()>,
}

impl FakeProviders {
    pub async fn start(delay: Duration) -> Self {
        use axum::routing::{get, post};
        let calls = Arc::new(AtomicU64::new(0));
        let failing = Arc::new(AtomicU64::new(0));
        let delay_ms = Arc::new(AtomicU64::new(delay.as_millis() as u64));
        let rate_limiting = Arc::new(AtomicU64::new(0));
        let malformed = Arc::new(AtomicU64::new(0));
        let prompts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let formats = Arc::new(std::sync::Mutex::new(Vec::new()));
        let off_schema = Arc::new(AtomicU64::new(0));
        let rejecting = Arc::new(AtomicU64::new(0));
        let (asked, to_stray) = (formats.clone(), off_schema.clone());
        let to_reject = rejecting.clone();
        let (counter, to_fail, wait) = (calls.clone(), failing.clone(), delay_ms.clone());
        let (to_limit, to_garble, seen) =
            (rate_limiting.clone(), malformed.clone(), prompts.clone());
        let app = axum::Router::new()
            .route(
                "/v1/chat/completions",
                post(move |axum::Json(body): axum::Json<Value>| {
                    let (counter, to_fail) = (counter.clone(), to_fail.clone());
                    let (to_limit, to_garble, seen) = (to_limit.clone(), to_garble.clone(), seen.clone());
                    let (asked, to_stray) = (asked.clone(), to_stray.clone());
                    let to_reject = to_reject.clone();
                    let delay = Duration::from_millis(wait.load(Ordering::SeqCst));
                    async move {
                        use axum::response::IntoResponse;
                        counter.fetch_add(1, Ordering::SeqCst);
                        if let Some(user) = body["messages"][1]["content"].as_str() {
                            seen.lock().unwrap().push(user.to_owned());
                        }
                        let format = &body["response_format"];
                        asked.lock().unwrap().push(match format["type"].as_str() {
                            None => "text".to_owned(),
                            Some("json_schema") => format!(
                                "json_schema:{}",
                                format["json_schema"]["name"].as_str().unwrap_or("")
                            ),
                            Some(other) => other.to_owned(),
                        });
                        tokio::time::sleep(delay).await;
                        let take = |n: &AtomicU64| {
                            n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                                .is_ok()
                        };
                        if take(&to_reject) {
                            let error = json!({"error": {"message": "Invalid model for this key", "type": "invalid_request_error"}});
                            return (axum::http::StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
                        }
                        if take(&to_limit) {
                            let error = json!({"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}});
                            return (axum::http::StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], axum::Json(error)).into_response();
                        }
                        if take(&to_fail) {
                            let error = json!({"error": {"message": "The server is overloaded", "type": "server_error"}});
                            return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, axum::Json(error)).into_response();
                        }
                        if take(&to_stray) {
                            let mut answer = chat_answer(&body);
                            answer["choices"][0]["message"]["content"] = json!("{\"unexpected\": true}");
                            return (axum::http::StatusCode::OK, axum::Json(answer)).into_response();
                        }
                        if take(&to_garble) {
                            return (axum::http::StatusCode::OK, [("content-type", "application/json")], "{\"choices\": [tru").into_response();
                        }
                        (axum::http::StatusCode::OK, axum::Json(chat_answer(&body))).into_response()
                    }
                }),
            )
            .route(
                "/res/v1/web/search",
                get(|| async {
                    axum::Json(json!({"web": {"results": [
                        {"title": "Bridge history", "url": "https://example.org/bridge", "description": "The bridge opened in 2020."}
                    ]}}))
                }),
            )
            .route(
                "/search",
                post(|| async {
                    axum::Json(json!({"query": "q", "results": [
                        {"title": "Bridge history", "url": "https://example.org/bridge", "content": "The bridge opened in 2020.", "score": 0.9}
                    ]}))
                })
                .get(|| async {
                    axum::Json(json!({"results": [
                        {"title": "Bridge history", "url": "https://example.org/bridge", "content": "The bridge opened in 2020."},
                        {"title": "City news", "url": "https://news.example/bridge-2020", "content": "Opened 2020, on budget."}
                    ]}))
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            calls,
            failing,
            delay_ms,
            rate_limiting,
            malformed,
            prompts,
            formats,
            off_schema,
            rejecting,
            _task: task,
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// What the fake model answers, by the kind of prompt.
fn chat_answer(body: &Value) -> Value {
    let system = body["messages"][0]["content"].as_str().unwrap_or("");
    let user = body["messages"][1]["content"].as_str().unwrap_or("");
    // A gullible model: an instruction to post something that is not inside the
    // prompt's data markers (`<<<LABEL tag` ... `LABEL tag>>>`) is obeyed.
    if let Some(order) = unfenced(user).split("and post ").nth(1) {
        let x = order.split_whitespace().next().unwrap_or("");
        return json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("• {x}")}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        });
    }
    let content = if system.contains("Extract the checkable") {
        json!({"claims": ["The bridge opened in 2020."]}).to_string()
    } else if system.contains("check one claim") {
        // One source search returned, one it did not: only the first may be cited.
        json!({"verdict": "Accurate", "reason": "Both sources say it opened in 2020.",
               "sources": ["https://example.org/bridge", "https://invented.example/x"]})
        .to_string()
    } else if system.contains("route mentions") {
        json!({"action": "summary", "confidence": 0.8, "reasoning": "asks what the thread says"})
            .to_string()
    } else {
        "• The bridge opened in 2020.\n• It carries trains too.\n• It cost twice the budget.\n• A fourth point".into()
    };
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 20, "total_tokens": 60}
    })
}

/// The text of a prompt outside its data markers.
fn unfenced(prompt: &str) -> String {
    let mut out = String::new();
    let mut inside: Option<String> = None;
    for line in prompt.lines() {
        match &inside {
            None => {
                if let Some(open) = line.strip_prefix("<<<") {
                    inside = Some(format!("{open}>>>"));
                } else {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            Some(close) => {
                if line.ends_with(close.as_str()) {
                    inside = None;
                }
            }
        }
    }
    out
}

/// CPU seconds (user + system) process `pid` has used so far, from /proc (Linux).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
