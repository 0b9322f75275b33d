//! TLS for the listeners.
//!
//! - `[tls] listen`: TLS 1.3 with a raw public key (RFC 7250): the server's own Ed25519
//!   key is its whole credential, no CA and no DNS. Clients that know the key (from the
//!   user's pkarr record, or `pk --homeserver <z32>`) check it; the config comes from the
//!   `pkarr` crate, which also ships the matching client verifier.
//! - `[http] tls_cert_file` / `tls_key_file`: an ordinary X.509 certificate (PEM) on the
//!   plain listener, for an edge deployment without a reverse proxy. The files are
//!   checked every few seconds and on SIGHUP and re-read when they change (an ACME
//!   renewal): new handshakes use the new certificate, open connections are untouched, and
//!   a file that does not load leaves the previous certificate serving.
//!
//! Both speak HTTP/2 and HTTP/1.1 (ALPN).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use homeserver_protocol::Keypair;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

/// How often the certificate files are checked for a change.
const CERT_CHECK_INTERVAL: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no certificate")]
    NoCertificate { path: String },
    #[error("{path}: the private key is not usable: {source}")]
    Key { path: String, source: rustls::Error },
    #[error("{cert} and {key} do not belong together: {source}")]
    Mismatch {
        cert: String,
        key: String,
        source: rustls::Error,
    },
}

fn alpn(mut config: ServerConfig) -> Arc<ServerConfig> {
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// The raw-public-key server config of the server's key: pkarr's certified key (the
/// key's SubjectPublicKeyInfo), offered only over TLS 1.3. pkarr's own server config
/// also offers TLS 1.2, where rustls cannot serve a raw key: a TLS 1.2 client then got
/// a bare "handshake failure"; now it is told the protocol version is the problem.
pub fn raw_public_key_config(key: &Keypair) -> Arc<ServerConfig> {
    let keypair = pkarr::Keypair::from_secret_key(&key.seed());
    let resolver = rustls::server::AlwaysResolvesServerRawPublicKeys::new(Arc::new(
        keypair.to_rpk_certified_key(),
    ));
    let config =
        ServerConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
    alpn(config)
}

/// An X.509 certificate and key from PEM files, re-read when they change.
pub struct CertificateFiles {
    cert: PathBuf,
    key: PathBuf,
    current: ArcSwap<CertifiedKey>,
    /// (modified, length) of both files when last loaded.
    seen: Mutex<Option<[(SystemTime, u64); 2]>>,
}

impl std::fmt::Debug for CertificateFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let shown = |p: &Path| p.display().to_string();
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Read {
            path: shown(cert),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: shown(cert) });
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Read {
        path: shown(key),
        source,
    })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&private).map_err(|source| {
        TlsError::Key {
            path: shown(key),
            source,
        }
    })?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|source| TlsError::Mismatch {
            cert: shown(cert),
            key: shown(key),
            source,
        })?;
    Ok(certified)
}

impl CertificateFiles {
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        let seen = stamp(cert).zip(stamp(key)).map(|(c, k)| [c, k]);
        let current = load(cert, key)?;
        Ok(Arc::new(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: ArcSwap::from_pointee(current),
            seen: Mutex::new(seen),
        }))
    }

    /// Re-reads the files; on failure the previous certificate keeps serving.
    pub fn reload(&self) -> Result<(), TlsError> {
        let seen = stamp(&self.cert).zip(stamp(&self.key)).map(|(c, k)| [c, k]);
        let loaded = load(&self.cert, &self.key);
        // Remember the attempt either way: a broken file is reported once, not every
        // check, and a fixed one (a new stamp) is tried again.
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = seen;
        self.current.store(Arc::new(loaded?));
        Ok(())
    }

    /// Whether either file changed since it was last read.
    fn changed(&self) -> bool {
        let now = stamp(&self.cert).zip(stamp(&self.key)).map(|(c, k)| [c, k]);
        now.is_some() && now != *self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn server_config(self: &Arc<Self>) -> Arc<ServerConfig> {
        let config =
            ServerConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
                .with_safe_default_protocol_versions()
                .map(|b| b.with_no_client_auth().with_cert_resolver(self.clone()));
        match config {
            Ok(config) => alpn(config),
            // ring supports the default protocol versions; this cannot fail.
            Err(e) => unreachable!("ring lacks the default TLS versions: {e}"),
        }
    }

    /// Reloads on change until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(CERT_CHECK_INTERVAL);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if self.changed() {
                self.reload_and_log("the files changed");
            }
        }
    }

    pub fn reload_and_log(&self, why: &str) {
        match self.reload() {
            Ok(()) => {
                tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded ({why})")
            }
            Err(e) => tracing::error!(
                error = %e,
                "TLS certificate not reloaded ({why}); the previous one keeps serving"
            ),
        }
    }
}

impl ResolvesServerCert for CertificateFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}
