//! The server's place on the mainline DHT (pkarr): it publishes its own record (an
//! HTTPS record at its apex naming the raw-public-key TLS endpoint, with the address as
//! A/AAAA, and a second HTTPS record naming its ordinary URL when `pkarr.public_url` is
//! set; signed with the server's key), and republishes the records its users gave it
//! (`PUT /pkarr`: their `_pubky` record naming this server, signed with their own keys),
//! so a user's record stays findable while the user's devices are offline.
//!
//! The DHT may be unreachable (no network, a firewall): the server starts and serves
//! all the same. The publisher keeps trying in the background, every
//! `republish_interval_secs`, and sooner (from 5 s, doubling) while a round fails. What
//! happened last is in [`PkarrStatus`] (`GET /admin/pkarr`, the `hs_pkarr_*` metrics).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pkarr::dns::rdata::{A, AAAA, RData, SVCB, SVCParam};
use pkarr::dns::{Name, ResourceRecord};
use pkarr::{Client, Keypair, SignedPacket};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::{PkarrConfig, public_endpoint};
use crate::persistence::MetadataStore;

/// Lifetime given to the records, in seconds (what resolvers may cache).
const RECORD_TTL: u32 = 3600;
/// Users' packets read from the store per page.
const PAGE: u32 = 500;
/// First pause after a failed round; it doubles up to the republish interval.
const FIRST_RETRY: Duration = Duration::from_secs(5);
/// Users' records published at once (each is a DHT query of its own).
const CONCURRENT_PUBLICATIONS: usize = 16;

/// What the publisher did last, for `/admin/pkarr` and the metrics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PkarrStatus {
    pub enabled: bool,
    /// The server's record: what it points at (None: nothing to publish, see `note`).
    pub server_endpoint: Option<String>,
    /// The ordinary URL the record names too (`pkarr.public_url`).
    pub public_url: Option<String>,
    pub note: Option<String>,
    /// Unix seconds of the last round in which every publication worked.
    pub last_success_at: Option<i64>,
    /// Unix seconds of the last round, and its first error.
    pub last_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    /// Of the last round: users' records republished, and those that failed.
    pub users_published: u64,
    pub users_failed: u64,
    /// Rounds so far, and those with an error.
    pub rounds: u64,
    pub failed_rounds: u64,
}

/// The shared status board, and the records users just handed in (published at once,
/// without waiting for the next round).
#[derive(Debug, Default)]
pub struct PkarrBoard {
    status: Mutex<PkarrStatus>,
    handed_in: Mutex<Vec<(String, Vec<u8>)>>,
    bell: tokio::sync::Notify,
}

impl PkarrBoard {
    /// Publishes `user`'s new record soon, without waiting for the interval.
    pub fn handed_in(&self, user: String, payload: Vec<u8>) {
        self.handed_in
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((user, payload));
        self.bell.notify_one();
    }

