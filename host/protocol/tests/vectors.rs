//! Checks the protocol crate against `testdata/vectors/signed_requests.json`, made by an
//! independent implementation (scripts/gen_signing_vectors.py).

#![allow(clippy::unwrap_used)]

use homeserver_protocol::signed_request::signed_message;
use homeserver_protocol::{AuthHeader, BodyHash, Keypair};
use serde::Deserialize;

#[derive(Deserialize)]
struct Vectors {
    signed_requests: Vec<Vector>,
}

#[derive(Deserialize)]
struct Vector {
    seed_hex: String,
    public_key_z32: String,
    method: String,
    target: String,
    timestamp: u64,
    body_utf8: String,
    body_sha256_hex: String,
    message: String,
    authorization: String,
}

fn vectors() -> Vec<Vector> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/vectors/signed_requests.json"
    );
    let text = std::fs::read_to_string(path).expect("read vectors");
    serde_json::from_str::<Vectors>(&text)
        .expect("parse vectors")
        .signed_requests
}

#[test]
fn signing_matches_vectors() {
    let all = vectors();
    assert!(all.len() >= 5);
    for v in all {
        let kp = Keypair::from_secret_hex(&v.seed_hex).unwrap();
        assert_eq!(kp.public_key().to_z32(), v.public_key_z32);
        let body_hash = BodyHash::of(v.body_utf8.as_bytes());
        assert_eq!(body_hash.to_hex(), v.body_sha256_hex);
        assert_eq!(
            signed_message(&v.method, &v.target, v.timestamp, &body_hash),
            v.message
        );
        let header = AuthHeader::sign(&kp, &v.method, &v.target, v.timestamp, &body_hash);
        assert_eq!(header.to_header_value(), v.authorization, "{}", v.target);
    }
}

#[test]
fn vectors_verify() {
    for v in vectors() {
        let header = AuthHeader::parse(&v.authorization).unwrap();
        let body_hash = BodyHash::of(v.body_utf8.as_bytes());
        header
            .verify(&v.method, &v.target, &body_hash, v.timestamp + 10)
            .unwrap();
        assert!(
            header
                .verify(&v.method, &v.target, &BodyHash::of(b"x"), v.timestamp)
                .is_err()
        );
    }
}
