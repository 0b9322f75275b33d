//! Network identity on a local mainline DHT (a `mainline::Testnet` in this process, no
//! network needed): the server publishes its record (its raw-public-key TLS endpoint);
//! users hand it their `_pubky` record, which it publishes and keeps republishing; a
//! client that knows only a key finds the server and talks to it over TLS that accepts
//! only that key; the server starts and serves when the DHT is unreachable.

use std::net::Ipv4Addr;
use std::time::Duration;

use mainline::Testnet;
use pk_client::PkClient;
use pk_client::pkarr::{Resolver, ResolverSettings};
use reqwest::Method;
use serde_json::Value;

use crate::fixture::*;

const WAIT: Duration = Duration::from_secs(60);

fn testnet() -> Testnet {
    Testnet::builder(5)
        .bind_address(Ipv4Addr::LOCALHOST)
        .build()
        .unwrap()
}

fn resolver(testnet: &Testnet) -> Resolver {
    Resolver::new(&ResolverSettings {
        bootstrap: testnet.bootstrap.clone(),
        relays: vec![],
        timeout: Some(Duration::from_millis(500)),
    })
    .unwrap()
}

fn with_dht(bootstrap: &[String]) -> impl FnOnce(&mut homeserver::Config) + '_ {
    move |c| {
        c.tls.listen = Some("127.0.0.1:0".parse().unwrap());
        c.pkarr.enabled = true;
        c.pkarr.bootstrap = bootstrap.to_vec();
        c.pkarr.request_timeout_ms = 500;
    }
}

async fn admin_pkarr(host: &TestHost) -> Value {
    host.admin(Method::GET, "/admin/pkarr")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_find_the_server_and_users_records_outlive_the_dht() {
    let dht = testnet();
    let dir = tempfile::tempdir().unwrap();
    let config = {
        let mut c = test_config(dir.path());
        with_dht(&dht.bootstrap)(&mut c);
        c.pkarr.public_url = "https://hs.example.org:8443".into();
        c
    };
    let host = TestHost::start_single_in(dir, config.clone()).await;
    let server = host.server().context().server_key.public_key();
    let tls = host.server().tls_addr().unwrap();
    eventually("the server's record is published", WAIT, || async {
        admin_pkarr(&host).await["last_success_at"].is_number()
    })
    .await;

    // Given only the server's key: its endpoint, and TLS that accepts only that key.
    let resolver = resolver(&dht);
    let url = resolver.endpoint_of(&server).await.unwrap();
    assert_eq!(url.as_str(), format!("https://{tls}/"));
    // The ordinary URL is in the record too, for clients without raw-key TLS.
    assert_eq!(
        resolver
            .public_url_of(&server)
            .await
            .unwrap()
            .unwrap()
            .as_str(),
        "https://hs.example.org:8443/"
    );
    assert_eq!(
        admin_pkarr(&host).await["public_url"],
        "https://hs.example.org:8443"
    );
    let alice_key = homeserver_protocol::Keypair::random();
    let alice = PkClient::for_server_key(server, Some(alice_key.clone()), &resolver)
        .await
        .unwrap();
    alice.signup(None).await.unwrap();
    alice
        .put_bytes("/pub/hello.txt", &b"over raw-public-key TLS"[..])
        .await
        .unwrap();
    assert_eq!(alice.server_info().await.unwrap().public_key, server);

    // Alice hands the server her record; it goes on the DHT without her publishing.
    let record = Resolver::user_record(&alice_key, &server).unwrap();
    assert!(alice.store_record(&record).await.unwrap());
    assert!(
        !alice.store_record(&record).await.unwrap(),
        "the same record again"
    );
    let alice_pk = alice_key.public_key();
    eventually("alice's record resolves", WAIT, || async {
        resolver.homeserver_of(&alice_pk).await.ok() == Some(server)
    })
    .await;
    // Anyone, from her key alone: her homeserver, then her data.
    let reader = PkClient::for_server_key(
        resolver.homeserver_of(&alice_pk).await.unwrap(),
        None,
        &resolver,
    )
    .await
    .unwrap();
    let value = reader
        .get_bytes("/pub/hello.txt", Some(alice_pk))
        .await
        .unwrap();
    assert_eq!(&value[..], b"over raw-public-key TLS");

    // The DHT loses everything (a new network: the records "expired"). The server,
    // started again on it, republishes Alice's record from its store, without her.
    let dir = host.stop().await;
    drop(dht);
    let fresh = testnet();
    let resolver = self::resolver(&fresh);
    assert!(
        resolver.homeserver_of(&alice_pk).await.is_err(),
        "the new DHT knows nothing"
    );
    let mut config = config;
    config.pkarr.bootstrap = fresh.bootstrap.clone();
    let host = TestHost::start_single_in(dir, config).await;
    eventually("the stored record is republished", WAIT, || async {
        resolver.homeserver_of(&alice_pk).await.ok() == Some(server)
    })
    .await;
    assert_eq!(admin_pkarr(&host).await["users_published"], 1);
    let metrics = host.metric("hs_pkarr_user_records").await;
    assert_eq!(metrics, Some(1.0));
}

#[tokio::test]
async fn records_are_checked() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let client = PkClient::new(&host.url, Some(alice.clone())).unwrap();
    let server = host.server().context().server_key.public_key();
    // Mallory's record, sent by Alice: refused.
    let mallory = homeserver_protocol::Keypair::random();
    let forged = Resolver::user_record(&mallory, &server).unwrap();
    let e = client.store_record(&forged).await.unwrap_err();
    assert_eq!(e.status().map(|s| s.as_u16()), Some(400), "{e}");
    // A key that never signed up: refused.
    let stranger = PkClient::new(&host.url, Some(mallory.clone())).unwrap();
    let e = stranger.store_record(&forged).await.unwrap_err();
    assert_eq!(e.status().map(|s| s.as_u16()), Some(403), "{e}");
    // An older record does not replace a newer one.
    let older = Resolver::user_record(&alice, &server).unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
    let newer = Resolver::user_record(&alice, &server).unwrap();
    assert!(client.store_record(&newer).await.unwrap());
    assert!(!client.store_record(&older).await.unwrap());
    // Deleting the account deletes the record with it (the admin API).
    let admin = host.server().admin_addr().unwrap();
    let r = host
        .http
        .delete(format!(
            "http://{admin}/admin/users/{}",
            alice.public_key().to_z32()
        ))
        .bearer_auth(ADMIN_PASSWORD)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let left = host
        .server()
        .context()
        .stores()
        .metadata
        .pkarr_packets_after("", 10)
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn an_unreachable_dht_does_not_stop_the_server() {
    // Nothing listens on this port: every DHT request goes unanswered.
    let nowhere = vec!["127.0.0.1:9".to_owned()];
    let host = TestHost::start_with(with_dht(&nowhere)).await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/x", b"serving").await.status(), 200);
    eventually("the failure is reported", WAIT, || async {
        admin_pkarr(&host).await["last_error"].is_string()
    })
    .await;
    let status = admin_pkarr(&host).await;
    assert!(status["last_success_at"].is_null(), "{status}");
    assert_eq!(host.metric("hs_pkarr_failing").await, Some(1.0));
}
