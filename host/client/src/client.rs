//! [`PkClient`]: one homeserver, optionally one user's key pair, and the API operations.
//!
//! Flow of every request: validate the path with the protocol's [`StoragePath`], build
//! the [`RequestTarget`], sign it (own data) or name the owner with `Pubky-Host`
//! (someone else's public data), send, and turn a non-2xx answer into
//! [`ClientError::Api`]. Writes get their timestamp from the [`RequestClock`]; a write
//! the server still refuses as a replay (an identical one from another process in the
//! same second) is retried with a later timestamp (at most three times).
//!
//! A request the server turns away for load (429 `rate_limit_exceeded`, 503
//! `service_unavailable`) is retried after the server's `Retry-After`, a bounded number
//! of times and never after a wait longer than the [`RetryPolicy`] allows; every retry is
//! signed afresh (a write's signature is accepted once, and the wait may be long). An
//! observer set with [`PkClient::on_retry`] hears about each wait (`pk` prints it).
//!
//! Bodies are streamed both ways: a file is hashed in a first pass and then streamed
//! from disk, an arbitrary reader is spooled to an anonymous temporary file, and a GET
//! hands back a [`GetResponse`] that is read chunk by chunk.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use homeserver_protocol::retry_after::parse_retry_after;
use homeserver_protocol::wire::{
    DeleteResult, ListEntry, ListResult, PutResult, SessionCreated, SessionRequest, SignupResult,
};
use homeserver_protocol::{
    AuthHeader, BodyHash, CONTENT_DIGEST_HEADER, Keypair, PublicKey, StoragePath,
};
use reqwest::header::{
    AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderName, IF_NONE_MATCH, RETRY_AFTER,
};
use reqwest::{Method, Response, StatusCode};
use serde_json::de::from_slice;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;
use url::Url;

use crate::clock::RequestClock;
use crate::error::ClientError;
use crate::response::{EntryMeta, GetResponse};
use crate::target::{ListOptions, RequestTarget, signup_query};

pub use homeserver_protocol::wire::AccountInfo;

/// The homeserver a client talks to when none is given.
pub const DEFAULT_HOMESERVER: &str = "http://127.0.0.1:6286";

pub use homeserver_protocol::wire::PUBKY_HOST_HEADER;

/// How often a write refused as a replay is signed again with a later timestamp. Each
/// retry moves this client's clock one second ahead of identical writes it cannot see
/// (another process's), far inside the server's 300 s skew window.
const MAX_REPLAY_RETRIES: u32 = 3;

/// Chunk size for hashing, spooling and streaming bodies.
const CHUNK: usize = 64 * 1024;

/// A client of one homeserver. Cheap to clone; clones share the connection pool and the
/// write clock.
#[derive(Debug, Clone)]
pub struct PkClient {
    http: reqwest::Client,
    base: Url,
    keypair: Option<Keypair>,
    clock: Arc<RequestClock>,
    retry: RetryPolicy,
    on_retry: Option<RetryObserver>,
}

/// How requests turned away for load (429, 503) are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; 0 turns retrying off.
    pub max_retries: u32,
    /// The longest wait accepted: a server asking for more is not retried (its error is
    /// returned at once, saying how long it asked for).
    pub max_wait: Duration,
    /// The wait when the answer carries no usable `Retry-After`.
    pub default_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 5,
            max_wait: Duration::from_secs(60),
            default_wait: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// No retries: every 429 or 503 is returned as it is.
    pub fn never() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }
}

/// What a [`PkClient`] tells its retry observer before it waits and retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryNotice {
    pub method: Method,
    /// The request target (path and query).
    pub target: String,
    /// The answer that is retried: 429 or 503.
    pub status: StatusCode,
    /// How long the client waits before the retry.
    pub wait: Duration,
    /// Which retry this is (1 for the first) and how many are allowed.
    pub retry: u32,
    pub max_retries: u32,
}

/// A callback told about every retry; see [`PkClient::on_retry`].
#[derive(Clone)]
struct RetryObserver(Arc<dyn Fn(&RetryNotice) + Send + Sync>);

