//! Finding homeservers on the mainline DHT (pkarr), given only keys:
//! - a homeserver publishes a record at its own key: an HTTPS record at its apex with
//!   the port of its raw-public-key TLS listener, and its address (A/AAAA); and, when it
//!   has one, a second HTTPS record naming its ordinary https URL (a domain);
//! - a user publishes a `_pubky` HTTPS record at their key whose target is their
//!   homeserver's key.
//!
//! [`Resolver`] follows both ([`Resolver::homeserver_of`], [`Resolver::endpoint_of`]),
//! and [`PkClient::for_server_key`] connects to the endpoint over TLS that accepts only
//! the server's own key (see [`crate::tls`]): no DNS, no CA.

use std::time::Duration;

use homeserver_protocol::{Keypair, PublicKey};
use pkarr::dns::Name;
use pkarr::dns::rdata::SVCB;
use pkarr::{Client, SignedPacket};
use serde::Deserialize;

use crate::client::PkClient;
use crate::error::ClientError;

/// The name of a user's record naming their homeserver.
pub const PUBKY_RECORD: &str = "_pubky";
/// Lifetime given to a user's record.
const RECORD_TTL: u32 = 3600;

/// Where to look for records.
#[derive(Debug, Clone, Default)]
pub struct ResolverSettings {
    /// DHT bootstrap nodes (`host:port`); empty = mainline's defaults.
    pub bootstrap: Vec<String>,
    /// pkarr relays (https URLs) to ask as well; empty = none.
    pub relays: Vec<String>,
    /// How long one request may take (default 2 s).
    pub timeout: Option<Duration>,
}

/// A pkarr client for finding homeservers.
#[derive(Debug, Clone)]
pub struct Resolver {
    client: Client,
}

fn resolve_error(what: impl std::fmt::Display) -> ClientError {
    ClientError::Resolve(what.to_string())
}

fn from_pkarr(key: &pkarr::PublicKey) -> Result<PublicKey, ClientError> {
    PublicKey::from_bytes(key.as_bytes()).map_err(resolve_error)
}

impl Resolver {
    pub fn new(settings: &ResolverSettings) -> Result<Self, ClientError> {
        let timeout = settings.timeout.unwrap_or(Duration::from_secs(2));
        let mut builder = Client::builder();
        builder.no_default_network();
        builder.dht_request_timeout(timeout);
        builder.relay_request_timeout(timeout);
        builder.dht(|dht| dht);
        if !settings.bootstrap.is_empty() {
            builder.bootstrap(&settings.bootstrap);
            let local = settings.bootstrap.iter().all(|b| {
                b.parse::<std::net::SocketAddr>()
                    .is_ok_and(|a| a.ip().is_loopback())
            });
            if local {
                builder.dht(|dht| {
                    dht.bind_address = Some(std::net::Ipv4Addr::LOCALHOST);
                    dht
                });
            }
        }
        if !settings.relays.is_empty() {
            builder.relays(&settings.relays).map_err(resolve_error)?;
        }
        Ok(Self {
            client: builder.build().map_err(resolve_error)?,
        })
    }

    /// The homeserver `user`'s `_pubky` record names.
    pub async fn homeserver_of(&self, user: &PublicKey) -> Result<PublicKey, ClientError> {
        let qname = format!("{PUBKY_RECORD}.{}", user.to_z32());
        let endpoint = self
            .client
            .resolve_https_endpoint(&qname)
            .await
            .map_err(|_| {
                resolve_error(format!(
                    "no homeserver record for {user} on the DHT (has the user published one? `pk publish`)"
                ))
            })?;
        from_pkarr(endpoint.public_key())
    }

