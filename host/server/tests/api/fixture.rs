//! `TestHost`: a real homeserver in this process on a random port with a throwaway data
//! dir, plus helpers that sign requests exactly as docs/API.md says.
//!
//! `HS_TEST_INSTANCES=2` (with `HS_TEST_BACKEND=postgres`) runs every host as two
//! instances on the one database and blob store behind a round-robin balancer, and the
//! suite's client opens a connection per request: a test's consecutive requests land
//! on different instances. Tests that look at one instance's own state (its metrics,
//! its in-memory rate limits) ask for [`TestHost::start_single_with`].

use std::time::{SystemTime, UNIX_EPOCH};

use homeserver::{Config, Homeserver};
use homeserver_protocol::{AuthHeader, BodyHash, ErrorBody, ErrorCode, Keypair};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use tempfile::TempDir;

pub struct TestHost {
    server: Option<Homeserver>,
    /// The second instance (`HS_TEST_INSTANCES=2`).
    second: Option<Homeserver>,
    _balancer: Option<crate::balancer::Balancer>,
    pub url: String,
    pub http: reqwest::Client,
    pub dir: TempDir,
    /// Drops the test's database (PostgreSQL) when the host goes, unless stopped to be
    /// restarted on the same data.
    database: DatabaseGuard,
}

struct DatabaseGuard(Option<std::path::PathBuf>);

impl Drop for DatabaseGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            crate::backend::forget_database_of(&dir);
        }
    }
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A config for a throwaway server under `dir`.
pub fn test_config(dir: &std::path::Path) -> Config {
    let mut config = Config::defaults();
    config.http.listen = "127.0.0.1:0".parse().unwrap();
    config.storage.database_url = crate::backend::database_url_for(dir);
    (config.storage.blobs, config.s3) = crate::backend::blobs_for(dir);
    config.keys.secret_key_file = dir.join("server.key");
    config.policies.dir = dir.join("policies");
    config.policies.cache_dir = shared_guest_cache();
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.admin.password = ADMIN_PASSWORD.into();
    config.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    // Raw-public-key TLS is off by default; the tests that want it ask for it.
    // Tests make many anonymous requests from one IP; rate-limit tests turn this on.
    config.rate_limit.enabled = false;
    // No DHT (the public one is out of reach here); the pkarr tests use a local testnet.
    config.pkarr.enabled = false;
    // The suite runs ~190 tests at once on two cores: a guest call (microseconds when
    // the machine is free) can wait past the serving default of 100 ms for a core, and
    // an overrun fails the request closed (500). The tests of the deadline itself set
    // theirs.
    config.policies.call_deadline_ms = 1000;
    config
}

pub const ADMIN_PASSWORD: &str = "test-admin-password";

/// Instances per test host: `HS_TEST_INSTANCES` (1 by default; 2 needs a backend several
/// instances can share).
pub fn instances() -> usize {
    match std::env::var("HS_TEST_INSTANCES").as_deref() {
        Err(_) | Ok("") | Ok("1") => 1,
        Ok("2") => {
            assert!(
                crate::backend::Backend::current().shared(),
                "HS_TEST_INSTANCES=2 needs HS_TEST_BACKEND=postgres (two instances cannot share SQLite)"
            );
            2
        }
        Ok(other) => panic!("HS_TEST_INSTANCES={other}: expected 1 or 2"),
    }
}

/// Compiled guests shared by every test server (entries are named by module and engine
/// hash and written by rename, so sharing is safe): each server then starts in
/// milliseconds instead of compiling three guests.
pub fn shared_guest_cache() -> std::path::PathBuf {
    std::env::temp_dir().join("homeserver-test-guest-cache")
}