impl std::fmt::Debug for RetryObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetryObserver")
    }
}

/// Told the number of body bytes handed to the connection so far in the current attempt
/// (it starts again from 0 when a request is retried). For progress bars.
pub type Progress = Arc<dyn Fn(u64) + Send + Sync>;

/// Whether `POST /signup` registered the key now or found it registered already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignupStatus {
    pub result: SignupResult,
    /// True when this request created the account (201); false when the key had signed
    /// up before (200).
    pub created: bool,
}

/// How a request is authorized.
#[derive(Clone, Copy)]
pub(crate) enum Auth<'a> {
    /// Signed by the key: the caller's own data (or a request that should count
    /// against the caller's own rate limit).
    Sign(&'a Keypair),
    /// Someone's public data: `Pubky-Host`, no credentials.
    Public(PublicKey),
    /// Nothing.
    Anonymous,
}

/// A request body that can be produced again for a retry.
enum Payload {
    Empty,
    Bytes(Bytes),
    /// An open file (rewound before each send) and its length.
    File {
        file: std::fs::File,
        len: u64,
    },
}

impl Payload {
    fn body(&self, progress: Option<&Progress>) -> Result<(reqwest::Body, u64), ClientError> {
        match self {
            Payload::Empty => Ok((reqwest::Body::from(Bytes::new()), 0)),
            Payload::Bytes(b) => {
                if let Some(progress) = progress {
                    progress(b.len() as u64);
                }
                Ok((reqwest::Body::from(b.clone()), b.len() as u64))
            }
            Payload::File { file, len } => {
                // The clone shares the offset with `file`: rewinding it rewinds both,
                // which is what a retry needs.
                let mut file = file
                    .try_clone()
                    .map_err(|e| ClientError::io("cannot reopen the body file", e))?;
                file.seek(SeekFrom::Start(0))
                    .map_err(|e| ClientError::io("cannot rewind the body file", e))?;
                let stream = ReaderStream::with_capacity(tokio::fs::File::from_std(file), CHUNK);
                let body = match progress {
                    None => reqwest::Body::wrap_stream(stream),
                    Some(progress) => {
                        let progress = progress.clone();
                        progress(0);
                        let mut sent = 0u64;
                        reqwest::Body::wrap_stream(stream.map(move |chunk| {
                            if let Ok(chunk) = &chunk {
                                sent += chunk.len() as u64;
                                progress(sent);
                            }
                            chunk
                        }))
                    }
                };
                Ok((body, *len))
            }
        }
    }
}

impl PkClient {
    /// A client of the homeserver at `base_url` (e.g. `http://127.0.0.1:6286`), acting as
    /// `keypair` when one is given. Without a key pair only public reads work.
    pub fn new(base_url: &str, keypair: Option<Keypair>) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("pk-client/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        Self::with_http_client(http, base_url, keypair)
    }

    /// Like [`new`](Self::new) with a preconfigured HTTP client (timeouts, proxies, TLS).
    pub fn with_http_client(
        http: reqwest::Client,
        base_url: &str,
        keypair: Option<Keypair>,
    ) -> Result<Self, ClientError> {
        Ok(Self {
            http,
            base: parse_base_url(base_url)?,
            keypair,
            clock: Arc::new(RequestClock::default()),
            retry: RetryPolicy::default(),
            on_retry: None,
        })
    }

    /// How answers 429 and 503 are retried ([`RetryPolicy::default`] unless changed).
    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    /// Calls `observer` before every wait for a retry (e.g. to tell a user why nothing
    /// happens for a while).
    pub fn on_retry(mut self, observer: impl Fn(&RetryNotice) + Send + Sync + 'static) -> Self {
        self.on_retry = Some(RetryObserver(Arc::new(observer)));
        self
    }

    pub fn base_url(&self) -> &Url {
        &self.base
    }

    pub fn keypair(&self) -> Option<&Keypair> {
        self.keypair.as_ref()
    }

