//! The OpenAPI documents (`host/server/openapi/*.json`) against the routes that exist:
//! every path a router declares is documented, every documented path answers (not the
//! router's "no such endpoint"), and on each documented path exactly the documented
//! methods are allowed (the others answer 405). Schemathesis (`scripts/fuzz-api`) then
//! checks the answers against the documents.

use std::collections::{BTreeMap, BTreeSet};

use homeserver_protocol::Keypair;
use reqwest::Method;
use serde_json::Value;

use crate::fixture::*;

/// The paths a router source declares with `.route("...")`: axum and OpenAPI spell
/// path parameters alike (`{name}`), so they compare as they are written.
fn declared_routes(source: &str) -> BTreeSet<String> {
    source
        .split(".route(")
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.trim_start().strip_prefix('"')?;
            Some(rest[..rest.find('"')?].to_owned())
        })
        .collect()
}

/// Each documented path with its methods (upper case).
fn documented(document: &Value) -> BTreeMap<String, BTreeSet<String>> {
    assert_eq!(document["openapi"].as_str().map(|v| &v[..4]), Some("3.1."));
    document["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| ["get", "head", "post", "put", "delete", "patch"].contains(&k.as_str()))
                .map(|k| k.to_uppercase())
                .collect();
            (path.clone(), methods)
        })
        .collect()
}

/// A concrete request target for a documented path.
fn sample(path: &str, key: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').unwrap() + start;
        out.push_str(match &rest[start + 1..end] {
            "public_key" => key,
            "token" => "AAAA-BBBB-CCCC",
            _ => "sample",
        });
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Probes every documented path with every method; `not_a_route` is the message of the
/// router's fallback 404.
async fn check_methods(
    host: &TestHost,
    base: &str,
    document: &Value,
    bearer: Option<&str>,
    not_a_route: &str,
) {
    let key = Keypair::random().public_key().to_z32();
    for (path, methods) in documented(document) {
        let target = format!("{base}{}", sample(&path, &key));
        for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            let mut request = host
                .http
                .request(Method::from_bytes(method.as_bytes()).unwrap(), &target);
            if let Some(password) = bearer {
                request = request.bearer_auth(password);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            if methods.contains(method) {
                assert_ne!(status, 405, "{method} {path} is documented but not allowed");
                assert!(
                    !(status == 404 && body.contains(not_a_route)),
                    "{method} {path} is documented but no route answers it: {body}"
                );
            } else {
                assert_eq!(
                    status, 405,
                    "{method} {path} answers {status} but is not documented: {body}"
                );
            }
        }
    }
}

#[tokio::test]
async fn the_client_document_describes_every_route() {
    let host = TestHost::start().await;
    let served: Value = host
        .request(Method::GET, "/openapi.json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let file: Value = serde_json::from_str(homeserver::client_server::OPENAPI).unwrap();
    assert_eq!(served, file);

    let paths = documented(&served);
    for route in declared_routes(include_str!("../../src/client_server/mod.rs")) {
        assert!(
            paths.contains_key(&route),
            "route {route} is not documented"
        );
    }
    // Storage paths are served by the router's fallback: /pub and /private ones.
    for path in paths.keys() {
        assert!(
            path.starts_with("/pub/")
                || path.starts_with("/private/")
                || declared_routes(include_str!("../../src/client_server/mod.rs")).contains(path),
            "{path} is documented but no route declares it"
        );
    }
    check_methods(&host, &host.url, &served, None, "no such endpoint").await;
}

#[tokio::test]
async fn the_admin_document_describes_every_route() {
    let host = TestHost::start().await;
    let admin = format!("http://{}", host.server().admin_addr().unwrap());
    let served: Value = host
        .http
        .get(format!("{admin}/admin/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let file: Value = serde_json::from_str(homeserver::admin_server::OPENAPI).unwrap();
    assert_eq!(served, file);

    let routes = declared_routes(include_str!("../../src/admin_server/mod.rs"));
    let paths = documented(&served);
    assert_eq!(
        paths.keys().cloned().collect::<BTreeSet<_>>(),
        routes,
        "documented paths (left) and declared routes (right) differ"
    );
    check_methods(
        &host,
        &admin,
        &served,
        Some(ADMIN_PASSWORD),
        "no such admin endpoint",
    )
    .await;
}

/// Both documents describe `X-Request-Id` once (a header parameter and a response
/// header in `components`) and use it everywhere: every operation takes the parameter,
/// and every answer but the HTTP parser's own (414, 431: refused before a request
/// exists) carries the header.
#[test]
fn every_operation_documents_the_request_id() {
    for source in [
        homeserver::client_server::OPENAPI,
        homeserver::admin_server::OPENAPI,
    ] {
        let document: Value = serde_json::from_str(source).unwrap();
        let components = &document["components"];
        assert_eq!(
            components["parameters"]["RequestId"]["name"],
            "X-Request-Id"
        );
        assert_eq!(components["parameters"]["RequestId"]["in"], "header");
        assert!(components["headers"]["RequestId"]["schema"].is_object());
        let parameter = serde_json::json!({ "$ref": "#/components/parameters/RequestId" });
        let header = serde_json::json!({ "$ref": "#/components/headers/RequestId" });
        let parser_answers = [
            "#/components/responses/UriTooLong",
            "#/components/responses/HeadersTooLarge",
        ];
        for (path, item) in document["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                if !["get", "head", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                    continue;
                }
                let parameters = operation["parameters"].as_array();
                assert!(
                    parameters.is_some_and(|p| p.contains(&parameter)),
                    "{method} {path} does not take X-Request-Id"
                );
                for (status, response) in operation["responses"].as_object().unwrap() {
                    let response = match response["$ref"].as_str() {
                        Some(r) if parser_answers.contains(&r) => continue,
                        Some(r) => {
                            let name = r.rsplit('/').next().unwrap();
                            &components["responses"][name]
                        }
                        None => response,
                    };
                    assert_eq!(
                        response["headers"]["X-Request-Id"], header,
                        "{method} {path} {status} does not name X-Request-Id"
                    );
                }
            }
        }
    }
}
