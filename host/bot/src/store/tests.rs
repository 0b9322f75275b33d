//! The store's rules, checked on both databases: every test runs on a SQLite file and
//! on a PostgreSQL database of its own (skipped with the reason when there is none).

use std::time::{Duration, Instant};

use super::actions::Finished;
use super::scratch::ScratchPostgres;
use super::*;

/// An open store and what keeps its database alive.
pub(crate) struct Scratch {
    pub store: Store,
    _dir: tempfile::TempDir,
    _postgres: Option<ScratchPostgres>,
}

fn histogram() -> Histogram {
    Histogram::with_opts(prometheus::HistogramOpts::new("t", "t")).unwrap()
}

/// A store on SQLite, and one on PostgreSQL when there is a server.
pub(crate) async fn stores(test: &str) -> Vec<Scratch> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/bot.db", dir.path().display());
    let mut all = vec![Scratch {
        store: Store::open(&url, histogram()).await.unwrap(),
        _dir: dir,
        _postgres: None,
    }];
    if let Some(pg) = ScratchPostgres::create_or_skip(test).await {
        all.push(Scratch {
            store: Store::open(&pg.url, histogram()).await.unwrap(),
            _dir: tempfile::tempdir().unwrap(),
            _postgres: Some(pg),
        });
    }
    all
}

fn mention(id: &str) -> Mention {
    Mention {
        id: id.into(),
        author: "author".into(),
        post_id: "0000000000001".into(),
        post_uri: format!("pubky://author/pub/pubky.app/posts/{id}"),
        content: "tl;dr".into(),
        parent_uri: None,
        posted_at: now_secs(),
        status: MentionStatus::Pending,
    }
}

fn decision(id: &str, root: &str) -> RoutingDecision {
    RoutingDecision {
        mention_id: id.into(),
        method: Method::Heuristic,
        action: ActionType::Summary,
        confidence: Some(0.5),
        reasoning: "keywords".into(),
        notice: None,
        effect: None,
        thread_root: Some(root.into()),
    }
}

fn outcome(reply: &str) -> Outcome {
    Outcome {
        reply: reply.into(),
        tokens_used: 7,
        artifacts: vec![("summary", serde_json::json!({"bullets": [reply]}))],
    }
}

#[tokio::test]
async fn mentions_are_taken_once_and_finished_states_stay() {
    for s in stores("mentions_are_taken_once").await {
        let store = &s.store;
        assert!(store.insert_mention(&mention("a")).await.unwrap());
        assert!(!store.insert_mention(&mention("a")).await.unwrap());
        assert!(store.mark_routed("a").await.unwrap());
        assert!(!store.mark_routed("a").await.unwrap(), "routed once");
        store
            .set_mention_status("a", MentionStatus::Completed, None)
            .await
            .unwrap();
        store
            .set_mention_status("a", MentionStatus::Failed, Some("late"))
            .await
            .unwrap();
        let a = store.mention("a").await.unwrap().unwrap();
        assert_eq!(a.status, MentionStatus::Completed, "{:?}", store.dialect());
        assert_eq!(
            store
                .decide(&decision("a", "root"))
                .await
                .unwrap()
                .reasoning,
            "keywords"
        );
        let mut other = decision("a", "root");
        other.reasoning = "second".into();
        assert_eq!(
            store.decide(&other).await.unwrap().reasoning,
            "keywords",
            "one decision per mention"
        );
        let counts = store.mention_counts().await.unwrap();
        assert_eq!(counts, [("completed".to_owned(), 1)]);
        let later = now_secs() + 10;
        assert!(
            store
                .mentions_in_state(MentionStatus::Completed, later, 10)
                .await
                .unwrap()
                .len()
                == 1
        );
        assert!(
            store
                .mentions_in_state(MentionStatus::Completed, now_secs() - 60, 10)
                .await
                .unwrap()
                .is_empty()
        );
    }
}

/// Decisions with and without a confidence, one after the other on the same
/// connection: a NULL number must not fix the type the next decision's number is sent
/// as (it did on PostgreSQL through sqlx's Any driver, and an AI-routed mention after
/// a keyword-routed one failed to be stored).
#[tokio::test]
async fn decisions_with_and_without_a_confidence_are_stored_alike() {
    for s in stores("decisions_with_and_without_a_confidence").await {
        let store = &s.store;
        for i in 0..6 {
            let id = format!("c{i}");
            store.insert_mention(&mention(&id)).await.unwrap();
            let mut d = decision(&id, "root");
            d.confidence = (i % 2 == 1).then_some(0.25 * i as f32);
            d.method = if d.confidence.is_some() {
                Method::Llm
            } else {
                Method::Heuristic
            };
            let stored = store
                .decide(&d)
                .await
                .unwrap_or_else(|e| panic!("decision {i} on {:?}: {e}", store.dialect()));
            assert_eq!(stored.confidence, d.confidence, "{:?}", store.dialect());
            let read = store.routing_decision(&id).await.unwrap().unwrap();
            assert_eq!(read.confidence, d.confidence);
            assert_eq!(read.method, d.method);
        }
    }
}

