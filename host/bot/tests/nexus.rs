//! The Nexus client against a local server speaking Nexus's v0 wire format:
//! notifications newest first with `limit`/`start`/`end`, the empty answers (200 `[]`,
//! 204, 404), 429 with `Retry-After`, post views with their parent, reply streams.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use homeserver_protocol::Keypair;
use pkbot::index::nexus::NexusIndex;
use pkbot::index::{Index, IndexError, Post, thread};
use pkbot::post::PostUri;
use serde_json::{Value, json};

#[derive(Default)]
struct Nexus {
    /// Notification requests seen (their query strings).
    asked: Vec<HashMap<String, String>>,
    notifications: Vec<Value>,
    posts: HashMap<String, Value>,
    replies: HashMap<String, Vec<Value>>,
}

type Shared = Arc<Mutex<Nexus>>;

async fn notifications(
    State(nexus): State<Shared>,
    Path(_user): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let mut nexus = nexus.lock().unwrap();
    nexus.asked.push(query.clone());
    if nexus.asked.len() == 1 {
        // The first request is rate limited.
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "7")],
            "slow down",
        )
            .into_response();
    }
    let end: i64 = query.get("end").and_then(|v| v.parse().ok()).unwrap_or(0);
    let start: i64 = query
        .get("start")
        .and_then(|v| v.parse().ok())
        .unwrap_or(i64::MAX);
    let limit: usize = query
        .get("limit")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut page: Vec<Value> = nexus
        .notifications
        .iter()
        .filter(|n| {
            let t = n["timestamp"].as_i64().unwrap();
            t >= end && t <= start
        })
        .cloned()
        .collect();
    page.sort_by_key(|n| std::cmp::Reverse(n["timestamp"].as_i64().unwrap()));
    page.truncate(limit);
    if page.is_empty() {
        // Nexus has answered "nothing" in more than one way.
        return StatusCode::NO_CONTENT.into_response();
    }
    axum::Json(page).into_response()
}

async fn post(State(nexus): State<Shared>, Path((author, id)): Path<(String, String)>) -> Response {
    match nexus.lock().unwrap().posts.get(&format!("{author}:{id}")) {
        Some(view) => axum::Json(view.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, "no such post").into_response(),
    }
}

async fn stream(
    State(nexus): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    assert_eq!(
        query.get("source").map(String::as_str),
        Some("post_replies")
    );
    let key = format!("{}:{}", query["author_id"], query["post_id"]);
    match nexus.lock().unwrap().replies.get(&key) {
        Some(list) => axum::Json(list.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, "[]").into_response(),
    }
}

fn view(uri: &PostUri, content: &str, parent: Option<&PostUri>) -> Value {
    json!({
        "details": {
            "content": content,
            "id": uri.id,
            "indexed_at": 1,
            "author": uri.author.to_z32(),
            "kind": "short",
            "uri": uri.to_string(),
            "attachments": null
        },
        "counts": {"tags": 0, "replies": 0, "reposts": 0},
        "tags": [],
        "relationships": {"replied": parent.map(ToString::to_string), "reposted": null, "mentioned": []},
        "bookmark": null
    })
}

