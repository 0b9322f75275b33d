//! What each scenario sends: paths, bodies and signed headers, and the unmeasured set-up.
//!
//! Signing uses the protocol crate (`AuthHeader::sign`), never a local copy of the rule.
//! The client shares the server's cores, so it does only the work a real client must do
//! per request, and precomputes the rest once:
//! - the value bytes and their SHA-256 are made once (a PUT's body hash does not depend on
//!   its path, so only the Ed25519 signature is made per PUT);
//! - every PUT gets its own path (`/pub/bench/<scenario>/c<conn>-<seq>`), because the
//!   server refuses a replayed write signature;
//! - a signed GET's header is reused within the same second: Ed25519 is deterministic,
//!   so re-signing would produce the same bytes, and the server verifies it either way.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use homeserver_protocol::wire::PUBKY_HOST_HEADER;
use homeserver_protocol::{AuthHeader, BodyHash, CONTENT_DIGEST_HEADER, Keypair};
use http_body_util::Full;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request};

/// 1 KiB and 1 MiB values.
const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Signed PUT of a 1 KiB value, a new path each time.
    #[value(name = "put-1k")]
    Put1k,
    /// Signed PUT of a 16 KiB value, a new path each time (the largest value kept in
    /// its row by default, `storage.inline_max_bytes`).
    #[value(name = "put-16k")]
    Put16k,
    /// Signed PUT of a 1 MiB value, a new path each time.
    #[value(name = "put-1m")]
    Put1m,
    /// Signed PUT of a 10 MiB value, a new path each time (memory under large values).
    #[value(name = "put-10m")]
    Put10m,
    /// Owner-signed GET of a 10 MiB value.
    #[value(name = "get-10m")]
    Get10m,
    /// Owner-signed GET of a 1 KiB value.
    #[value(name = "get-1k")]
    Get1k,
    /// Owner-signed GET of a 1 MiB value.
    #[value(name = "get-1m")]
    Get1m,
    /// Anonymous GET of a 1 KiB value (`Pubky-Host: <owner>`).
    #[value(name = "public-get-1k")]
    PublicGet1k,
    /// Anonymous GET of a 1 MiB value (`Pubky-Host: <owner>`).
    #[value(name = "public-get-1m")]
    PublicGet1m,
    /// GET of a 1 KiB value with a session (`Authorization: Bearer`), so every request
    /// is decided by the capability-policy guest.
    #[value(name = "session-get-1k")]
    SessionGet1k,
    /// GET with a session of `/pub/bench/loop`: with `guests/testing/hostile` as the
    /// capability policy every call spins until the guest deadline, so a few connections
    /// are a hostile load that costs its client little (bench.sh, BENCH_HOSTILE_*). Nothing is
    /// stored first (a PUT there would make the policy spin too).
    #[value(name = "session-get-loop")]
    SessionGetLoop,
    /// Plain `GET /`, for the baseline server.
    #[value(name = "static")]
    Static,
}

/// The kind of request a scenario repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Put,
    SignedGet,
    PublicGet,
    SessionGet,
    Static,
}

impl Scenario {
    pub const ALL: [Scenario; 12] = [
        Scenario::Put1k,
        Scenario::Put16k,
        Scenario::Put1m,
        Scenario::Put10m,
        Scenario::Get10m,
        Scenario::Get1k,
        Scenario::Get1m,
        Scenario::PublicGet1k,
        Scenario::PublicGet1m,
        Scenario::SessionGet1k,
        Scenario::SessionGetLoop,
        Scenario::Static,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Put1k => "put-1k",
            Scenario::Put16k => "put-16k",
            Scenario::Put1m => "put-1m",
            Scenario::Put10m => "put-10m",
            Scenario::Get10m => "get-10m",
            Scenario::Get1k => "get-1k",
            Scenario::Get1m => "get-1m",
            Scenario::PublicGet1k => "public-get-1k",
            Scenario::SessionGet1k => "session-get-1k",
            Scenario::SessionGetLoop => "session-get-loop",
            Scenario::PublicGet1m => "public-get-1m",
            Scenario::Static => "static",
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Scenario::Put1k | Scenario::Put16k | Scenario::Put1m | Scenario::Put10m => Kind::Put,
            Scenario::Get1k | Scenario::Get1m | Scenario::Get10m => Kind::SignedGet,
            Scenario::PublicGet1k | Scenario::PublicGet1m => Kind::PublicGet,
            Scenario::SessionGet1k | Scenario::SessionGetLoop => Kind::SessionGet,
            Scenario::Static => Kind::Static,
        }
    }

    /// Size of the stored value (none for `static`, whose body is the server's choice).
    pub fn value_bytes(self) -> usize {
        match self {
            Scenario::Put1k | Scenario::Get1k | Scenario::PublicGet1k | Scenario::SessionGet1k => {
                KIB
            }
            Scenario::Put16k => 16 * KIB,
            Scenario::Put1m | Scenario::Get1m | Scenario::PublicGet1m => MIB,
            Scenario::Put10m | Scenario::Get10m => 10 * MIB,
            Scenario::Static | Scenario::SessionGetLoop => 0,
        }
    }

    /// Path of the value read by the GET scenarios (written once during set-up).
    fn read_path(self) -> String {
        match self {
            Scenario::SessionGetLoop => "/pub/bench/loop".to_owned(),
            _ => format!("/pub/bench/{}/value", self.name()),
        }
    }
}