    /// The public key this client acts as, when it has a key pair.
    pub fn public_key(&self) -> Option<PublicKey> {
        self.keypair.as_ref().map(Keypair::public_key)
    }

    /// `POST /signup[?signup_token=T]`: registers this client's key with the homeserver
    /// (safe to repeat: a key that signed up before gets its account back). The token is
    /// sent in upper case, the form the server makes them in.
    pub async fn signup(&self, token: Option<&str>) -> Result<SignupResult, ClientError> {
        Ok(self.signup_status(token).await?.result)
    }

    /// Like [`signup`](Self::signup), and says whether the account was created now.
    pub async fn signup_status(&self, token: Option<&str>) -> Result<SignupStatus, ClientError> {
        let query = signup_query(token);
        let target = RequestTarget::new(&self.base, "/signup", query.as_deref());
        let response = self
            .send_write(
                Method::POST,
                &target,
                BodyHash::empty(),
                &Payload::Empty,
                None,
            )
            .await?;
        let created = response.status() == StatusCode::CREATED;
        Ok(SignupStatus {
            result: json(response).await?,
            created,
        })
    }

    /// `GET /account`: this client's account (usage, quota in force, value size limit).
    /// A key that never signed up gets a 404 ([`ClientError::is_not_found`]).
    pub async fn account(&self) -> Result<AccountInfo, ClientError> {
        let target = RequestTarget::new(&self.base, "/account", None);
        let auth = Auth::Sign(self.signer()?);
        json(self.send(Method::GET, &target, auth, None, &[]).await?).await
    }

    /// `GET /info`: what the homeserver says of itself (its public key).
    pub async fn server_info(&self) -> Result<crate::pkarr::ServerInfo, ClientError> {
        let target = RequestTarget::new(&self.base, "/info", None);
        json(
            self.send(Method::GET, &target, Auth::Anonymous, None, &[])
                .await?,
        )
        .await
    }

    /// `PUT /pkarr`: hands the homeserver this user's pkarr record (see
    /// [`crate::pkarr`]), so that it republishes it on the DHT. True when it replaced the
    /// stored one (false: the stored one is as new or newer).
    pub async fn store_record(&self, packet: &pkarr::SignedPacket) -> Result<bool, ClientError> {
        #[derive(serde::Deserialize)]
        struct Stored {
            stored: bool,
        }
        let body = packet.to_relay_payload();
        let target = RequestTarget::new(&self.base, "/pkarr", None);
        let response = self
            .send_write(
                Method::PUT,
                &target,
                BodyHash::of(&body),
                &Payload::Bytes(body.clone()),
                None,
            )
            .await?;
        let stored: Stored = json(response).await?;
        Ok(stored.stored)
    }

    /// `POST /auth/session`: a bearer token limited to `capabilities`
    /// (`<read|write|*>:<path prefix>`) for `ttl` seconds (server default 3600).
    pub async fn create_session(
        &self,
        capabilities: &[String],
        ttl: Option<u64>,
    ) -> Result<SessionCreated, ClientError> {
        let body = serde_json::to_vec(&SessionRequest {
            capabilities: capabilities.to_vec(),
            ttl,
        })
        .map_err(|e| ClientError::io("encoding the session request", std::io::Error::other(e)))?;
        let body = Bytes::from(body);
        let target = RequestTarget::new(&self.base, "/auth/session", None);
        let response = self
            .send_write(
                Method::POST,
                &target,
                BodyHash::of(&body),
                &Payload::Bytes(body.clone()),
                None,
            )
            .await?;
        json(response).await
    }