    fn take_handed_in(&self) -> Vec<(String, Vec<u8>)> {
        std::mem::take(&mut *self.handed_in.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn get(&self) -> PkarrStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn update(&self, f: impl FnOnce(&mut PkarrStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// A pkarr client for `config` (DHT on loopback-or-any, the configured bootstrap nodes
/// and relays).
pub fn client(config: &PkarrConfig) -> Result<Client, String> {
    let mut builder = Client::builder();
    builder.no_default_network();
    // Before the DHT's settings are made: they take this timeout.
    builder.dht_request_timeout(Duration::from_millis(config.request_timeout_ms));
    builder.relay_request_timeout(Duration::from_millis(config.request_timeout_ms));
    builder.dht(|dht| dht);
    if !config.bootstrap.is_empty() {
        builder.bootstrap(&config.bootstrap);
    }
    let loopback_only = !config.bootstrap.is_empty()
        && config
            .bootstrap
            .iter()
            .all(|b| b.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback()));
    if loopback_only {
        // A local testnet: stay on loopback.
        builder.dht(|dht| {
            dht.bind_address = Some(std::net::Ipv4Addr::LOCALHOST);
            dht
        });
    }
    if !config.relays.is_empty() {
        builder
            .relays(&config.relays)
            .map_err(|e| format!("pkarr.relays: {e}"))?;
    }
    builder.build().map_err(|e| e.to_string())
}

/// The address to publish for `tls`, per `config.host`.
pub fn published_address(config: &PkarrConfig, tls: SocketAddr) -> Result<SocketAddr, String> {
    if !config.host.is_empty() {
        let ip: IpAddr = config
            .host
            .parse()
            .map_err(|_| format!("pkarr.host `{}` is not an IP address", config.host))?;
        return Ok(SocketAddr::new(ip, tls.port()));
    }
    if tls.ip().is_unspecified() {
        return Err(format!(
            "the TLS listener is on {tls}: set pkarr.host to the address clients should use"
        ));
    }
    Ok(tls)
}

/// What the server's own record names: the raw-public-key TLS endpoint and the
/// ordinary URL (either may be absent; with neither there is no record to publish).
#[derive(Debug, Clone, Default)]
pub struct ServerRecord {
    pub endpoint: Option<SocketAddr>,
    pub public: Option<(String, u16)>,
}

impl ServerRecord {
    fn is_empty(&self) -> bool {
        self.endpoint.is_none() && self.public.is_none()
    }
}

/// Priority of the raw-public-key endpoint in the server's record (clients that speak
/// it take it first); the ordinary URL comes after.
const TLS_PRIORITY: u16 = 1;
const PUBLIC_URL_PRIORITY: u16 = 2;

/// The server's record: an HTTPS record at its apex pointing at itself (`.`) on the TLS
/// port with the address as A or AAAA, and one naming `public` (domain, port).
pub fn server_packet(
    key: &Keypair,
    endpoint: Option<SocketAddr>,
    public: Option<&(String, u16)>,
) -> Result<SignedPacket, String> {
    let mut builder = SignedPacket::builder();
    if let Some(endpoint) = endpoint {
        let mut svcb = SVCB::new(TLS_PRIORITY, Name::new_unchecked("."));
        svcb.set_param(SVCParam::Port(endpoint.port()));
        builder = builder.https(Name::new_unchecked("."), svcb, RECORD_TTL);
        builder = match endpoint.ip() {
            IpAddr::V4(ip) => builder.record(ResourceRecord::new(
                Name::new_unchecked("."),
                pkarr::dns::CLASS::IN,
                RECORD_TTL,
                RData::A(A::from(ip)),
            )),
            IpAddr::V6(ip) => builder.record(ResourceRecord::new(
                Name::new_unchecked("."),
                pkarr::dns::CLASS::IN,
                RECORD_TTL,
                RData::AAAA(AAAA::from(ip)),
            )),
        };
    }
    if let Some((domain, port)) = public {
        let target = Name::new(domain).map_err(|e| format!("pkarr.public_url: {e}"))?;
        let mut svcb = SVCB::new(PUBLIC_URL_PRIORITY, target);
        svcb.set_param(SVCParam::Port(*port));
        builder = builder.https(Name::new_unchecked("."), svcb, RECORD_TTL);
    }
    builder.sign(key).map_err(|e| e.to_string())
}

/// A user's packet as they handed it to the server (relay payload), checked: a valid
/// signature by `user`, within pkarr's size limit.
pub fn user_packet(user: &pkarr::PublicKey, payload: &[u8]) -> Result<SignedPacket, String> {
    SignedPacket::from_relay_payload(user, &Bytes::copy_from_slice(payload))
        .map_err(|e| format!("not a pkarr packet signed by this key: {e}"))
}

/// Publishes until `stop`: the server's record (when there is an endpoint) and every
/// stored user record, each round; a record a user hands in goes out at once.
pub async fn run(
    client: Client,
    key: Keypair,
    record: ServerRecord,
    metadata: Arc<dyn MetadataStore>,
    board: Arc<PkarrBoard>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut retry = FIRST_RETRY;
    loop {
        // A round can take long (many users, a slow DHT): a stop does not wait for it.
        let ok = tokio::select! {
            _ = stop.cancelled() => return,
            ok = round(&client, &key, &record, metadata.as_ref(), &board) => ok,
        };
        let mut pause = if ok {
            retry = FIRST_RETRY;
            interval
        } else {
            let pause = retry.min(interval);
            retry = (retry * 2).min(interval);
            pause
        };
        let mut next_round = tokio::time::Instant::now() + pause;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next_round) => break,
                _ = board.bell.notified() => {}
            }
            let records = board.take_handed_in();
            let failed = tokio::select! {
                _ = stop.cancelled() => return,
                (_, failed, first_error) = publish_users(&client, &records) => {
                    if let Some(e) = &first_error {
                        tracing::warn!(error = %e, "pkarr: publishing a new record failed; the next round tries again");
                    }
                    failed
                }
            };
            if failed > 0 {
                // Soon, not at the end of the interval.
                pause = FIRST_RETRY;
                next_round = next_round.min(tokio::time::Instant::now() + pause);
            }
        }
    }
}

/// Publishes users' records, [`CONCURRENT_PUBLICATIONS`] at once: (published, failed,
/// the first error).
async fn publish_users(
    client: &Client,
    records: &[(String, Vec<u8>)],
) -> (u64, u64, Option<String>) {
    use futures_util::StreamExt;
    let results: Vec<(String, Result<(), String>)> = futures_util::stream::iter(records.to_vec())
        .map(|(user, payload)| {
            let client = client.clone();
            async move {
                let packet = user
                    .parse::<pkarr::PublicKey>()
                    .map_err(|e| e.to_string())
                    .and_then(|key| user_packet(&key, &payload));
                let result = match packet {
                    Ok(packet) => client
                        .publish(&packet)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                (user, result)
            }
        })
        .buffer_unordered(CONCURRENT_PUBLICATIONS)
        .collect()
        .await;
    let (mut published, mut failed, mut first_error) = (0, 0, None);
    for (user, result) in results {
        match result {
            Ok(()) => published += 1,
            // The DHT holds a newer record of the user's own: nothing to do.
            Err(e) if e.contains("recent") => published += 1,
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(format!("record of {user}: {e}"));
            }
        }
    }
    (published, failed, first_error)
}

/// One round; true when everything was published.
async fn round(
    client: &Client,
    key: &Keypair,
    record: &ServerRecord,
    metadata: &dyn MetadataStore,
    board: &PkarrBoard,
) -> bool {
    let now = crate::service::now_secs();
    let mut first_error: Option<String> = None;
    if !record.is_empty() {
        // Signed anew each round: a newer timestamp than what the DHT holds.
        match server_packet(key, record.endpoint, record.public.as_ref()) {
            Ok(packet) => {
                if let Err(e) = client.publish(&packet).await {
                    first_error.get_or_insert(format!("server record: {e}"));
                }
            }
            Err(e) => {
                first_error.get_or_insert(format!("server record: {e}"));
            }
        }
    }
    let (mut published, mut failed) = (0u64, 0u64);
    let mut after = String::new();
    loop {
        let page = match metadata.pkarr_packets_after(&after, PAGE).await {
            Ok(page) => page,
            Err(e) => {
                first_error.get_or_insert(format!("reading users' records: {e}"));
                break;
            }
        };
        let Some(last) = page.last() else { break };
        after = last.0.clone();
        let (ok, bad, error) = publish_users(client, &page).await;
        published += ok;
        failed += bad;
        if let Some(e) = error {
            first_error.get_or_insert(e);
        }
        if page.len() < PAGE as usize {
            break;
        }
    }
    let ok = first_error.is_none();
    if let Some(e) = &first_error {
        tracing::warn!(error = %e, "pkarr: publishing failed; trying again later");
    } else {
        tracing::debug!(users = published, "pkarr: records published");
    }
    board.update(|s| {
        s.rounds += 1;
        s.last_attempt_at = Some(now);
        s.users_published = published;
        s.users_failed = failed;
        if ok {
            s.last_success_at = Some(now);
            s.last_error = None;
        } else {
            s.failed_rounds += 1;
            s.last_error = first_error;
        }
    });
    ok
}

/// Starts the publisher (when enabled), reporting on `board`. The TLS listener's bound
/// address is what the server's record points at.
pub fn start(
    config: &PkarrConfig,
    server_key: &homeserver_protocol::Keypair,
    tls: Option<SocketAddr>,
    metadata: Arc<dyn MetadataStore>,
    board: &Arc<PkarrBoard>,
    tasks: &mut tokio::task::JoinSet<()>,
    stop: CancellationToken,
) {
    if !config.enabled {
        return;
    }
    // Checked by the config's validation already.
    let public = public_endpoint(&config.public_url).ok().flatten();
    let (endpoint, note) = match tls {
        None if public.is_some() => (
            None,
            Some("no [tls] listen: the server's record names its public_url only".to_owned()),
        ),
        None => (
            None,
            Some("no [tls] listen and no public_url: the server has no record to publish (users' records are republished)".to_owned()),
        ),
        Some(tls) => match published_address(config, tls) {
            Ok(endpoint) => (Some(endpoint), None),
            Err(e) => (None, Some(e)),
        },
    };
    board.update(|s| {
        s.enabled = true;
        s.server_endpoint = endpoint.map(|e| e.to_string());
        s.public_url = public
            .as_ref()
            .map(|(domain, port)| format!("https://{domain}:{port}"));
        s.note = note.clone();
    });
    if let Some(note) = &note {
        tracing::warn!("pkarr: {note}");
    }
    let client = match client(config) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "pkarr: cannot start the DHT client; nothing is published");
            board.update(|s| s.last_error = Some(e));
            return;
        }
    };
    let key = Keypair::from_secret_key(&server_key.seed());
    tracing::info!(
        server = %key.public_key(),
        endpoint = ?endpoint,
        public = ?public,
        "pkarr: publishing on the mainline DHT"
    );
    tasks.spawn(run(
        client,
        key,
        ServerRecord { endpoint, public },
        metadata,
        board.clone(),
        Duration::from_secs(config.republish_interval_secs),
        stop,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_record_names_the_tls_port_and_address() {
        let key = Keypair::random();
        let public = ("hs.example.org".to_owned(), 8443);
        let packet =
            server_packet(&key, Some("127.0.0.1:6287".parse().unwrap()), Some(&public)).unwrap();
        let https: Vec<_> = packet
            .resource_records(".")
            .filter(|r| matches!(r.rdata, RData::HTTPS(_)))
            .collect();
        assert_eq!(https.len(), 2, "the TLS endpoint and the public URL");
        assert!(https.iter().any(|r| matches!(&r.rdata, RData::HTTPS(h)
            if h.0.priority == TLS_PRIORITY && matches!(h.0.target.to_string().as_str(), "" | "."))));
        assert!(https.iter().any(|r| matches!(&r.rdata, RData::HTTPS(h)
            if h.0.priority == PUBLIC_URL_PRIORITY && h.0.target.to_string() == "hs.example.org")));
        assert!(
            packet
                .resource_records(".")
                .any(|r| matches!(&r.rdata, RData::A(a) if IpAddr::V4(a.address.into()) == "127.0.0.1".parse::<IpAddr>().unwrap()))
        );
        assert_eq!(packet.public_key(), key.public_key());
    }

    #[test]
    fn published_addresses() {
        let config = |host: &str| PkarrConfig {
            enabled: true,
            bootstrap: vec![],
            relays: vec![],
            republish_interval_secs: 3600,
            host: host.into(),
            request_timeout_ms: 1000,
            public_url: String::new(),
        };
        let tls: SocketAddr = "0.0.0.0:6287".parse().unwrap();
        assert!(published_address(&config(""), tls).is_err());
        assert_eq!(
            published_address(&config("203.0.113.7"), tls).unwrap(),
            "203.0.113.7:6287".parse().unwrap()
        );
        let local: SocketAddr = "127.0.0.1:6287".parse().unwrap();
        assert_eq!(published_address(&config(""), local).unwrap(), local);
    }

    #[test]
    fn a_user_packet_must_be_signed_by_that_user() {
        let (alice, mallory) = (Keypair::random(), Keypair::random());
        let packet = server_packet(&alice, Some("127.0.0.1:1".parse().unwrap()), None).unwrap();
        let payload = packet.to_relay_payload();
        assert!(user_packet(&alice.public_key(), &payload).is_ok());
        assert!(user_packet(&mallory.public_key(), &payload).is_err());
        assert!(user_packet(&alice.public_key(), b"junk").is_err());
    }
}