#[tokio::test]
async fn an_action_succeeds_once_whoever_finishes_second() {
    for s in stores("an_action_succeeds_once").await {
        let store = &s.store;
        store.insert_mention(&mention("m")).await.unwrap();
        let first = store
            .start_execution("m", ActionType::Summary)
            .await
            .unwrap();
        let second = store
            .start_execution("m", ActionType::Summary)
            .await
            .unwrap();
        let took = Duration::from_millis(5);
        assert_eq!(
            store
                .finish_execution(second, "m", ActionType::Summary, took, &outcome("two"))
                .await
                .unwrap(),
            Finished::Recorded
        );
        match store
            .finish_execution(first, "m", ActionType::Summary, took, &outcome("one"))
            .await
            .unwrap()
        {
            Finished::Superseded(winner) => assert_eq!(winner.reply, "two"),
            other => panic!("{other:?}"),
        }
        let done = store
            .successful_execution("m", ActionType::Summary)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((done.id, done.reply.as_str()), (second, "two"));
        assert_eq!(store.artifacts(second).await.unwrap().len(), 1);
        assert!(store.artifacts(first).await.unwrap().is_empty());
        // A run left pending is failed as interrupted; a success never is.
        let third = store
            .start_execution("m", ActionType::Factcheck)
            .await
            .unwrap();
        assert_eq!(
            store
                .fail_interrupted_executions(Some(("m", ActionType::Factcheck)))
                .await
                .unwrap(),
            1
        );
        assert_ne!(third, 0);
        store
            .fail_execution(second, took, 0, "late failure")
            .await
            .unwrap();
        assert!(
            store
                .successful_execution("m", ActionType::Summary)
                .await
                .unwrap()
                .is_some()
        );
    }
}

#[tokio::test]
async fn a_stale_leader_changes_nothing() {
    for s in stores("a_stale_leader_changes_nothing").await {
        let old = &s.store;
        // A second process on the same database: the next leader.
        let new = Store {
            fence: std::sync::Arc::new(Fence::default()),
            ..old.clone()
        };
        let long = Instant::now() + Duration::from_secs(600);
        assert_eq!(old.raise_fence(1, "old").await.unwrap(), None);
        old.fence().lead(1, long);
        assert!(old.insert_mention(&mention("x")).await.unwrap());
        old.check_fence().await.unwrap();

        assert_eq!(new.raise_fence(2, "new").await.unwrap(), None);
        new.fence().lead(2, long);
        assert_eq!(
            old.raise_fence(1, "old").await.unwrap(),
            Some(2),
            "a lower token never lowers the fence"
        );
        for refused in [
            old.set_mention_status("x", MentionStatus::Failed, Some("stale"))
                .await,
            old.mark_routed("x").await.map(|_| ()),
            old.insert_mention(&mention("y")).await.map(|_| ()),
            old.decide(&decision("x", "root")).await.map(|_| ()),
            old.set_position("poller", "9").await,
            old.index_apply(&[], "feed", "9").await,
            old.check_fence().await,
        ] {
            assert!(
                refused.as_ref().is_err_and(StoreError::is_fenced),
                "{refused:?} on {:?}",
                old.dialect()
            );
        }
        let reply = Reply {
            mention_id: "x".into(),
            post_id: "p".into(),
            content: "c".into(),
            thread_root: "root".into(),
            published_at: None,
        };
        assert!(
            old.reserve_reply(&reply)
                .await
                .is_err_and(|e| e.is_fenced())
        );
        assert_eq!(
            old.mention("x").await.unwrap().unwrap().status,
            MentionStatus::Pending
        );
        // The new leader writes; workers (token 0) write unfenced.
        assert!(new.mark_routed("x").await.unwrap());
        new.reserve_reply(&reply).await.unwrap();
        new.mark_published("x").await.unwrap();
        let worker = Store {
            fence: std::sync::Arc::new(Fence::default()),
            ..old.clone()
        };
        worker
            .set_mention_status("x", MentionStatus::Completed, None)
            .await
            .unwrap();
        // Past its lease by its own clock, a leader refuses without asking.
        new.fence().lose();
        assert!(
            new.set_mention_status("x", MentionStatus::Completed, None)
                .await
                .is_err_and(|e| e.is_fenced())
        );
    }
}