/// Deterministic, non-repeating-looking filler (not all zeros, in case anything on the
/// way compresses or deduplicates).
pub fn value_bytes(len: usize) -> Bytes {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let take = (len - out.len()).min(8);
        out.extend_from_slice(&state.to_le_bytes()[..take]);
    }
    Bytes::from(out)
}

/// Current Unix time in seconds (the signed timestamp).
pub fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Everything the requests of one run share, built once before the timed section.
#[derive(Debug)]
pub struct Workload {
    scenario: Scenario,
    keypair: Keypair,
    owner_z32: HeaderValue,
    host: HeaderValue,
    value: Bytes,
    value_hash: BodyHash,
    read_path: String,
    /// `Bearer <token>` of the session scenario, set during set-up.
    session: std::sync::OnceLock<HeaderValue>,
}

impl Workload {
    /// `authority` is the `Host` header value.
    pub fn new(scenario: Scenario, authority: &str) -> Result<Self, hyper::http::Error> {
        let keypair = Keypair::random();
        let value = value_bytes(scenario.value_bytes());
        let value_hash = BodyHash::of(&value);
        Ok(Self {
            scenario,
            owner_z32: HeaderValue::try_from(keypair.public_key().to_z32())?,
            keypair,
            host: HeaderValue::try_from(authority)?,
            value,
            value_hash,
            read_path: scenario.read_path(),
            session: std::sync::OnceLock::new(),
        })
    }

    /// The signed request minting the session of `session-get-*` (after the other set-up).
    pub fn session_request(&self) -> Result<Option<Request<Full<Bytes>>>, hyper::http::Error> {
        if self.scenario.kind() != Kind::SessionGet {
            return Ok(None);
        }
        let body = Bytes::from_static(br#"{"capabilities":["read:/pub/bench/"],"ttl":3600}"#);
        let hash = BodyHash::of(&body);
        self.signed(Method::POST, "/auth/session", body, &hash, unix_secs())
            .map(Some)
    }

    /// Keeps the minted session token for the timed requests.
    pub fn set_session_token(&self, token: &str) -> Result<(), hyper::http::Error> {
        let value = HeaderValue::try_from(format!("Bearer {token}"))?;
        let _ = self.session.set(value);
        Ok(())
    }

    pub fn scenario(&self) -> Scenario {
        self.scenario
    }

    /// The owner's key (z32), the path the GET scenarios read, and the value.
    pub fn owner(&self) -> &str {
        self.owner_z32.to_str().unwrap_or_default()
    }

    pub fn read_path(&self) -> &str {
        &self.read_path
    }

    pub fn value(&self) -> &Bytes {
        &self.value
    }

    pub fn value_hash(&self) -> &BodyHash {
        &self.value_hash
    }

    /// `Authorization` of a PUT of the value at `path`, signed now.
    pub fn put_authorization(&self, path: &str) -> String {
        AuthHeader::sign(&self.keypair, "PUT", path, unix_secs(), &self.value_hash)
            .to_header_value()
    }

    /// `Authorization` of the owner's GET of the read path, signed now (valid while the
    /// server's clock-skew window lasts: five minutes).
    pub fn get_authorization(&self) -> String {
        AuthHeader::sign(
            &self.keypair,
            "GET",
            &self.read_path,
            unix_secs(),
            &BodyHash::empty(),
        )
        .to_header_value()
    }

    /// The requests made before the timed section, in order: sign up (all but `static`),
    /// then store the value the GET scenarios read.
    pub fn setup_requests(&self) -> Result<Vec<Request<Full<Bytes>>>, hyper::http::Error> {
        let mut requests = Vec::new();
        if self.scenario.kind() == Kind::Static {
            return Ok(requests);
        }
        requests.push(self.signed(
            Method::POST,
            "/signup",
            Bytes::new(),
            &BodyHash::empty(),
            unix_secs(),
        )?);
        if matches!(
            self.scenario.kind(),
            Kind::SignedGet | Kind::PublicGet | Kind::SessionGet
        ) && self.scenario != Scenario::SessionGetLoop
        {
            requests.push(self.signed(
                Method::PUT,
                &self.read_path,
                self.value.clone(),
                &self.value_hash,
                unix_secs(),
            )?);
        }
        Ok(requests)
    }

    fn signed(
        &self,
        method: Method,
        target: &str,
        body: Bytes,
        body_hash: &BodyHash,
        timestamp: u64,
    ) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
        signed_request(
            &self.keypair,
            &self.host,
            method,
            target,
            body,
            body_hash,
            timestamp,
        )
    }
}