    /// `PUT path` with a value held in memory.
    pub async fn put_bytes(
        &self,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<PutResult, ClientError> {
        let path = entry_path(path)?;
        let body = body.into();
        let hash = BodyHash::of(&body);
        self.put(&path, hash, Payload::Bytes(body), None).await
    }

    /// `PUT path` with the content of a local file, streamed from disk (hashed in a first
    /// pass, since the signature covers the body's SHA-256).
    pub async fn put_file(&self, path: &str, file: &Path) -> Result<PutResult, ClientError> {
        self.put_file_with_progress(path, file, None).await
    }

    /// [`put_file`](Self::put_file), telling `progress` how many bytes went out so far.
    pub async fn put_file_with_progress(
        &self,
        path: &str,
        file: &Path,
        progress: Option<Progress>,
    ) -> Result<PutResult, ClientError> {
        let path = entry_path(path)?;
        let shown = file.display().to_string();
        let opened = std::fs::File::open(file)
            .map_err(|e| ClientError::io(format!("cannot open {shown}"), e))?;
        let (opened, hash, len) = tokio::task::spawn_blocking(move || hash_file(opened))
            .await
            .map_err(|e| ClientError::io(format!("cannot read {shown}"), std::io::Error::other(e)))?
            .map_err(|e| ClientError::io(format!("cannot read {shown}"), e))?;
        self.put(
            &path,
            hash,
            Payload::File { file: opened, len },
            progress.as_ref(),
        )
        .await
    }

    /// `PUT path` with everything `reader` yields (e.g. standard input). The input is
    /// spooled to an anonymous temporary file first, because the body hash must be known
    /// before the request starts.
    pub async fn put_reader<R>(&self, path: &str, reader: R) -> Result<PutResult, ClientError>
    where
        R: AsyncRead + Unpin,
    {
        self.put_reader_with_progress(path, reader, None).await
    }

    /// [`put_reader`](Self::put_reader), telling `progress` how many bytes of the spooled
    /// input went out so far.
    pub async fn put_reader_with_progress<R>(
        &self,
        path: &str,
        mut reader: R,
        progress: Option<Progress>,
    ) -> Result<PutResult, ClientError>
    where
        R: AsyncRead + Unpin,
    {
        let path = entry_path(path)?;
        let spool =
            tempfile::tempfile().map_err(|e| ClientError::io("cannot create a spool file", e))?;
        let mut spool = tokio::fs::File::from_std(spool);
        let mut hasher = Sha256::new();
        let mut len = 0u64;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = reader
                .read(&mut buf)
                .await
                .map_err(|e| ClientError::io("cannot read the input", e))?;
            let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
                break;
            };
            hasher.update(chunk);
            spool
                .write_all(chunk)
                .await
                .map_err(|e| ClientError::io("cannot write the spool file", e))?;
            len += n as u64;
        }
        spool
            .flush()
            .await
            .map_err(|e| ClientError::io("cannot write the spool file", e))?;
        let file = spool.into_std().await;
        self.put(
            &path,
            BodyHash::from_hasher(hasher),
            Payload::File { file, len },
            progress.as_ref(),
        )
        .await
    }

    /// `GET path`: a streamed entry. `host` names the owner for a read of someone else's
    /// public data; `None` (or this client's own key) reads the caller's own data, signed.
    pub async fn get(
        &self,
        path: &str,
        host: Option<PublicKey>,
    ) -> Result<GetResponse, ClientError> {
        let path = entry_path(path)?;
        let target = RequestTarget::new(&self.base, path.as_str(), None);
        let response = self.send_read(Method::GET, &target, host, None).await?;
        Ok(GetResponse::new(response))
    }

    /// `GET path` with `If-None-Match: etag`; `None` when the entry is unchanged (304).
    pub async fn get_if_none_match(
        &self,
        path: &str,
        etag: &str,
        host: Option<PublicKey>,
    ) -> Result<Option<GetResponse>, ClientError> {
        let path = entry_path(path)?;
        let target = RequestTarget::new(&self.base, path.as_str(), None);
        let response = self
            .send_read(Method::GET, &target, host, Some(etag))
            .await?;
        if response.status() == StatusCode::NOT_MODIFIED {
            return Ok(None);
        }
        Ok(Some(GetResponse::new(response)))
    }

    /// `GET path`, the whole value in memory.
    pub async fn get_bytes(
        &self,
        path: &str,
        host: Option<PublicKey>,
    ) -> Result<Bytes, ClientError> {
        self.get(path, host).await?.bytes().await
    }

    /// `HEAD path`: size, ETag and update time without the value. A HEAD error has no
    /// body, so failures come back as [`ClientError::UnexpectedStatus`]
    /// (see [`ClientError::is_not_found`]).
    pub async fn head(
        &self,
        path: &str,
        host: Option<PublicKey>,
    ) -> Result<EntryMeta, ClientError> {
        let path = entry_path(path)?;
        let target = RequestTarget::new(&self.base, path.as_str(), None);
        let response = self.send_read(Method::HEAD, &target, host, None).await?;
        Ok(EntryMeta::from_headers(response.headers()))
    }

    /// One page of the listing `path` (which must end in `/`).
    pub async fn list(
        &self,
        path: &str,
        options: ListOptions,
        host: Option<PublicKey>,
    ) -> Result<ListResult, ClientError> {
        let path = listing_path(path)?;
        let query = options.to_query();
        let target = RequestTarget::new(&self.base, path.as_str(), query.as_deref());
        let response = self.send_read(Method::GET, &target, host, None).await?;
        json(response).await
    }

    /// Every entry of the listing `path`, following cursors from `options` on;
    /// `options.limit` is the page size. Holds the whole listing in memory.
    pub async fn list_all(
        &self,
        path: &str,
        mut options: ListOptions,
        host: Option<PublicKey>,
    ) -> Result<Vec<ListEntry>, ClientError> {
        let mut all = Vec::new();
        loop {
            let page = self.list(path, options.clone(), host).await?;
            all.extend(page.entries);
            match page.cursor {
                Some(cursor) if page.has_more => options.cursor = Some(cursor),
                _ => return Ok(all),
            }
        }
    }

    /// `DELETE path` in the caller's own space.
    pub async fn delete(&self, path: &str) -> Result<DeleteResult, ClientError> {
        let path = entry_path(path)?;
        let target = RequestTarget::new(&self.base, path.as_str(), None);
        let response = self
            .send_write(
                Method::DELETE,
                &target,
                BodyHash::empty(),
                &Payload::Empty,
                None,
            )
            .await?;
        json(response).await
    }

    async fn put(
        &self,
        path: &StoragePath,
        hash: BodyHash,
        payload: Payload,
        progress: Option<&Progress>,
    ) -> Result<PutResult, ClientError> {
        let target = RequestTarget::new(&self.base, path.as_str(), None);
        let response = self
            .send_write(Method::PUT, &target, hash, &payload, progress)
            .await?;
        json(response).await
    }

    fn signer(&self) -> Result<&Keypair, ClientError> {
        self.keypair.as_ref().ok_or(ClientError::MissingKey)
    }

    /// How a read of `host`'s data (`None`: the caller's own) is authorized.
    fn reader(&self, host: Option<PublicKey>) -> Result<Auth<'_>, ClientError> {
        match (host, &self.keypair) {
            (Some(host), Some(keypair)) if keypair.public_key() == host => Ok(Auth::Sign(keypair)),
            (Some(host), _) => Ok(Auth::Public(host)),
            (None, Some(keypair)) => Ok(Auth::Sign(keypair)),
            (None, None) => Err(ClientError::MissingKey),
        }
    }

    /// Signed when the client has a key (so the request counts against the key's rate
    /// limit rather than the IP's), anonymous otherwise: for endpoints that need no
    /// credentials, such as the event feed and streams.
    pub(crate) fn optional_signature(&self) -> Auth<'_> {
        self.keypair.as_ref().map_or(Auth::Anonymous, Auth::Sign)
    }

    /// A signed write; retried with a later timestamp if the server has seen its
    /// signature before (identical writes from other processes in the same second).
    async fn send_write(
        &self,
        method: Method,
        target: &RequestTarget,
        body_hash: BodyHash,
        payload: &Payload,
        progress: Option<&Progress>,
    ) -> Result<Response, ClientError> {
        let keypair = self.signer()?;
        let body = Some(WriteBody {
            hash: &body_hash,
            payload,
            progress,
        });
        let mut replays = 0;
        loop {
            match self
                .send(method.clone(), target, Auth::Sign(keypair), body, &[])
                .await
            {
                // A fresh timestamp comes from the clock: an identical write gets a
                // later one than the refused attempt.
                Err(e) if e.is_replay_refusal() && replays < MAX_REPLAY_RETRIES => {
                    replays += 1;
                }
                other => return other,
            }
        }
    }

    async fn send_read(
        &self,
        method: Method,
        target: &RequestTarget,
        host: Option<PublicKey>,
        if_none_match: Option<&str>,
    ) -> Result<Response, ClientError> {
        let auth = self.reader(host)?;
        let extra: Vec<(HeaderName, String)> = if_none_match
            .map(|etag| (IF_NONE_MATCH, etag.to_owned()))
            .into_iter()
            .collect();
        self.send(method, target, auth, None, &extra).await
    }

    /// Sends a request, signing every attempt afresh, and retries answers 429 and 503
    /// as the [`RetryPolicy`] allows. A 2xx or 304 answer is returned; any other becomes
    /// a [`ClientError`].
    pub(crate) async fn send(
        &self,
        method: Method,
        target: &RequestTarget,
        auth: Auth<'_>,
        body: Option<WriteBody<'_>>,
        extra_headers: &[(HeaderName, String)],
    ) -> Result<Response, ClientError> {
        let mut retry = 0u32;
        loop {
            let mut request = self.http.request(method.clone(), target.url.clone());
            for (name, value) in extra_headers {
                request = request.header(name, value);
            }
            let empty = BodyHash::empty();
            let body_hash = body.map_or(&empty, |b| b.hash);
            match auth {
                Auth::Sign(keypair) => {
                    let timestamp = if body.is_some() {
                        self.clock
                            .write_timestamp(method.as_str(), &target.target, body_hash)
                    } else {
                        self.clock.read_timestamp()
                    };
                    let header = AuthHeader::sign(
                        keypair,
                        method.as_str(),
                        &target.target,
                        timestamp,
                        body_hash,
                    );
                    request = request.header(AUTHORIZATION, header.to_header_value());
                }
                Auth::Public(host) => request = request.header(PUBKY_HOST_HEADER, host.to_z32()),
                Auth::Anonymous => {}
            }
            if let Some(body) = body {
                let (stream, len) = body.payload.body(body.progress)?;
                request = request
                    // The body's hash up front: the server checks the signature before
                    // it reads the body, streams it straight to storage, and counts the
                    // request against this key's rate limit rather than the IP's.
                    .header(CONTENT_DIGEST_HEADER, body_hash.to_content_digest())
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .header(CONTENT_LENGTH, len)
                    .body(stream);
            }
            let response = request
                .send()
                .await
                .map_err(|e| ClientError::from_transport(e, &self.base))?;
            let status = response.status();
            if status == StatusCode::NOT_MODIFIED {
                return Ok(response);
            }
            if retry < self.retry.max_retries
                && let Some(wait) = retry_wait(status, response.headers(), &self.retry)
            {
                retry += 1;
                if let Some(observer) = &self.on_retry {
                    (observer.0)(&RetryNotice {
                        method: method.clone(),
                        target: target.target.clone(),
                        status,
                        wait,
                        retry,
                        max_retries: self.retry.max_retries,
                    });
                }
                drop(response);
                tokio::time::sleep(wait).await;
                continue;
            }
            return check(response).await;
        }
    }
}

