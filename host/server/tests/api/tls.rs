//! TLS listeners: the raw-public-key listener (RFC 7250) serving the same API, checked
//! with the client library's pinned-key verifier and with an independent client
//! (`gnutls-cli`); and an ordinary X.509 certificate on the plain listener, checked with
//! curl and rotated on disk without dropping open connections.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use homeserver_protocol::Keypair;
use pk_client::tls::pinned_key_config;
use reqwest::StatusCode;
use tokio::io::AsyncWriteExt;

use crate::fixture::*;

fn rpk_client(expected: &homeserver_protocol::PublicKey) -> reqwest::Client {
    reqwest::Client::builder()
        .use_preconfigured_tls(pinned_key_config(*expected))
        .build()
        .unwrap()
}

async fn rpk_host() -> (TestHost, String) {
    let host = TestHost::start_with(|c| c.tls.listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let url = format!("https://{}", host.server().tls_addr().unwrap());
    (host, url)
}

#[tokio::test]
async fn the_raw_public_key_listener_serves_the_api() {
    let (host, tls_url) = rpk_host().await;
    let alice = host.user().await;
    host.put(&alice, "/pub/tls.txt", b"over tls").await;
    let server_key = host.server().server_key();
    let client = rpk_client(&server_key);
    let r = client
        .get(format!("{tls_url}/pub/tls.txt"))
        .header("Pubky-Host", alice.public_key().to_z32())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.version(), reqwest::Version::HTTP_2, "ALPN offers h2");
    assert_eq!(r.bytes().await.unwrap(), "over tls");
}

#[tokio::test]
async fn a_server_with_another_key_is_refused_with_a_clear_error() {
    let (_host, tls_url) = rpk_host().await;
    let someone_else = Keypair::random().public_key();
    let error = rpk_client(&someone_else)
        .get(format!("{tls_url}/events/"))
        .send()
        .await
        .unwrap_err();
    let chain = std::iter::successors(Some(&error as &dyn std::error::Error), |e| e.source())
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(": ");
    assert!(
        chain.contains(&format!("but {someone_else} was expected")),
        "{chain}"
    );
    assert!(chain.contains("it is not that homeserver"), "{chain}");
}

/// The raw-public-key listener speaks TLS 1.3 only (RFC 7250 keys are served over TLS
/// 1.3): a client limited to TLS 1.2 is refused for its protocol version, not with a
/// bare handshake failure halfway through.
#[tokio::test]
async fn the_raw_public_key_listener_refuses_tls_1_2() {
    let (host, _) = rpk_host().await;
    let config = accept_any_config(&[&rustls::version::TLS12]);
    let tcp = tokio::net::TcpStream::connect(host.server().tls_addr().unwrap())
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("homeserver").unwrap();
    let handshake = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await;
    let error = handshake.expect_err("a TLS 1.2 handshake must fail");
    assert!(
        error.to_string().to_lowercase().contains("protocol"),
        "refused for its version: {error}"
    );
}

/// Whether an independent tool is here; in CI it must be.
fn have_tool(name: &str) -> bool {
    let found = std::process::Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{name} is missing in CI (.ci/run installs it)"
        );
        eprintln!("SKIPPED: {name} is not installed (Debian package: see .ci/run)");
    }
    found
}

#[tokio::test]
async fn gnutls_cli_completes_a_raw_public_key_handshake() {
    if !have_tool("gnutls-cli") {
        return;
    }
    let (host, _) = rpk_host().await;
    let alice = host.user().await;
    host.put(&alice, "/pub/hello", b"hello from rpk").await;
    let port = host.server().tls_addr().unwrap().port();
    let mut child = tokio::process::Command::new("gnutls-cli")
        .args([
            "-p",
            &port.to_string(),
            "127.0.0.1",
            "--no-ca-verification",
            "--priority",
            "NORMAL:-VERS-ALL:+VERS-TLS1.3:+CTYPE-SRV-RAWPK",
            "--alpn",
            "http/1.1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let request = format!(
        "GET /pub/hello HTTP/1.1\r\nHost: 127.0.0.1\r\nPubky-Host: {}\r\nConnection: close\r\n\r\n",
        alice.public_key().to_z32()
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(request.as_bytes()).await.unwrap();
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("gnutls-cli finished")
        .unwrap();
    drop(stdin);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let all = format!("{stdout}{stderr}");
    assert!(all.contains("Raw Public Key"), "{all}");
    assert!(stdout.contains("HTTP/1.1 200 OK"), "{all}");
    assert!(stdout.contains("hello from rpk"), "{all}");
}

/// A self-signed certificate for `localhost`, written as PEM files under `dir`.
fn write_certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, Vec<u8>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    // Written to a temporary name and renamed, as ACME clients do.
    std::fs::write(dir.join("cert.pem.new"), certified.cert.pem()).unwrap();
    std::fs::write(
        dir.join("key.pem.new"),
        certified.signing_key.serialize_pem(),
    )
    .unwrap();
    std::fs::rename(dir.join("key.pem.new"), &key).unwrap();
    std::fs::rename(dir.join("cert.pem.new"), &cert).unwrap();
    (cert, key, certified.cert.der().to_vec())
}

/// The certificate a fresh TLS connection to `port` is shown.
async fn presented_certificate(port: u16, trust: &[u8]) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(trust.to_vec()))
        .unwrap();
    let config = accept_any_config(rustls::DEFAULT_VERSIONS);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// A client of `versions` that accepts any certificate (and checks the handshake's
/// signatures): for tests that look at which certificate or version a server offers.
fn accept_any_config(
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> rustls::ClientConfig {
    let provider = rustls::crypto::ring::default_provider();
    let verifier = AcceptAny(provider.signature_verification_algorithms);
    rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth()
}

/// Accepts any certificate: the tests only look at which one is presented.
#[derive(Debug)]
struct AcceptAny(rustls::crypto::WebPkiSupportedAlgorithms);

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[tokio::test]
async fn an_x509_certificate_serves_https_and_is_rotated_without_dropping_connections() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, first_der) = write_certificate(certs.path());
    let host = TestHost::start_with(|c| {
        c.http.tls_cert_file = Some(cert.clone());
        c.http.tls_key_file = Some(key.clone());
    })
    .await;
    let port = host.server().http_addr().port();
    let base = format!("https://localhost:{port}");

    // curl, an independent client, trusts the certificate and gets the API.
    if have_tool("curl") {
        // tokio's process: the server runs on this test's runtime and must keep serving.
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "--fail", "--cacert"])
            .arg(&cert)
            .arg(format!("{base}/events/?limit=1"))
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"events\""));
    }

    // A connection opened before the rotation keeps working after it.
    let trusted = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_der(&first_der).unwrap())
        .resolve("localhost", ([127, 0, 0, 1], port).into())
        .pool_idle_timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let r = trusted.get(format!("{base}/events/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    let (_, _, second_der) = write_certificate(certs.path());
    assert_ne!(first_der, second_der);
    eventually(
        "the new certificate to be served",
        Duration::from_secs(30),
        || {
            let second = second_der.clone();
            let first = first_der.clone();
            async move { presented_certificate(port, &first).await == second }
        },
    )
    .await;
    let r = trusted.get(format!("{base}/events/")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "the open connection still serves"
    );

    // A broken file leaves the current certificate serving.
    std::fs::write(&cert, "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(presented_certificate(port, &second_der).await, second_der);
}

#[tokio::test]
async fn half_an_x509_configuration_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.http.tls_cert_file = Some(dir.path().join("cert.pem"));
    assert!(config.validate().is_err());
}
