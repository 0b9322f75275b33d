//! `kill -9` under load, over and over: the real homeserver binary is started on one
//! data folder, writers PUT and DELETE values concurrently, the process is killed at a
//! random moment, restarted, and every write that was acknowledged before the kill must
//! be there, whole, on the restarted server (a write still in flight at the kill may have
//! happened or not, but never in part). Usage must equal the sum of the values' sizes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use homeserver_protocol::{AuthHeader, BodyHash, Keypair};
use reqwest::{Method, StatusCode};

use crate::scenario::unix_secs;

#[derive(Debug, Clone)]
pub struct CrashLoopConfig {
    pub homeserver: PathBuf,
    pub dir: PathBuf,
    pub cycles: u32,
    pub writers: usize,
    /// Each writer's values are at most this large (sizes vary from 0 up).
    pub max_value_bytes: usize,
    pub seed: u64,
}

#[derive(Debug, Default)]
pub struct CrashLoopReport {
    pub cycles: u32,
    pub acknowledged: u64,
    pub in_flight_at_kill: u64,
    pub entries_checked: u64,
}

impl CrashLoopReport {
    pub fn line(&self) -> String {
        format!(
            "crash loop: {} kill -9 cycles, {} acknowledged writes, {} in flight at a kill, \
             {} paths checked after each restart: 0 lost, 0 partial, usage always matched",
            self.cycles, self.acknowledged, self.in_flight_at_kill, self.entries_checked
        )
    }
}

/// What one path may hold: the last acknowledged value (None = deleted or never
/// written) and the values of writes in flight when the server was killed.
#[derive(Debug, Default, Clone)]
struct Expected {
    acknowledged: Option<BodyHash>,
    maybe: Vec<Option<BodyHash>>,
}

struct Server {
    child: Child,
    url: String,
    admin_url: String,
}

/// The admin password of the servers the loop starts (loopback only, throwaway data).
const ADMIN_PASSWORD: &str = "crash-loop";

