//! Listings: order, pagination with exact has_more, reverse, shallow, limits.

use homeserver_protocol::ErrorCode;
use homeserver_protocol::wire::ListResult;
use reqwest::Method;

use crate::fixture::*;

async fn list(host: &TestHost, key: &homeserver_protocol::Keypair, target: &str) -> ListResult {
    expect_ok_json(
        host.signed(key, Method::GET, target, b"")
            .send()
            .await
            .unwrap(),
    )
    .await
}

fn paths(page: &ListResult) -> Vec<&str> {
    page.entries.iter().map(|e| e.path.as_str()).collect()
}

#[tokio::test]
async fn listing_order_and_pages() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let names = ["b", "a", "a-b", "a/x", "a/y/z", "c.txt", "A"];
    for n in names {
        host.put(&alice, &format!("/pub/d/{n}"), n.as_bytes()).await;
    }
    host.put(&alice, "/pub/other", b"o").await;

    let all = list(&host, &alice, "/pub/d/").await;
    // Bytewise order of full paths: '-' < '/' < letters, upper case before lower.
    assert_eq!(
        paths(&all),
        [
            "/pub/d/A",
            "/pub/d/a",
            "/pub/d/a-b",
            "/pub/d/a/x",
            "/pub/d/a/y/z",
            "/pub/d/b",
            "/pub/d/c.txt"
        ]
    );
    assert!(!all.has_more);
    let first = &all.entries[0];
    assert_eq!(first.size, Some(1));
    assert!(first.created_at.is_some() && first.updated_at.is_some());

    // Pages of 3, following the cursor, give the same sequence with exact has_more.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let target = match &cursor {
            Some(c) => format!("/pub/d/?limit=3&cursor={c}"),
            None => "/pub/d/?limit=3".into(),
        };
        let page = list(&host, &alice, &target).await;
        pages += 1;
        seen.extend(page.entries.iter().map(|e| e.path.clone()));
        if !page.has_more {
            break;
        }
        cursor = page.cursor.clone();
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, paths(&all));

    // Exactly `limit` remaining: has_more is false.
    let page = list(&host, &alice, "/pub/d/?limit=7").await;
    assert!(!page.has_more);
    let page = list(&host, &alice, "/pub/d/?limit=6").await;
    assert!(page.has_more);

    // Whole space.
    let root = list(&host, &alice, "/pub/").await;
    assert_eq!(root.entries.len(), 8);
}

#[tokio::test]
async fn reverse_and_shallow() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    for n in ["a", "b/1", "b/2", "b/c/3", "c", "d/1"] {
        host.put(&alice, &format!("/pub/s/{n}"), b"x").await;
    }
    let rev = list(&host, &alice, "/pub/s/?reverse=true").await;
    assert_eq!(
        paths(&rev),
        [
            "/pub/s/d/1",
            "/pub/s/c",
            "/pub/s/b/c/3",
            "/pub/s/b/2",
            "/pub/s/b/1",
            "/pub/s/a"
        ]
    );

    let shallow = list(&host, &alice, "/pub/s/?shallow=true").await;
    assert_eq!(
        paths(&shallow),
        ["/pub/s/a", "/pub/s/b/", "/pub/s/c", "/pub/s/d/"]
    );
    assert_eq!(shallow.entries[1].size, None, "folders carry no size");

    let shallow_rev = list(&host, &alice, "/pub/s/?shallow=true&reverse=true").await;
    assert_eq!(
        paths(&shallow_rev),
        ["/pub/s/d/", "/pub/s/c", "/pub/s/b/", "/pub/s/a"]
    );

    // Shallow pages of one, across folders, forwards and backwards.
    for (query, expected) in [
        (
            "shallow=true",
            vec!["/pub/s/a", "/pub/s/b/", "/pub/s/c", "/pub/s/d/"],
        ),
        (
            "shallow=true&reverse=true",
            vec!["/pub/s/d/", "/pub/s/c", "/pub/s/b/", "/pub/s/a"],
        ),
        ("reverse=true", paths(&rev)),
    ] {
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let target = match &cursor {
                Some(c) => format!("/pub/s/?{query}&limit=1&cursor={c}"),
                None => format!("/pub/s/?{query}&limit=1"),
            };
            let page = list(&host, &alice, &target).await;
            seen.extend(page.entries.iter().map(|e| e.path.clone()));
            if !page.has_more {
                break;
            }
            cursor = page.cursor;
        }
        assert_eq!(seen, expected, "{query}");
    }

    let sub = list(&host, &alice, "/pub/s/b/?shallow=true").await;
    assert_eq!(paths(&sub), ["/pub/s/b/1", "/pub/s/b/2", "/pub/s/b/c/"]);
}

#[tokio::test]
async fn listing_parameter_errors() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    for target in [
        "/pub/?limit=0",
        "/pub/?limit=1001",
        "/pub/?limit=-1",
        "/pub/?limit=abc",
        "/pub/?reverse=maybe",
        "/pub/?cursor=%%%",
        "/pub/a/?cursor=L3B1Yi9iL3g", // base64url of /pub/b/x: not under /pub/a/
    ] {
        let r = host
            .signed(&alice, Method::GET, target, b"")
            .send()
            .await
            .unwrap();
        expect_error(r, 400, ErrorCode::BadRequest).await;
    }
    let page = list(&host, &alice, "/pub/?limit=1000").await;
    assert!(page.entries.is_empty() && page.cursor.is_none() && !page.has_more);
}

#[tokio::test]
async fn default_page_is_100() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    for i in 0..105 {
        host.put(&alice, &format!("/pub/many/{i:03}"), b"x").await;
    }
    let page = list(&host, &alice, "/pub/many/").await;
    assert_eq!(page.entries.len(), 100);
    assert!(page.has_more);
}