impl TestHost {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config(dir.path());
        adjust(&mut config);
        Self::start_in(dir, config).await
    }

    pub async fn start_in(dir: TempDir, config: Config) -> Self {
        Self::start_instances(dir, config, instances()).await
    }

    /// One instance, whatever `HS_TEST_INSTANCES` says: for tests of one instance's own
    /// state (its metrics, its in-memory rate limiters, its process).
    pub async fn start_single_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config(dir.path());
        adjust(&mut config);
        Self::start_single_in(dir, config).await
    }

    pub async fn start_single_in(dir: TempDir, config: Config) -> Self {
        Self::start_instances(dir, config, 1).await
    }

    async fn start_instances(dir: TempDir, config: Config, instances: usize) -> Self {
        // A test that chose SQLite itself gets one instance: SQLite has one writer.
        let instances = if matches!(
            config.storage.database_url,
            homeserver::persistence::DatabaseUrl::Sqlite(_)
        ) {
            1
        } else {
            instances
        };
        let database = DatabaseGuard(Some(dir.path().to_owned()));
        let second_config = (instances > 1).then(|| config.clone());
        let server = Homeserver::start(config).await.expect("server starts");
        let Some(config) = second_config else {
            let url = format!("http://{}", server.http_addr());
            return Self {
                server: Some(server),
                second: None,
                _balancer: None,
                url,
                http: reqwest::Client::new(),
                dir,
                database,
            };
        };
        // The second instance: the same stores and key, ports of its own.
        let second = Homeserver::start(config)
            .await
            .expect("second instance starts");
        let balancer =
            crate::balancer::Balancer::start(vec![server.http_addr(), second.http_addr()]).await;
        Self {
            server: Some(server),
            second: Some(second),
            url: format!("http://{}", balancer.addr),
            _balancer: Some(balancer),
            // A connection per request: the balancer alternates requests.
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
            dir,
            database,
        }
    }

    /// Every instance serving this host.
    pub fn instances(&self) -> Vec<&Homeserver> {
        self.server.iter().chain(self.second.iter()).collect()
    }

    pub fn server(&self) -> &Homeserver {
        self.server.as_ref().unwrap()
    }

    /// Stops the server and hands back its data dir, to restart on the same data.
    pub async fn stop(mut self) -> TempDir {
        if let Some(server) = self.second.take() {
            server.shutdown().await;
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
        // The data stays for a restart.
        self.database.0 = None;
        self.dir
    }

    pub fn request(&self, method: Method, target: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{}", self.url, target))
    }

    /// A request signed by `key` now.
    pub fn signed(
        &self,
        key: &Keypair,
        method: Method,
        target: &str,
        body: &[u8],
    ) -> RequestBuilder {
        self.signed_at(key, method, target, body, now())
    }

    pub fn signed_at(
        &self,
        key: &Keypair,
        method: Method,
        target: &str,
        body: &[u8],
        timestamp: u64,
    ) -> RequestBuilder {
        let header = AuthHeader::sign(key, method.as_str(), target, timestamp, &BodyHash::of(body));
        self.request(method, target)
            .header("Authorization", header.to_header_value())
            .body(body.to_vec())
    }

    /// A request signed by `key` now that declares its body's SHA-256 in
    /// `Content-Digest`, as `pk` does: the server checks the signature before the body.
    pub fn signed_with_digest(
        &self,
        key: &Keypair,
        method: Method,
        target: &str,
        body: &[u8],
    ) -> RequestBuilder {
        self.signed(key, method, target, body)
            .header("Content-Digest", BodyHash::of(body).to_content_digest())
    }

    /// The value of a metric series (`name` with its labels, as printed), if present.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let addr = self.server().metrics_addr()?;
        let text = self
            .http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// A new user, signed up.
    pub async fn user(&self) -> Keypair {
        let key = Keypair::random();
        let r = self
            .signed(&key, Method::POST, "/signup", b"")
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::CREATED,
            "{}",
            r.text().await.unwrap()
        );
        key
    }

    pub async fn put(&self, key: &Keypair, path: &str, body: &[u8]) -> Response {
        self.signed(key, Method::PUT, path, body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, key: &Keypair, path: &str) -> Response {
        self.signed(key, Method::GET, path, b"")
            .send()
            .await
            .unwrap()
    }

    pub async fn delete(&self, key: &Keypair, path: &str) -> Response {
        self.signed(key, Method::DELETE, path, b"")
            .send()
            .await
            .unwrap()
    }

    /// A request to the admin API, without credentials.
    pub fn admin_request(&self, method: Method, path: &str) -> RequestBuilder {
        let admin = self.server().admin_addr().expect("admin server on");
        self.http.request(method, format!("http://{admin}{path}"))
    }

    /// A request to the admin API with the admin password.
    pub fn admin(&self, method: Method, path: &str) -> RequestBuilder {
        self.admin_request(method, path).bearer_auth(ADMIN_PASSWORD)
    }

    /// A call to the admin API with the admin password; its JSON answer.
    pub async fn admin_json(&self, method: Method, path: &str) -> serde_json::Value {
        self.admin(method, path)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn public_get(&self, owner: &Keypair, path: &str) -> Response {
        self.request(Method::GET, path)
            .header("Pubky-Host", owner.public_key().to_z32())
            .send()
            .await
            .unwrap()
    }
}

/// Asserts a JSON error answer with this status and code; returns the body.
pub async fn expect_error(response: Response, status: u16, code: ErrorCode) -> ErrorBody {
    let got = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.unwrap();
    assert_eq!(got, status, "status (body: {text})");
    assert_eq!(content_type.as_deref(), Some("application/json"), "{text}");
    let body: ErrorBody = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(body.error, code, "{text}");
    assert!(!body.message.is_empty());
    body
}

pub async fn expect_ok_json<T: serde::de::DeserializeOwned>(response: Response) -> T {
    let status = response.status();
    let text = response.text().await.unwrap();
    assert!(status.is_success(), "status {status}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Sends raw bytes to the server and returns the whole answer (for requests that HTTP
/// client libraries would normalize).
pub async fn raw_request(host: &TestHost, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host.server().http_addr())
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

pub use hs_testkit::eventually;

/// A request to the server at `url` signed by `key` at `timestamp` (for servers that are
/// not a [`TestHost`], e.g. real processes).
pub fn signed_request(
    http: &reqwest::Client,
    url: &str,
    key: &Keypair,
    method: Method,
    target: &str,
    body: Vec<u8>,
    timestamp: u64,
) -> RequestBuilder {
    let header = AuthHeader::sign(
        key,
        method.as_str(),
        target,
        timestamp,
        &BodyHash::of(&body),
    );
    http.request(method, format!("{url}{target}"))
        .header("Authorization", header.to_header_value())
        .body(body)
}

/// A test guest (`deny_all`, `hostile`; guests/testing), built next to the default
/// guests by the runtime's build script.
pub fn test_guest(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/api-xxxx → target/wasm-guests/...
    let target = exe.ancestors().nth(3).unwrap();
    let path = target.join(format!("wasm-guests/wasm32-wasip2/release/{name}.wasm"));
    assert!(
        path.exists(),
        "{} missing (built by host/runtime/build.rs)",
        path.display()
    );
    path
}