    /// The `https://address:port` where the homeserver `server` serves raw-public-key TLS,
    /// from its own record.
    pub async fn endpoint_of(&self, server: &PublicKey) -> Result<url::Url, ClientError> {
        let endpoints = self.endpoints(server).await?;
        let address = endpoints
            .iter()
            .filter(|e| e.domain().is_none())
            .find_map(|e| e.to_socket_addrs().into_iter().next())
            .ok_or_else(|| {
                let hint = match self.public_url_in(&endpoints) {
                    Some(url) => format!(" (it names an ordinary URL: use --homeserver {url})"),
                    None => String::new(),
                };
                resolve_error(format!(
                    "the record of {server} names no raw-public-key TLS endpoint{hint}"
                ))
            })?;
        url::Url::parse(&format!("https://{address}")).map_err(resolve_error)
    }

    /// The ordinary `https://` URL (a domain, CA-signed TLS) the homeserver `server`
    /// names in its record, if it names one.
    pub async fn public_url_of(&self, server: &PublicKey) -> Result<Option<url::Url>, ClientError> {
        Ok(self.public_url_in(&self.endpoints(server).await?))
    }

    fn public_url_in(&self, endpoints: &[pkarr::extra::endpoints::Endpoint]) -> Option<url::Url> {
        endpoints.iter().find_map(|e| {
            let domain = e.domain()?;
            let url = match e.port() {
                Some(443) | None => format!("https://{domain}"),
                Some(port) => format!("https://{domain}:{port}"),
            };
            url::Url::parse(&url).ok()
        })
    }

    /// The HTTPS endpoints of `server`'s own record, lowest priority first.
    async fn endpoints(
        &self,
        server: &PublicKey,
    ) -> Result<Vec<pkarr::extra::endpoints::Endpoint>, ClientError> {
        use futures_util::StreamExt;
        let z32 = server.to_z32();
        let endpoints: Vec<_> = self
            .client
            .resolve_https_endpoints(&z32)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            // Only the server's own record, not one its targets lead to.
            .filter(|e| e.public_key().to_z32() == z32)
            .collect();
        if endpoints.is_empty() {
            return Err(resolve_error(format!(
                "no record for the homeserver {server} on the DHT"
            )));
        }
        Ok(endpoints)
    }

    /// A record for `user` naming `homeserver`, signed with the user's key.
    pub fn user_record(
        user: &Keypair,
        homeserver: &PublicKey,
    ) -> Result<SignedPacket, ClientError> {
        let target = homeserver.to_z32();
        let svcb = SVCB::new(0, Name::new(&target).map_err(resolve_error)?);
        let key = pkarr::Keypair::from_secret_key(&user.seed());
        SignedPacket::builder()
            .https(
                Name::new(PUBKY_RECORD).map_err(resolve_error)?,
                svcb,
                RECORD_TTL,
            )
            .sign(&key)
            .map_err(resolve_error)
    }

    /// Publishes a record on the DHT (and relays); how many DHT nodes stored it.
    pub async fn publish(&self, packet: &SignedPacket) -> Result<u32, ClientError> {
        self.client.publish(packet).await.map_err(resolve_error)
    }

    /// The pkarr client itself.
    pub fn pkarr(&self) -> &Client {
        &self.client
    }
}

/// What `GET /info` says about a homeserver.
#[derive(Debug, Clone, Deserialize)]
pub struct ServerInfo {
    pub public_key: PublicKey,
    pub version: String,
}

impl PkClient {
    /// A client of the homeserver whose key is `server`: its address comes from its
    /// pkarr record, and the TLS connection accepts only that key.
    pub async fn for_server_key(
        server: PublicKey,
        keypair: Option<Keypair>,
        resolver: &Resolver,
    ) -> Result<Self, ClientError> {
        let url = resolver.endpoint_of(&server).await?;
        Self::over_pinned_tls(url.as_str(), server, keypair)
    }

    /// A client of the raw-public-key TLS listener at `url` that accepts only `server`.
    pub fn over_pinned_tls(
        url: &str,
        server: PublicKey,
        keypair: Option<Keypair>,
    ) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("pk-client/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .use_preconfigured_tls(crate::tls::pinned_key_config(server))
            .build()?;
        Self::with_http_client(http, url, keypair)
    }
}