/// A request signed by `keypair` (`Authorization` over method, target, time and the
/// body's hash, which the caller computes once per distinct body).
pub fn signed_request(
    keypair: &Keypair,
    host: &HeaderValue,
    method: Method,
    target: &str,
    body: Bytes,
    body_hash: &BodyHash,
    timestamp: u64,
) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
    let auth =
        AuthHeader::sign(keypair, method.as_str(), target, timestamp, body_hash).to_header_value();
    let mut builder = Request::builder()
        .method(method)
        .uri(target)
        .header(HOST, host.clone())
        .header(AUTHORIZATION, auth);
    if matches!(
        *builder.method_ref().unwrap_or(&Method::GET),
        Method::PUT | Method::POST
    ) {
        // As pk does: the server checks the signature before reading the body.
        builder = builder.header(CONTENT_DIGEST_HEADER, body_hash.to_content_digest());
    }
    if !body.is_empty() {
        builder = builder.header(CONTENT_TYPE, "application/octet-stream");
    }
    builder.body(Full::new(body))
}

/// Makes the timed requests of one connection.
#[derive(Debug)]
pub struct RequestStream {
    workload: Arc<Workload>,
    connection: usize,
    seq: u64,
    /// Signed-GET header for a given second.
    cached_get_auth: Option<(u64, HeaderValue)>,
}

impl RequestStream {
    pub fn new(workload: Arc<Workload>, connection: usize) -> Self {
        Self {
            workload,
            connection,
            seq: 0,
            cached_get_auth: None,
        }
    }

    /// The next request to send.
    pub fn next_request(&mut self) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
        let w = &*self.workload;
        self.seq += 1;
        match w.scenario.kind() {
            Kind::Put => {
                let path = format!(
                    "/pub/bench/{}/c{}-{}",
                    w.scenario.name(),
                    self.connection,
                    self.seq
                );
                w.signed(
                    Method::PUT,
                    &path,
                    w.value.clone(),
                    &w.value_hash,
                    unix_secs(),
                )
            }
            Kind::SignedGet => {
                let now = unix_secs();
                let auth = match &self.cached_get_auth {
                    Some((ts, value)) if *ts == now => value.clone(),
                    _ => {
                        let value = HeaderValue::try_from(
                            AuthHeader::sign(
                                &w.keypair,
                                "GET",
                                &w.read_path,
                                now,
                                &BodyHash::empty(),
                            )
                            .to_header_value(),
                        )?;
                        self.cached_get_auth = Some((now, value.clone()));
                        value
                    }
                };
                Request::builder()
                    .method(Method::GET)
                    .uri(w.read_path.as_str())
                    .header(HOST, w.host.clone())
                    .header(AUTHORIZATION, auth)
                    .body(Full::new(Bytes::new()))
            }
            Kind::PublicGet => Request::builder()
                .method(Method::GET)
                .uri(w.read_path.as_str())
                .header(HOST, w.host.clone())
                .header(PUBKY_HOST_HEADER, w.owner_z32.clone())
                .body(Full::new(Bytes::new())),
            Kind::SessionGet => {
                let mut builder = Request::builder()
                    .method(Method::GET)
                    .uri(w.read_path.as_str())
                    .header(HOST, w.host.clone());
                if let Some(bearer) = w.session.get() {
                    builder = builder.header(AUTHORIZATION, bearer.clone());
                }
                builder.body(Full::new(Bytes::new()))
            }
            Kind::Static => Request::builder()
                .method(Method::GET)
                .uri("/")
                .header(HOST, w.host.clone())
                .body(Full::new(Bytes::new())),
        }
    }
}