/// The body of a write, for [`PkClient::send`].
#[derive(Clone, Copy)]
pub(crate) struct WriteBody<'a> {
    hash: &'a BodyHash,
    payload: &'a Payload,
    progress: Option<&'a Progress>,
}

/// How long to wait before retrying an answer, when it should be retried: 429 and 503
/// with a `Retry-After` (seconds, or an HTTP date) within the policy's bound, or without
/// one, the policy's default wait.
pub(crate) fn retry_wait(
    status: StatusCode,
    headers: &HeaderMap,
    policy: &RetryPolicy,
) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let asked = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
    let wait = asked.unwrap_or(policy.default_wait);
    (wait <= policy.max_wait).then_some(wait)
}

fn parse_base_url(text: &str) -> Result<Url, ClientError> {
    let invalid = |reason: &str| ClientError::InvalidBaseUrl {
        url: text.to_owned(),
        reason: reason.to_owned(),
    };
    // `127.0.0.1:6286` or `localhost:6286` means plain HTTP (as curl reads it); without
    // this, the URL parser takes `localhost` for a scheme or finds no base at all.
    let with_scheme;
    let text_with_scheme = if text.contains("://") {
        text
    } else {
        with_scheme = format!("http://{text}");
        &with_scheme
    };
    let url = Url::parse(text_with_scheme).map_err(|e| invalid(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https"));
    }
    if url.cannot_be_a_base() || url.host().is_none() {
        return Err(invalid("it has no host"));
    }
    // The signature covers the path as the server sees it, so the API must sit at the
    // root of the URL; a proxy that strips a prefix would break every signature.
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("it must not have a path, query or fragment"));
    }
    Ok(url)
}