#[tokio::test]
async fn nexus_wire_format() {
    let bot = Keypair::random().public_key();
    let (alice, bob) = (
        Keypair::random().public_key(),
        Keypair::random().public_key(),
    );
    let root = PostUri::new(alice, "0034A0RRKZ7N0");
    let mention = PostUri::new(bob, "0034A0RRKZ7N8");
    let other = PostUri::new(bob, "0034A0RRKZ7NA");
    let shared: Shared = Arc::default();
    {
        let mut n = shared.lock().unwrap();
        n.notifications = vec![
            json!({"timestamp": 1_000, "body": {"type": "follow", "followed_by": bob.to_z32()}}),
            json!({"timestamp": 2_000, "body": {"type": "mention", "mentioned_by": bob.to_z32(), "post_uri": mention.to_string(), "post_kind": "short"}}),
        ];
        n.posts
            .insert(root.key(), view(&root, "The bridge opened in 2020.", None));
        n.posts.insert(
            mention.key(),
            view(&mention, &format!("tl;dr pk:{bot}"), Some(&root)),
        );
        n.posts
            .insert(other.key(), view(&other, "It cost a lot.", Some(&root)));
        n.replies.insert(
            root.key(),
            vec![
                view(&other, "It cost a lot.", Some(&root)),
                view(&mention, &format!("tl;dr pk:{bot}"), Some(&root)),
            ],
        );
    }
    let app = axum::Router::new()
        .route("/v0/user/{user}/notifications", get(notifications))
        .route("/v0/post/{author}/{id}", get(post))
        .route("/v0/stream/posts", get(stream))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let index = NexusIndex::new(
        &base,
        &bot,
        Duration::from_secs(5),
        Duration::from_secs(86_400),
    );
    // 429 is honoured: the poller hears how long to wait.
    match index.mentions_after(None).await {
        Err(IndexError::RateLimited(wait)) => assert_eq!(wait, Duration::from_secs(7)),
        other => panic!("expected rate limited, got {other:?}"),
    }
    // Mentions only (the follow is skipped), with their posts; the position is the
    // newest notification time.
    let page = index.mentions_after(None).await.unwrap();
    assert_eq!(page.mentions.len(), 1);
    assert_eq!(page.mentions[0].uri, mention);
    assert_eq!(page.mentions[0].parent.as_ref(), Some(&root));
    assert_eq!(page.position.as_deref(), Some("2000"));
    // From there on: nothing new (a 204), the position stays.
    let next = index
        .mentions_after(page.position.as_deref())
        .await
        .unwrap();
    assert!(next.mentions.is_empty() && next.position.is_none());
    let asked = shared.lock().unwrap().asked.clone();
    let last = asked.last().unwrap();
    assert_eq!(
        last["end"], "2001",
        "only notifications newer than the position"
    );
    assert_eq!(last["limit"], "100");

    // Posts, missing posts (404) and thread replies, oldest first.
    assert!(
        index
            .post(&PostUri::new(alice, "0034A0RRKZ7NZ"))
            .await
            .unwrap()
            .is_none()
    );
    let replies = index.replies(&root).await.unwrap();
    let ids: Vec<&str> = replies.iter().map(|p| p.uri.id.as_str()).collect();
    assert_eq!(ids, ["0034A0RRKZ7N8", "0034A0RRKZ7NA"]);
    assert!(
        index.replies(&other).await.unwrap().is_empty(),
        "404 is an empty list"
    );
    let thread = thread(&index, &mention).await.unwrap();
    assert_eq!(thread.root(), Some(&root));
    assert_eq!(thread.ancestors.len(), 2);
    assert_eq!(
        thread.replies.len(),
        1,
        "the other reply (the mention is an ancestor)"
    );
}

/// A backlog longer than many pages is walked to its end (the position moves past all
/// of it, so nothing in between may be left out), but not further back than the bot
/// would answer (`poller.max_age_secs`).
#[tokio::test]
async fn a_long_backlog_is_read_whole_but_not_past_max_age() {
    let bot = Keypair::random().public_key();
    let bob = Keypair::random().public_key();
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let shared: Shared = Arc::default();
    let mention = |i: i64| PostUri::new(bob, format!("0034A0RR{i:05}"));
    {
        let mut n = shared.lock().unwrap();
        // 1 150 recent mentions (a second apart), then 300 from two days ago.
        for i in 0..1450 {
            let uri = mention(i);
            let at = if i < 1150 {
                now_ms - i * 1000
            } else {
                now_ms - 2 * 86_400_000 - i * 1000
            };
            n.notifications.push(json!({"timestamp": at, "body": {"type": "mention", "mentioned_by": bob.to_z32(), "post_uri": uri.to_string()}}));
            n.posts
                .insert(uri.key(), view(&uri, &format!("tl;dr pk:{bot}"), None));
        }
    }
    let app = axum::Router::new()
        .route("/v0/user/{user}/notifications", get(notifications))
        .route("/v0/post/{author}/{id}", get(post))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let index = NexusIndex::new(
        &base,
        &bot,
        Duration::from_secs(5),
        Duration::from_secs(86_400),
    );
    assert!(matches!(
        index.mentions_after(None).await,
        Err(IndexError::RateLimited(_))
    ));
    let page = index.mentions_after(None).await.unwrap();
    let recent: Vec<&Post> = page
        .mentions
        .iter()
        .filter(|p| p.uri.id.as_str() < "0034A0RR01150")
        .collect();
    assert_eq!(recent.len(), 1150, "every recent mention, across 12 pages");
    // Oldest first; the last page's old ones come too (the poller records them as
    // skipped_old), nothing older.
    assert_eq!(page.mentions.len(), 1200);
    assert_eq!(page.mentions[0].uri.id, "0034A0RR01199");
    assert_eq!(page.position.as_deref(), Some(now_ms.to_string().as_str()));
    // The walk stopped at the first page reaching past a day: 12 pages, not 15.
    let asked = shared.lock().unwrap().asked.len() - 1;
    assert_eq!(asked, 12, "pages asked for");
}