#[cfg(test)]
mod tests {
    use homeserver_protocol::StoragePath;

    use super::*;

    fn auth_of(req: &Request<Full<Bytes>>) -> AuthHeader {
        AuthHeader::parse(req.headers()[AUTHORIZATION].to_str().unwrap()).unwrap()
    }

    #[test]
    fn names_round_trip_through_clap() {
        use clap::ValueEnum;
        for s in Scenario::ALL {
            assert_eq!(Scenario::from_str(s.name(), false), Ok(s));
        }
    }

    #[test]
    fn value_bytes_have_the_requested_size() {
        assert_eq!(value_bytes(0).len(), 0);
        assert_eq!(value_bytes(1023).len(), 1023);
        assert_eq!(value_bytes(MIB).len(), MIB);
        assert_ne!(value_bytes(16)[..8], value_bytes(16)[8..]);
    }

    #[test]
    fn puts_use_distinct_valid_paths_and_verify() {
        let w = Arc::new(Workload::new(Scenario::Put1k, "127.0.0.1:1").unwrap());
        let mut a = RequestStream::new(w.clone(), 0);
        let mut b = RequestStream::new(w, 1);
        let reqs = [
            a.next_request().unwrap(),
            a.next_request().unwrap(),
            b.next_request().unwrap(),
        ];
        let paths: Vec<_> = reqs.iter().map(|r| r.uri().path().to_owned()).collect();
        assert_eq!(paths[0], "/pub/bench/put-1k/c0-1");
        assert_eq!(paths[1], "/pub/bench/put-1k/c0-2");
        assert_eq!(paths[2], "/pub/bench/put-1k/c1-1");
        for req in &reqs {
            assert!(StoragePath::parse(req.uri().path()).is_ok());
            assert_eq!(req.method(), Method::PUT);
            assert_eq!(req.headers()[HOST], "127.0.0.1:1");
            let auth = auth_of(req);
            auth.verify(
                "PUT",
                req.uri().path(),
                &BodyHash::of(&value_bytes(KIB)),
                unix_secs(),
            )
            .unwrap();
        }
    }

    #[test]
    fn setup_signs_up_then_stores_the_read_value() {
        let w = Workload::new(Scenario::Get1k, "localhost:2").unwrap();
        let setup = w.setup_requests().unwrap();
        assert_eq!(setup.len(), 2);
        assert_eq!(setup[0].method(), Method::POST);
        assert_eq!(setup[0].uri(), "/signup");
        auth_of(&setup[0])
            .verify("POST", "/signup", &BodyHash::empty(), unix_secs())
            .unwrap();
        assert_eq!(setup[1].method(), Method::PUT);
        assert_eq!(setup[1].uri(), "/pub/bench/get-1k/value");

        let put_only = Workload::new(Scenario::Put1m, "localhost:2").unwrap();
        assert_eq!(put_only.setup_requests().unwrap().len(), 1);
        let fixed = Workload::new(Scenario::Static, "localhost:2").unwrap();
        assert!(fixed.setup_requests().unwrap().is_empty());
    }

    #[test]
    fn reads_are_signed_or_name_the_owner() {
        let w = Arc::new(Workload::new(Scenario::Get1m, "h").unwrap());
        let req = RequestStream::new(w, 0).next_request().unwrap();
        assert_eq!(req.uri(), "/pub/bench/get-1m/value");
        auth_of(&req)
            .verify(
                "GET",
                "/pub/bench/get-1m/value",
                &BodyHash::empty(),
                unix_secs(),
            )
            .unwrap();

        let w = Arc::new(Workload::new(Scenario::PublicGet1k, "h").unwrap());
        let owner = w.keypair.public_key().to_z32();
        let req = RequestStream::new(w, 0).next_request().unwrap();
        assert!(req.headers().get(AUTHORIZATION).is_none());
        assert_eq!(req.headers()[PUBKY_HOST_HEADER], owner.as_str());
    }
}