#[tokio::test]
async fn the_thread_cap_counts_replies_posted_or_on_their_way() {
    for s in stores("the_thread_cap_counts").await {
        let store = &s.store;
        for id in ["a", "b", "c", "d"] {
            store.insert_mention(&mention(id)).await.unwrap();
            store.decide(&decision(id, "root")).await.unwrap();
        }
        let mut none = decision("e", "root");
        none.action = ActionType::None;
        store.insert_mention(&mention("e")).await.unwrap();
        store.decide(&none).await.unwrap();
        assert_eq!(store.replies_in_thread("root", 100).await.unwrap(), 4);
        assert_eq!(
            store.replies_in_thread("root", 3).await.unwrap(),
            3,
            "counted up to the cap"
        );
        // a: published; b: blocked (failed); c: failed action; d: on its way.
        let reply = |id: &str| Reply {
            mention_id: id.into(),
            post_id: format!("p{id}"),
            content: "c".into(),
            thread_root: "root".into(),
            published_at: None,
        };
        store.reserve_reply(&reply("a")).await.unwrap();
        store.mark_published("a").await.unwrap();
        store
            .set_mention_status("a", MentionStatus::Completed, None)
            .await
            .unwrap();
        for id in ["b", "c"] {
            store
                .set_mention_status(id, MentionStatus::Failed, Some("blocked"))
                .await
                .unwrap();
        }
        assert_eq!(store.replies_in_thread("root", 100).await.unwrap(), 2);
        assert_eq!(store.replies_in_thread("elsewhere", 100).await.unwrap(), 0);
    }
}

#[tokio::test]
async fn a_thread_is_read_down_every_branch() {
    for s in stores("a_thread_is_read_down_every_branch").await {
        let store = &s.store;
        let post = |uri: &str, parent: Option<&str>, id: &str| IndexedPost {
            seq: 0,
            uri: uri.into(),
            author: "a".into(),
            post_id: id.into(),
            content: format!("text of {uri}"),
            kind: "short".into(),
            parent_uri: parent.map(str::to_owned),
            mentions_bot: false,
        };
        let changes = [
            post("root", None, "01"),
            post("r1", Some("root"), "02"),
            post("r1a", Some("r1"), "04"),
            post("r1a1", Some("r1a"), "05"),
            post("r2", Some("root"), "03"),
            post("other", None, "06"),
        ]
        .map(IndexChange::Put);
        store.index_apply(&changes, "feed", "6").await.unwrap();
        let descendants = |root: &'static str| async move {
            let posts = store.index_descendants(root, 32, 100).await.unwrap();
            posts.into_iter().map(|p| p.uri).collect::<Vec<String>>()
        };
        assert_eq!(descendants("root").await, ["r1", "r2", "r1a", "r1a1"]);
        assert_eq!(
            store.index_descendants("root", 0, 100).await.unwrap().len(),
            2,
            "direct replies only"
        );
        store
            .index_apply(&[IndexChange::Delete("r1a".into())], "feed", "7")
            .await
            .unwrap();
        assert_eq!(
            descendants("root").await.len(),
            3,
            "a deleted post's replies are still read"
        );
        // Posts edited into a cycle (each the other's parent): read once each.
        let cycle = [post("c1", Some("c2"), "08"), post("c2", Some("c1"), "09")];
        store
            .index_apply(&cycle.map(IndexChange::Put), "feed", "9")
            .await
            .unwrap();
        assert_eq!(descendants("c1").await, ["c1", "c2"]);
        assert_eq!(store.position("feed").await.unwrap().as_deref(), Some("9"));
    }
}

#[tokio::test]
async fn dead_letters_are_kept_and_removed_once() {
    for s in stores("dead_letters_are_kept").await {
        let store = &s.store;
        store
            .dead_letter("mention.received.v1", "{}", "why", Some("m"), None)
            .await
            .unwrap();
        store
            .dead_letter(
                "action.summary.requested.v1",
                "{}",
                "why",
                None,
                Some("1-0"),
            )
            .await
            .unwrap();
        let letters = store.dead_letters().await.unwrap();
        assert_eq!(letters.len(), 2);
        assert!(store.remove_bus_dead_letter("1-0").await.unwrap());
        let id: i64 = letters[0].id.parse().unwrap();
        assert!(store.remove_dead_letter(id).await.unwrap());
        assert!(!store.remove_dead_letter(id).await.unwrap());
        assert!(store.dead_letters().await.unwrap().is_empty());
        assert!(store.claim_key("k", Duration::from_secs(60)).await.unwrap());
        assert!(!store.claim_key("k", Duration::from_secs(60)).await.unwrap());
        assert!(store.key_held("k").await.unwrap());
    }
}