impl Server {
    fn kill(mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn start(config: &CrashLoopConfig) -> anyhow::Result<Server> {
    let port = free_port()?;
    let admin_port = free_port()?;
    let child = Command::new(&config.homeserver)
        .current_dir(&config.dir)
        .env("HOMESERVER__HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "HOMESERVER__ADMIN__LISTEN",
            format!("127.0.0.1:{admin_port}"),
        )
        .env("HOMESERVER__ADMIN__PASSWORD", ADMIN_PASSWORD)
        .env("HOMESERVER__STORAGE__QUOTA_BYTES", "0")
        .env("HOMESERVER__METRICS__LISTEN", "")
        .env("HOMESERVER__RATE_LIMIT__ENABLED", "false")
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", config.homeserver.display()))?;
    let url = format!("http://127.0.0.1:{port}");
    let admin_url = format!("http://127.0.0.1:{admin_port}");
    let mut server = Server {
        child,
        url,
        admin_url,
    };
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if let Some(status) = server.child.try_wait()? {
            bail!("the homeserver exited at start ({status})");
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(server);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the homeserver did not listen within 60 s")
}

fn request(
    http: &reqwest::Client,
    url: &str,
    key: &Keypair,
    method: Method,
    target: &str,
    body: &[u8],
) -> reqwest::RequestBuilder {
    let hash = BodyHash::of(body);
    let header = AuthHeader::sign(key, method.as_str(), target, unix_secs(), &hash);
    let mut builder = http
        .request(method.clone(), format!("{url}{target}"))
        .header("Authorization", header.to_header_value());
    if method == Method::PUT {
        builder = builder
            .header("Content-Digest", hash.to_content_digest())
            .body(body.to_vec());
    }
    builder
}

/// A small deterministic generator, so a failing run can be repeated with its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

type Ledger = Arc<Mutex<HashMap<String, Expected>>>;

/// One writer until `stop`: PUTs (and some DELETEs) to its own paths, recording each
/// attempt before sending and its outcome after.
/// What a writer shares with the loop.
#[derive(Clone)]
struct WriterContext {
    url: String,
    key: Keypair,
    ledger: Ledger,
    max_value: usize,
    acknowledged: Arc<std::sync::atomic::AtomicU64>,
}

async fn writer(
    context: WriterContext,
    id: usize,
    mut rng: Rng,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let WriterContext {
        url,
        key,
        ledger,
        max_value,
        acknowledged,
    } = context;
    let http = reqwest::Client::new();
    while !*stop.borrow() {
        let target = format!("/pub/crash/w{id}/{}", rng.below(16));
        let delete = rng.below(8) == 0;
        let value: Option<Bytes> = (!delete).then(|| {
            let len = rng.below(max_value as u64 + 1) as usize;
            let byte = rng.next() as u8;
            Bytes::from(vec![byte; len])
        });
        let hash = value.as_ref().map(|v| BodyHash::of(v));
        ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(target.clone())
            .or_default()
            .maybe
            .push(hash);
        let sent = match &value {
            Some(v) => {
                request(&http, &url, &key, Method::PUT, &target, v)
                    .send()
                    .await
            }
            None => {
                request(&http, &url, &key, Method::DELETE, &target, b"")
                    .send()
                    .await
            }
        };
        let ok = match sent {
            Ok(r) => {
                r.status() == StatusCode::OK || (delete && r.status() == StatusCode::NOT_FOUND)
            }
            Err(_) => false, // the server died: the attempt stays in `maybe`
        };
        let mut ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
        let expected = ledger.entry(target).or_default();
        if ok {
            expected.acknowledged = hash;
            expected.maybe.clear();
            acknowledged.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Checks every path of the ledger on the (restarted) server, then settles the ledger:
/// what the server holds becomes the acknowledged state.
async fn verify(url: &str, key: &Keypair, ledger: &Ledger) -> anyhow::Result<u64> {
    let http = reqwest::Client::new();
    let entries: Vec<(String, Expected)> = ledger
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut total = 0u64;
    for (path, expected) in &entries {
        let r = request(&http, url, key, Method::GET, path, b"")
            .send()
            .await?;
        let held = match r.status() {
            StatusCode::OK => {
                let value = r.bytes().await?;
                total += value.len() as u64;
                Some(BodyHash::of(&value))
            }
            StatusCode::NOT_FOUND => None,
            other => bail!("GET {path} answered {other} after a restart"),
        };
        let allowed = std::iter::once(&expected.acknowledged).chain(&expected.maybe);
        if !allowed.into_iter().any(|a| *a == held) {
            bail!(
                "{path} holds {held:?} after a restart; acknowledged {:?}, in flight {:?}",
                expected.acknowledged,
                expected.maybe
            );
        }
        let mut ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = ledger.get_mut(path) {
            e.acknowledged = held;
            e.maybe.clear();
        }
    }
    Ok(total)
}

/// The user's usage as the server counts it (the admin API).
async fn usage(server: &Server, key: &Keypair) -> anyhow::Result<u64> {
    let info: serde_json::Value = reqwest::Client::new()
        .get(format!(
            "{}/admin/users/{}",
            server.admin_url,
            key.public_key().to_z32()
        ))
        .bearer_auth(ADMIN_PASSWORD)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    info["storage_used"]
        .as_u64()
        .context("admin user info without storage_used")
}

pub async fn run(config: CrashLoopConfig) -> anyhow::Result<CrashLoopReport> {
    std::fs::create_dir_all(&config.dir)?;
    let key = Keypair::random();
    let ledger: Ledger = Arc::default();
    let acknowledged = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut rng = Rng(config.seed | 1);
    let mut report = CrashLoopReport::default();
    let http = reqwest::Client::new();
    let server = start(&config).await?;
    let signup = request(&http, &server.url, &key, Method::POST, "/signup", b"")
        .send()
        .await?;
    if !signup.status().is_success() {
        bail!("signup answered {}", signup.status());
    }
    let mut server = Some(server);
    for cycle in 0..config.cycles {
        let running = match server.take() {
            Some(s) => s,
            None => start(&config).await?,
        };
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let context = WriterContext {
            url: running.url.clone(),
            key: key.clone(),
            ledger: ledger.clone(),
            max_value: config.max_value_bytes,
            acknowledged: acknowledged.clone(),
        };
        let writers: Vec<_> = (0..config.writers)
            .map(|id| {
                tokio::spawn(writer(
                    context.clone(),
                    id,
                    Rng(rng.next() | 1),
                    stop_rx.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1000 + rng.below(2000))).await;
        running.kill();
        let _ = stop_tx.send(true);
        for w in writers {
            let _ = w.await;
        }
        report.in_flight_at_kill += ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|e| !e.maybe.is_empty())
            .count() as u64;
        let restarted = start(&config).await?;
        let held = verify(&restarted.url, &key, &ledger)
            .await
            .with_context(|| format!("after kill {}", cycle + 1))?;
        let used = usage(&restarted, &key).await?;
        if used != held {
            bail!(
                "after kill {}: usage says {used} bytes, the entries hold {held}",
                cycle + 1
            );
        }
        report.entries_checked = ledger.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
        report.cycles = cycle + 1;
        server = Some(restarted);
    }
    report.acknowledged = acknowledged.load(std::sync::atomic::Ordering::Relaxed);
    Ok(report)
}

/// Where the crash loop keeps its data unless told otherwise.
pub fn default_dir() -> PathBuf {
    std::env::temp_dir().join(format!("hs-crash-loop-{}", std::process::id()))
}

pub fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}