/// A valid path of a single entry (not ending in `/`).
fn entry_path(path: &str) -> Result<StoragePath, ClientError> {
    let parsed = storage_path(path)?;
    if parsed.is_listing() {
        return Err(ClientError::PathKind {
            path: path.to_owned(),
            expected: "an entry path must not end with /",
        });
    }
    Ok(parsed)
}

/// A valid listing path (ending in `/`).
fn listing_path(path: &str) -> Result<StoragePath, ClientError> {
    let parsed = storage_path(path)?;
    if !parsed.is_listing() {
        return Err(ClientError::PathKind {
            path: path.to_owned(),
            expected: "a listing path must end with /",
        });
    }
    Ok(parsed)
}

pub(crate) fn storage_path(path: &str) -> Result<StoragePath, ClientError> {
    StoragePath::parse(path).map_err(|source| ClientError::InvalidPath {
        path: path.to_owned(),
        source,
    })
}

/// First pass over a file: its SHA-256 and length, then hand the file back.
fn hash_file(mut file: std::fs::File) -> std::io::Result<(std::fs::File, BodyHash, u64)> {
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = file.read(&mut buf)?;
        let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
            break;
        };
        hasher.update(chunk);
        len += n as u64;
    }
    Ok((file, BodyHash::from_hasher(hasher), len))
}

/// Passes a 2xx answer through; turns any other into a [`ClientError`].
pub(crate) async fn check(response: Response) -> Result<Response, ClientError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.bytes().await?;
    Err(ClientError::from_response_body(status, &body))
}

pub(crate) async fn json<T: serde::de::DeserializeOwned>(
    response: Response,
) -> Result<T, ClientError> {
    let body = response.bytes().await?;
    from_slice(&body).map_err(|e| ClientError::InvalidResponse(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_rules() {
        assert!(parse_base_url("http://127.0.0.1:6286").is_ok());
        assert!(parse_base_url("https://hs.example.org/").is_ok());
        // Without a scheme: plain HTTP, as curl reads it.
        for bare in [
            "127.0.0.1:6286",
            "localhost:6286",
            "hs.example.org",
            "[::1]:6286",
        ] {
            let url = parse_base_url(bare).unwrap();
            assert_eq!(url.as_str(), format!("http://{bare}/"), "{bare}");
        }
        for bad in [
            "ftp://x.org",
            "http://x.org/prefix",
            "http://x.org/?a=1",
            "not a url",
        ] {
            assert!(
                matches!(parse_base_url(bad), Err(ClientError::InvalidBaseUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn retry_waits_follow_retry_after_within_bounds() {
        let policy = RetryPolicy::default();
        let headers = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(RETRY_AFTER, value.parse().unwrap());
            h
        };
        let limited = StatusCode::TOO_MANY_REQUESTS;
        let busy = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            retry_wait(limited, &headers("7"), &policy),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_wait(busy, &headers(" 0 "), &policy),
            Some(Duration::ZERO)
        );
        // No usable header: the default wait.
        assert_eq!(
            retry_wait(limited, &HeaderMap::new(), &policy),
            Some(policy.default_wait)
        );
        assert_eq!(
            retry_wait(busy, &headers("soon"), &policy),
            Some(policy.default_wait)
        );
        // An HTTP date in the past: at once.
        assert_eq!(
            retry_wait(limited, &headers("Tue, 14 Nov 2023 22:13:20 GMT"), &policy),
            Some(Duration::ZERO)
        );
        // Longer than the policy allows: not retried.
        assert_eq!(retry_wait(limited, &headers("61"), &policy), None);
        // Other answers are never retried.
        for status in [
            StatusCode::OK,
            StatusCode::NOT_FOUND,
            StatusCode::BAD_GATEWAY,
        ] {
            assert_eq!(retry_wait(status, &headers("1"), &policy), None);
        }
    }

    #[test]
    fn paths_are_checked_before_sending() {
        assert!(entry_path("/pub/a.txt").is_ok());
        assert!(matches!(
            entry_path("/pub/a b"),
            Err(ClientError::InvalidPath { .. })
        ));
        assert!(matches!(
            entry_path("/etc/passwd"),
            Err(ClientError::InvalidPath { .. })
        ));
        assert!(matches!(
            entry_path("/pub/dir/"),
            Err(ClientError::PathKind { .. })
        ));
        assert!(listing_path("/pub/").is_ok());
        assert!(matches!(
            listing_path("/pub/a"),
            Err(ClientError::PathKind { .. })
        ));
    }

    #[test]
    fn readers_choose_signature_or_host() {
        let me = Keypair::from_seed(&[1; 32]);
        let other = Keypair::from_seed(&[2; 32]).public_key();
        let client = PkClient::new(DEFAULT_HOMESERVER, Some(me.clone())).unwrap();
        assert!(matches!(client.reader(None), Ok(Auth::Sign(_))));
        assert!(matches!(
            client.reader(Some(me.public_key())),
            Ok(Auth::Sign(_))
        ));
        assert!(matches!(client.reader(Some(other)), Ok(Auth::Public(k)) if k == other));
        let anonymous = PkClient::new(DEFAULT_HOMESERVER, None).unwrap();
        assert!(matches!(
            anonymous.reader(None),
            Err(ClientError::MissingKey)
        ));
        assert!(matches!(anonymous.reader(Some(other)), Ok(Auth::Public(_))));
    }

    #[tokio::test]
    async fn writes_without_a_key_fail_before_sending() {
        // Port 9 (discard) is never contacted: the key check comes first.
        let client = PkClient::new("http://127.0.0.1:9", None).unwrap();
        assert!(matches!(
            client.put_bytes("/pub/a", "x").await,
            Err(ClientError::MissingKey)
        ));
        assert!(matches!(
            client.delete("/pub/a").await,
            Err(ClientError::MissingKey)
        ));
        assert!(matches!(
            client.signup(None).await,
            Err(ClientError::MissingKey)
        ));
    }

    #[tokio::test]
    async fn invalid_paths_fail_before_sending() {
        let client =
            PkClient::new("http://127.0.0.1:9", Some(Keypair::from_seed(&[1; 32]))).unwrap();
        assert!(matches!(
            client.put_bytes("/pub/../x", "x").await,
            Err(ClientError::InvalidPath { .. })
        ));
        assert!(matches!(
            client.list("/pub/x", ListOptions::default(), None).await,
            Err(ClientError::PathKind { .. })
        ));
    }

    #[test]
    fn file_hash_matches_in_memory_hash() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::io::Write::write_all(&mut f, &data).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        let (_, hash, len) = hash_file(f).unwrap();
        assert_eq!(hash, BodyHash::of(&data));
        assert_eq!(len, data.len() as u64);
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod wire_tests;
