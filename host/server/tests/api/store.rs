//! The store conformance suite: every contract of the metadata boundary
//! (`persistence::metadata`), checked through the trait alone, so each backend must pass
//! it unchanged. The backend is the suite's (`HS_TEST_BACKEND`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use homeserver::persistence::metadata::{
    BlobState, CreateSessionOutcome, DeleteOutcome, EntryRange, EventQuery, NewEntry, PutOutcome,
    QuotaExceeded, ReplayMark, ReverseEventQuery, SessionRecord, SignupOutcome, Stored, UserCursor,
};
use homeserver::persistence::{MetadataStore, MetadataWrites, StoreError};
use homeserver_protocol::event::EventKind;

use crate::backend::TestDatabase;

struct Fixture {
    store: Arc<dyn MetadataStore>,
    db: TestDatabase,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDatabase::create(dir.path()).await;
    Fixture {
        store: db.open().await,
        db,
        _dir: dir,
    }
}

/// A fresh, distinct replay mark.
fn mark() -> ReplayMark {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut id = [0u8; 32];
    id[..8].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    id[8..16].copy_from_slice(&std::process::id().to_be_bytes().repeat(2));
    ReplayMark {
        signature_id: id,
        expires_at: i64::MAX,
    }
}

fn key(n: u32) -> String {
    format!("{n:0>52}")
}

fn new_entry<'a>(user: &'a str, path: &'a str, blob: &'a str, size: u64) -> NewEntry<'a> {
    NewEntry {
        user,
        path,
        stored: Stored::Blob(blob.to_owned()),
        size,
        content_hash: [size as u8; 32],
        now: 1000,
        default_quota: 0,
    }
}

async fn sign_up(store: &dyn MetadataStore, user: &str) {
    let outcome = store.sign_up(user, None, 100, mark()).await.unwrap();
    assert_eq!(outcome, SignupOutcome::Created { created_at: 100 });
}

async fn put(store: &dyn MetadataStore, user: &str, path: &str, size: u64) -> PutOutcome {
    let blob = format!("{user}/{path}/{size}");
    store
        .commit_put(new_entry(user, path, &blob, size), Some(mark()))
        .await
        .unwrap()
}

async fn used(store: &dyn MetadataStore, user: &str) -> u64 {
    store.user(user).await.unwrap().unwrap().used_bytes
}

async fn all_events(store: &dyn MetadataStore) -> Vec<(u64, String, String, EventKind)> {
    store
        .events(EventQuery {
            users: &[],
            after: 0,
            up_to: i64::MAX as u64,
            path_prefix: None,
            limit: 100_000,
        })
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.cursor, e.user, e.path, e.kind))
        .collect()
}

#[tokio::test]
async fn signup_outcomes_and_replays() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let alice = key(1);
    let m = mark();
    assert_eq!(
        s.sign_up(&alice, None, 100, m).await.unwrap(),
        SignupOutcome::Created { created_at: 100 }
    );
    assert_eq!(
        s.sign_up(&alice, None, 100, m).await.unwrap(),
        SignupOutcome::Replayed
    );
    assert_eq!(
        s.sign_up(&alice, None, 200, mark()).await.unwrap(),
        SignupOutcome::AlreadyExists { created_at: 100 }
    );
    let user = s.user(&alice).await.unwrap().unwrap();
    assert_eq!(
        (user.created_at, user.used_bytes, user.disabled),
        (100, 0, false)
    );
    assert!(s.user(&key(2)).await.unwrap().is_none());
}

#[tokio::test]
async fn signup_tokens_are_redeemed_once() {
    let f = fixture().await;
    let s = f.store.as_ref();
    assert!(s.create_signup_token("AAAA-BBBB-CCCC", 5).await.unwrap());
    assert!(!s.create_signup_token("AAAA-BBBB-CCCC", 6).await.unwrap());
    let token = s.signup_token("AAAA-BBBB-CCCC").await.unwrap().unwrap();
    assert_eq!((token.created_at, token.used), (5, false));

    // Unknown token: refused, the user is not created, the mark is spent.
    let m = mark();
    assert_eq!(
        s.sign_up(&key(1), Some("ZZZZ-ZZZZ-ZZZZ"), 10, m)
            .await
            .unwrap(),
        SignupOutcome::TokenUnknown
    );
    assert!(s.user(&key(1)).await.unwrap().is_none());
    assert_eq!(
        s.sign_up(&key(1), Some("AAAA-BBBB-CCCC"), 10, m)
            .await
            .unwrap(),
        SignupOutcome::Replayed
    );

    // Racing signups of different keys with one token: exactly one wins.
    let store = f.store.clone();
    let racers = (10..18).map(|n| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .sign_up(&key(n), Some("AAAA-BBBB-CCCC"), 10, mark())
                .await
                .unwrap()
        })
    });
    let outcomes: Vec<SignupOutcome> = futures_util::future::join_all(racers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let created = outcomes
        .iter()
        .filter(|o| matches!(o, SignupOutcome::Created { .. }))
        .count();
    assert_eq!(created, 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, SignupOutcome::Created { .. } | SignupOutcome::TokenUsed)),
        "{outcomes:?}"
    );
    assert!(
        s.signup_token("AAAA-BBBB-CCCC")
            .await
            .unwrap()
            .unwrap()
            .used
    );
    assert_eq!(s.stats().await.unwrap().users, 1);
}

#[tokio::test]
async fn concurrent_signups_of_one_key() {
    let f = fixture().await;
    let racers = (0..8).map(|_| {
        let store = f.store.clone();
        tokio::spawn(async move { store.sign_up(&key(7), None, 10, mark()).await.unwrap() })
    });
    let outcomes: Vec<SignupOutcome> = futures_util::future::join_all(racers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let created = outcomes
        .iter()
        .filter(|o| matches!(o, SignupOutcome::Created { .. }))
        .count();
    assert_eq!(created, 1, "{outcomes:?}");
    assert!(
        outcomes.iter().all(|o| matches!(
            o,
            SignupOutcome::Created { .. } | SignupOutcome::AlreadyExists { .. }
        )),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn put_commits_entry_usage_and_event_together() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let alice = key(1);
    sign_up(s, &alice).await;
    let m = mark();
    let outcome = s
        .commit_put(new_entry(&alice, "/pub/a", "blob-1", 10), Some(m))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        PutOutcome::Committed {
            created_at: 1000,
            replaced_blob: None
        }
    );
    let entry = s.entry(&alice, "/pub/a").await.unwrap().unwrap();
    assert_eq!(
        (entry.stored.blob_key(), entry.size, entry.content_hash),
        (Some("blob-1"), 10, [10; 32])
    );
    assert_eq!(used(s, &alice).await, 10);
    assert!(s.blob_referenced("blob-1").await.unwrap());
    // The same signature again changes nothing.
    assert_eq!(
        s.commit_put(new_entry(&alice, "/pub/a", "blob-x", 99), Some(m))
            .await
            .unwrap(),
        PutOutcome::Replayed
    );
    assert_eq!(used(s, &alice).await, 10);

    // An overwrite keeps created_at, hands back the replaced blob, counts the difference.
    let mut later = new_entry(&alice, "/pub/a", "blob-2", 4);
    later.now = 2000;
    assert_eq!(
        s.commit_put(later, None).await.unwrap(),
        PutOutcome::Committed {
            created_at: 1000,
            replaced_blob: Some("blob-1".into())
        }
    );
    let entry = s.entry(&alice, "/pub/a").await.unwrap().unwrap();
    assert_eq!(
        (entry.created_at, entry.updated_at, entry.size),
        (1000, 2000, 4)
    );
    assert_eq!(used(s, &alice).await, 4);
    assert!(!s.blob_referenced("blob-1").await.unwrap());
    let user = s.user(&alice).await.unwrap().unwrap();
    assert_eq!(user.last_activity, 2000);

    let events = s
        .events(EventQuery {
            users: &[],
            after: 0,
            up_to: u64::MAX >> 1,
            path_prefix: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(
        events.len(),
        2,
        "one event a committed write, none for the replay"
    );
    assert!(events[0].cursor < events[1].cursor);
    assert_eq!(events[0].kind, EventKind::Put);
    assert_eq!(events[0].content_hash, Some([10; 32]));
    assert_eq!(events[1].content_hash, Some([4; 32]));
    assert_eq!(s.latest_cursor().await.unwrap(), events[1].cursor);

    // The pre-check's view: the user and the size of what would be replaced.
    let context = s.write_context(&alice, "/pub/a").await.unwrap();
    assert_eq!(context.existing_size, Some(4));
    assert_eq!(context.user.unwrap().used_bytes, 4);
    let context = s.write_context(&alice, "/pub/new").await.unwrap();
    assert_eq!(context.existing_size, None);
    assert!(
        s.write_context(&key(9), "/pub/a")
            .await
            .unwrap()
            .user
            .is_none()
    );
}

#[tokio::test]
async fn quota_is_checked_at_commit() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let alice = key(1);
    sign_up(s, &alice).await;
    let with_quota = |path: &'static str, size: u64, quota: u64| NewEntry {
        default_quota: quota,
        ..new_entry(&alice, path, "b", size)
    };
    assert!(matches!(
        s.commit_put(with_quota("/pub/a", 60, 100), None)
            .await
            .unwrap(),
        PutOutcome::Committed { .. }
    ));
    // Over: `needed` is what the write adds, the entry and usage are unchanged.
    assert_eq!(
        s.commit_put(with_quota("/pub/a", 141, 100), None)
            .await
            .unwrap(),
        PutOutcome::QuotaExceeded(QuotaExceeded {
            used: 60,
            quota: 100,
            needed: 81
        })
    );
    assert_eq!(s.entry(&alice, "/pub/a").await.unwrap().unwrap().size, 60);
    assert_eq!(used(s, &alice).await, 60);
    // Exactly at the quota fits; a shrinking write fits even over quota.
    assert!(matches!(
        s.commit_put(with_quota("/pub/b", 40, 100), None)
            .await
            .unwrap(),
        PutOutcome::Committed { .. }
    ));
    assert!(matches!(
        s.commit_put(with_quota("/pub/a", 50, 10), None)
            .await
            .unwrap(),
        PutOutcome::Committed { .. }
    ));
    assert_eq!(used(s, &alice).await, 90);
    // A user's override wins over the default; 0 = unlimited.
    assert!(s.set_user_quota(&alice, Some(0)).await.unwrap());
    assert!(matches!(
        s.commit_put(with_quota("/pub/c", 1000, 100), None)
            .await
            .unwrap(),
        PutOutcome::Committed { .. }
    ));
    assert!(s.set_user_quota(&alice, Some(1000)).await.unwrap());
    assert_eq!(
        s.user(&alice).await.unwrap().unwrap().quota_bytes,
        Some(1000)
    );
    assert!(matches!(
        s.commit_put(with_quota("/pub/d", 1, 0), None)
            .await
            .unwrap(),
        PutOutcome::QuotaExceeded(QuotaExceeded { quota: 1000, .. })
    ));
    assert!(s.set_user_quota(&alice, None).await.unwrap());
    assert_eq!(s.user(&alice).await.unwrap().unwrap().quota_bytes, None);
    assert!(!s.set_user_quota(&key(9), None).await.unwrap());
}

/// Every refusal spends the replay mark: the same signature later is `Replayed`, even
/// once the reason for the refusal is gone.
#[tokio::test]
async fn refusals_spend_the_replay_mark() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let (alice, stranger) = (key(1), key(2));
    sign_up(s, &alice).await;

    let m = mark();
    assert_eq!(
        s.commit_put(new_entry(&stranger, "/pub/a", "b", 1), Some(m))
            .await
            .unwrap(),
        PutOutcome::UnknownUser
    );
    sign_up(s, &stranger).await;
    assert_eq!(
        s.commit_put(new_entry(&stranger, "/pub/a", "b", 1), Some(m))
            .await
            .unwrap(),
        PutOutcome::Replayed
    );

    let m = mark();
    let over = NewEntry {
        default_quota: 5,
        ..new_entry(&alice, "/pub/big", "b", 10)
    };
    assert!(matches!(
        s.commit_put(over.clone(), Some(m)).await.unwrap(),
        PutOutcome::QuotaExceeded(_)
    ));
    let roomy = NewEntry {
        default_quota: 0,
        ..over
    };
    assert_eq!(
        s.commit_put(roomy, Some(m)).await.unwrap(),
        PutOutcome::Replayed
    );

    assert!(s.set_user_disabled(&alice, true).await.unwrap());
    assert!(s.user(&alice).await.unwrap().unwrap().disabled);
    let (put_mark, del_mark) = (mark(), mark());
    assert_eq!(
        s.commit_put(new_entry(&alice, "/pub/a", "b", 1), Some(put_mark))
            .await
            .unwrap(),
        PutOutcome::Disabled
    );
    assert_eq!(
        s.commit_delete(&alice, "/pub/a", 5, Some(del_mark))
            .await
            .unwrap(),
        DeleteOutcome::Disabled
    );
    let session = SessionRecord {
        token_hash: [1; 32],
        user: alice.clone(),
        capabilities: vec!["read:/pub/".into()],
        created_at: 1,
        expires_at: 100,
    };
    let session_mark = mark();
    assert_eq!(
        s.create_session(&session, session_mark).await.unwrap(),
        CreateSessionOutcome::Disabled
    );
    assert!(s.set_user_disabled(&alice, false).await.unwrap());
    assert!(!s.set_user_disabled(&key(9), true).await.unwrap());
    assert_eq!(
        s.commit_put(new_entry(&alice, "/pub/a", "b", 1), Some(put_mark))
            .await
            .unwrap(),
        PutOutcome::Replayed
    );
    assert_eq!(
        s.commit_delete(&alice, "/pub/a", 5, Some(del_mark))
            .await
            .unwrap(),
        DeleteOutcome::Replayed
    );
    assert_eq!(
        s.create_session(&session, session_mark).await.unwrap(),
        CreateSessionOutcome::Replayed
    );

    // A refusal decided before the store was asked (e.g. 403 from the policy).
    let m = mark();
    assert!(s.mark_signature(m).await.unwrap());
    assert!(!s.mark_signature(m).await.unwrap());
    assert_eq!(
        s.commit_delete(&alice, "/pub/none", 5, Some(m))
            .await
            .unwrap(),
        DeleteOutcome::Replayed
    );

    // Nothing of the refused writes is stored.
    assert_eq!(used(s, &alice).await, 0);
    assert!(s.entry(&alice, "/pub/a").await.unwrap().is_none());
    assert!(s.session(&[1; 32]).await.unwrap().is_none());
    assert!(all_events(s).await.is_empty());
}

#[tokio::test]
async fn delete_outcomes() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let alice = key(1);
    assert_eq!(
        s.commit_delete(&alice, "/pub/a", 5, None).await.unwrap(),
        DeleteOutcome::UnknownUser
    );
    sign_up(s, &alice).await;
    put(s, &alice, "/pub/a", 7).await;
    put(s, &alice, "/pub/b", 3).await;
    let m = mark();
    assert_eq!(
        s.commit_delete(&alice, "/pub/missing", 5, Some(m))
            .await
            .unwrap(),
        DeleteOutcome::NotFound
    );
    assert_eq!(
        s.commit_delete(&alice, "/pub/a", 5, Some(m)).await.unwrap(),
        DeleteOutcome::Replayed,
        "a not-found answer spends the mark too"
    );
    let m = mark();
    assert_eq!(
        s.commit_delete(&alice, "/pub/a", 5, Some(m)).await.unwrap(),
        DeleteOutcome::Deleted {
            blob_key: Some(format!("{alice}//pub/a/7"))
        }
    );
    assert!(s.entry(&alice, "/pub/a").await.unwrap().is_none());
    assert_eq!(used(s, &alice).await, 3);
    let events = all_events(s).await;
    assert_eq!(events.len(), 3);
    assert_eq!(
        (events[2].2.as_str(), events[2].3),
        ("/pub/a", EventKind::Del)
    );
}

#[tokio::test]
async fn entry_ranges_in_path_order() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let (alice, bob) = (key(1), key(2));
    sign_up(s, &alice).await;
    sign_up(s, &bob).await;
    for path in ["/pub/b", "/pub/a/x", "/pub/a/y", "/pub/c", "/pub/a_z"] {
        put(s, &alice, path, 1).await;
    }
    put(s, &bob, "/pub/a/bob", 1).await;
    let range = |after: &'static str, before: &'static str, descending, limit| EntryRange {
        user: &alice,
        after,
        before,
        descending,
        limit,
    };
    let paths = |entries: Vec<homeserver::persistence::metadata::EntryRecord>| {
        entries.into_iter().map(|e| e.path).collect::<Vec<_>>()
    };
    assert_eq!(
        paths(
            s.entries(range("/pub/", "/pub/{", false, 100))
                .await
                .unwrap()
        ),
        ["/pub/a/x", "/pub/a/y", "/pub/a_z", "/pub/b", "/pub/c"]
    );
    assert_eq!(
        paths(
            s.entries(range("/pub/a/", "/pub/a/{", true, 100))
                .await
                .unwrap()
        ),
        ["/pub/a/y", "/pub/a/x"]
    );
    assert_eq!(
        paths(
            s.entries(range("/pub/a/x", "/pub/{", false, 2))
                .await
                .unwrap()
        ),
        ["/pub/a/y", "/pub/a_z"]
    );
    assert_eq!(
        paths(s.entries(range("/pub/", "/pub/b", true, 1)).await.unwrap()),
        ["/pub/a_z"]
    );
}

#[tokio::test]
async fn event_queries() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let (alice, bob) = (key(1), key(2));
    sign_up(s, &alice).await;
    sign_up(s, &bob).await;
    // Cursors 1.. in this order (gaps are allowed, so compare positions, not values).
    let writes = [
        (&alice, "/pub/app/1"),
        (&bob, "/pub/app/2"),
        (&alice, "/pub/other/3"),
        (&alice, "/pub/app/4"),
        (&bob, "/pub/app/5"),
    ];
    for (user, path) in writes {
        put(s, user, path, 1).await;
    }
    let all = s
        .events(EventQuery {
            users: &[],
            after: 0,
            up_to: i64::MAX as u64,
            path_prefix: None,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
        writes.map(|w| w.1)
    );
    let c: Vec<u64> = all.iter().map(|e| e.cursor).collect();
    assert!(c.windows(2).all(|w| w[0] < w[1]));

    // Window (after, up_to] and limit.
    let window = s
        .events(EventQuery {
            users: &[],
            after: c[0],
            up_to: c[3],
            path_prefix: None,
            limit: 2,
        })
        .await
        .unwrap();
    assert_eq!(
        window.iter().map(|e| e.cursor).collect::<Vec<_>>(),
        [c[1], c[2]]
    );

    // Per-user cursors and a path prefix.
    let users = [
        UserCursor {
            user: alice.clone(),
            cursor: c[0],
        },
        UserCursor {
            user: bob.clone(),
            cursor: 0,
        },
    ];
    let picked = s
        .events(EventQuery {
            users: &users,
            after: 0,
            up_to: i64::MAX as u64,
            path_prefix: Some("/pub/app/"),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(
        picked.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
        ["/pub/app/2", "/pub/app/4", "/pub/app/5"]
    );
    assert_eq!(picked[0].user, bob);

    // Reverse: below `before`, each user below its own cursor when not 0.
    let users = [UserCursor {
        user: alice.clone(),
        cursor: c[3],
    }];
    let back = s
        .events_reverse(ReverseEventQuery {
            users: &users,
            before: i64::MAX as u64,
            path_prefix: None,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(
        back.iter().map(|e| e.cursor).collect::<Vec<_>>(),
        [c[2], c[0]]
    );
    let back = s
        .events_reverse(ReverseEventQuery {
            users: &[],
            before: c[4],
            path_prefix: Some("/pub/app/"),
            limit: 2,
        })
        .await
        .unwrap();
    assert_eq!(
        back.iter().map(|e| e.cursor).collect::<Vec<_>>(),
        [c[3], c[1]]
    );
    assert_eq!(s.latest_cursor().await.unwrap(), c[4]);
}

#[tokio::test]
async fn sessions_lifecycle() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let alice = key(1);
    let session = |hash: u8, expires_at| SessionRecord {
        token_hash: [hash; 32],
        user: alice.clone(),
        capabilities: vec!["read:/pub/".into(), "write:/pub/app/".into()],
        created_at: 10,
        expires_at,
    };
    assert_eq!(
        s.create_session(&session(1, 100), mark()).await.unwrap(),
        CreateSessionOutcome::UnknownUser
    );
    sign_up(s, &alice).await;
    let m = mark();
    assert_eq!(
        s.create_session(&session(1, 100), m).await.unwrap(),
        CreateSessionOutcome::Created
    );
    assert_eq!(
        s.create_session(&session(9, 100), m).await.unwrap(),
        CreateSessionOutcome::Replayed
    );
    assert_eq!(
        s.create_session(&session(2, 50), mark()).await.unwrap(),
        CreateSessionOutcome::Created
    );
    assert_eq!(s.session(&[1; 32]).await.unwrap(), Some(session(1, 100)));
    assert!(s.session(&[9; 32]).await.unwrap().is_none());
    assert_eq!(s.active_sessions(60).await.unwrap(), 1);
    assert_eq!(s.active_sessions(10).await.unwrap(), 2);
    assert_eq!(s.purge_sessions(60).await.unwrap(), 1);
    assert!(s.session(&[2; 32]).await.unwrap().is_none());
    assert!(s.delete_session(&[1; 32]).await.unwrap());
    assert!(!s.delete_session(&[1; 32]).await.unwrap());
}

#[tokio::test]
async fn replay_marks_expire() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let old = ReplayMark {
        expires_at: 50,
        ..mark()
    };
    let young = ReplayMark {
        expires_at: 500,
        ..mark()
    };
    assert!(s.mark_signature(old).await.unwrap());
    assert!(s.mark_signature(young).await.unwrap());
    assert_eq!(s.purge_replay_marks(100).await.unwrap(), 1);
    assert!(
        s.mark_signature(old).await.unwrap(),
        "forgotten once expired"
    );
    assert!(!s.mark_signature(young).await.unwrap());
}

#[tokio::test]
async fn account_deletion() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let (alice, bob) = (key(1), key(2));
    assert_eq!(s.delete_account(&alice, 5).await.unwrap(), None);
    sign_up(s, &alice).await;
    sign_up(s, &bob).await;
    for path in ["/pub/c", "/pub/a", "/pub/b"] {
        put(s, &alice, path, 2).await;
    }
    put(s, &bob, "/pub/keep", 5).await;
    let session = SessionRecord {
        token_hash: [3; 32],
        user: alice.clone(),
        capabilities: vec![],
        created_at: 1,
        expires_at: i64::MAX,
    };
    s.create_session(&session, mark()).await.unwrap();
    let before = s.latest_cursor().await.unwrap();

    let mut blobs: Vec<String> = (s.delete_account(&alice, 5).await.unwrap().unwrap())
        .into_iter()
        .filter_map(Stored::into_blob_key)
        .collect();
    blobs.sort();
    assert_eq!(
        blobs,
        ["/pub/a", "/pub/b", "/pub/c"].map(|p| format!("{alice}/{p}/2"))
    );
    assert!(s.user(&alice).await.unwrap().is_none());
    assert!(s.entry(&alice, "/pub/a").await.unwrap().is_none());
    assert!(s.session(&[3; 32]).await.unwrap().is_none());
    // One DEL event an entry, in path order, after everything before.
    let dels: Vec<_> = all_events(s)
        .await
        .into_iter()
        .filter(|e| e.0 > before)
        .collect();
    assert_eq!(
        dels.iter()
            .map(|e| (e.1.as_str(), e.2.as_str(), e.3))
            .collect::<Vec<_>>(),
        ["/pub/a", "/pub/b", "/pub/c"].map(|p| (alice.as_str(), p, EventKind::Del))
    );
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.users, stats.total_storage), (1, 5));
    // The key may sign up again, with an empty space.
    sign_up(s, &alice).await;
    assert_eq!(used(s, &alice).await, 0);
}

/// A blob an overwrite, a DELETE or an account deletion leaves unreferenced is retired
/// in the same transaction, with its time; the blob state tells it from a referenced
/// and an unknown one; the records come back oldest first until forgotten.
#[tokio::test]
async fn unreferenced_blobs_are_retired_with_their_commit() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let (alice, bob) = (key(1), key(2));
    sign_up(s, &alice).await;
    sign_up(s, &bob).await;
    put(s, &alice, "/pub/a", 1).await;
    assert_eq!(
        s.blob_state(&format!("{alice}//pub/a/1")).await.unwrap(),
        BlobState::Referenced
    );
    assert_eq!(
        s.blob_state("never/seen").await.unwrap(),
        BlobState::Unknown
    );

    // An overwrite at 2000 retires the old blob at 2000.
    let mut over = new_entry(&alice, "/pub/a", "alice-a-2", 2);
    over.now = 2000;
    s.commit_put(over, None).await.unwrap();
    assert_eq!(
        s.blob_state(&format!("{alice}//pub/a/1")).await.unwrap(),
        BlobState::Retired { retired_at: 2000 }
    );
    assert_eq!(
        s.blob_state("alice-a-2").await.unwrap(),
        BlobState::Referenced
    );
    // A refused write retires nothing (quota) and neither does a replay.
    s.set_user_quota(&alice, Some(3)).await.unwrap();
    let mut big = new_entry(&alice, "/pub/a", "alice-a-big", 50);
    big.now = 2100;
    assert!(matches!(
        s.commit_put(big, None).await.unwrap(),
        PutOutcome::QuotaExceeded(_)
    ));
    assert_eq!(
        s.blob_state("alice-a-2").await.unwrap(),
        BlobState::Referenced
    );
    // A DELETE at 3000, an account deletion at 4000.
    assert!(matches!(
        s.commit_delete(&alice, "/pub/a", 3000, None).await.unwrap(),
        DeleteOutcome::Deleted { .. }
    ));
    put(s, &bob, "/pub/x", 7).await;
    put(s, &bob, "/pub/y", 8).await;
    s.delete_account(&bob, 4000).await.unwrap().unwrap();

    let retired = [
        format!("{alice}//pub/a/1"),
        "alice-a-2".to_owned(),
        format!("{bob}//pub/x/7"),
        format!("{bob}//pub/y/8"),
    ];
    assert_eq!(s.retired_blobs(i64::MAX, 100).await.unwrap(), retired);
    assert_eq!(s.retired_blobs(2999, 100).await.unwrap(), retired[..1]);
    assert_eq!(s.retired_blobs(3000, 2).await.unwrap(), retired[..2]);
    assert_eq!(
        s.retired_blobs(1999, 100).await.unwrap(),
        Vec::<String>::new()
    );
    // Forgetting is idempotent (a sweep that ran twice).
    assert_eq!(s.forget_retired_blobs(&retired[..2]).await.unwrap(), 2);
    assert_eq!(s.forget_retired_blobs(&retired[..2]).await.unwrap(), 0);
    assert_eq!(s.retired_blobs(i64::MAX, 100).await.unwrap(), retired[2..]);
    assert_eq!(s.blob_state("alice-a-2").await.unwrap(), BlobState::Unknown);
}

/// Small values in their rows: they read back byte for byte (the empty value too), are
/// replaced by a blob and replace one, count toward usage, and are never retired (no
/// blob to delete); copies carry them.
#[tokio::test]
async fn inline_values_live_in_their_rows() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let alice = key(1);
    sign_up(s, &alice).await;
    let inline = |bytes: &'static [u8]| Stored::Inline(bytes::Bytes::from_static(bytes));
    let put_inline = async |path: &str, bytes: &'static [u8], now: i64| {
        let entry = NewEntry {
            stored: inline(bytes),
            now,
            ..new_entry(&alice, path, "unused", bytes.len() as u64)
        };
        s.commit_put(entry, Some(mark())).await.unwrap()
    };
    // Every byte value, and the empty value (which SQLite may hand back as NULL).
    static ALL_BYTES: [u8; 256] = {
        let mut b = [0u8; 256];
        let mut i = 0;
        while i < 256 {
            b[i] = i as u8;
            i += 1;
        }
        b
    };
    let all_bytes: &'static [u8] = &ALL_BYTES;
    assert!(matches!(
        put_inline("/pub/bytes", all_bytes, 1000).await,
        PutOutcome::Committed {
            replaced_blob: None,
            ..
        }
    ));
    put_inline("/pub/empty", b"", 1000).await;
    let read = async |path: &str| s.entry(&alice, path).await.unwrap().unwrap();
    assert_eq!(read("/pub/bytes").await.stored, inline(all_bytes));
    assert_eq!(read("/pub/empty").await.stored, inline(b""));
    assert_eq!(used(s, &alice).await, 256);

    // A blob replaced by an inline value is retired; an inline value replaced by a blob
    // or deleted retires nothing.
    s.commit_put(new_entry(&alice, "/pub/a", "alice-a-blob", 9), None)
        .await
        .unwrap();
    assert_eq!(
        put_inline("/pub/a", b"small", 2000).await,
        PutOutcome::Committed {
            created_at: 1000,
            replaced_blob: Some("alice-a-blob".into())
        }
    );
    assert_eq!(
        s.blob_state("alice-a-blob").await.unwrap(),
        BlobState::Retired { retired_at: 2000 }
    );
    assert_eq!(
        s.commit_put(new_entry(&alice, "/pub/bytes", "alice-bytes", 3), None)
            .await
            .unwrap(),
        PutOutcome::Committed {
            created_at: 1000,
            replaced_blob: None
        }
    );
    assert_eq!(
        read("/pub/bytes").await.stored.blob_key(),
        Some("alice-bytes")
    );
    assert_eq!(
        s.commit_delete(&alice, "/pub/a", 3000, None).await.unwrap(),
        DeleteOutcome::Deleted { blob_key: None }
    );
    assert_eq!(
        s.retired_blobs(i64::MAX, 100).await.unwrap(),
        ["alice-a-blob"]
    );
    assert_eq!(used(s, &alice).await, 3);

    // Copies carry inline values.
    put_inline("/pub/c", b"copied", 3000).await;
    let to = fixture().await;
    let b = to.store.as_ref();
    b.copy_users(&s.users_after("", 100).await.unwrap())
        .await
        .unwrap();
    let entries = s
        .entries(EntryRange {
            user: &alice,
            after: "",
            before: "{",
            descending: false,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(entries.len(), 3, "{entries:?}");
    b.copy_entries(&alice, &entries).await.unwrap();
    for entry in &entries {
        assert_eq!(
            b.entry(&alice, &entry.path).await.unwrap().as_ref(),
            Some(entry)
        );
    }
    assert_eq!(read("/pub/c").await.stored, inline(b"copied"));
    // An account deletion hands back where each value was, in path order.
    assert_eq!(
        s.delete_account(&alice, 4000).await.unwrap(),
        Some(vec![
            Stored::Blob("alice-bytes".into()),
            inline(b"copied"),
            inline(b""),
        ])
    );
}

/// The sweep's lease: one holder at a time until it expires; the holder renews it;
/// released, anyone may take it. Racing takers: exactly one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_have_one_holder() {
    let f = fixture().await;
    let s = f.store.as_ref();
    assert!(s.take_lease("sweep", "a", 100, 200).await.unwrap());
    assert!(!s.take_lease("sweep", "b", 150, 250).await.unwrap());
    assert!(
        s.take_lease("other", "b", 150, 250).await.unwrap(),
        "names are apart"
    );
    assert!(
        s.take_lease("sweep", "a", 190, 290).await.unwrap(),
        "renewed"
    );
    assert!(!s.take_lease("sweep", "b", 250, 350).await.unwrap());
    assert!(
        s.take_lease("sweep", "b", 290, 390).await.unwrap(),
        "expired: taken over"
    );
    s.release_lease("sweep", "a").await.unwrap();
    assert!(
        !s.take_lease("sweep", "a", 300, 400).await.unwrap(),
        "only the holder releases"
    );
    s.release_lease("sweep", "b").await.unwrap();
    let racers = (0..8).map(|n| {
        let store = f.store.clone();
        tokio::spawn(async move {
            store
                .take_lease("race", &format!("r{n}"), 1000, 2000)
                .await
                .unwrap()
        })
    });
    let won = futures_util::future::join_all(racers)
        .await
        .into_iter()
        .filter(|r| *r.as_ref().unwrap())
        .count();
    assert_eq!(won, 1);
}

/// Writes of one user are serialized: many concurrent writers near the quota never take
/// the user over it, and usage is exactly the sum of what is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_of_one_user_keep_usage_exact() {
    let f = fixture().await;
    let alice = key(1);
    sign_up(f.store.as_ref(), &alice).await;
    let writers = (0..24u64).map(|i| {
        let store = f.store.clone();
        let alice = alice.clone();
        tokio::spawn(async move {
            // Overwrites of 4 paths and new paths, sizes 10..=60.
            let path = format!("/pub/{}", if i % 2 == 0 { i % 4 } else { i });
            let blob = format!("b{i}");
            let entry = NewEntry {
                default_quota: 300,
                ..new_entry(&alice, &path, &blob, 10 + (i * 7) % 51)
            };
            store.commit_put(entry, Some(mark())).await.unwrap()
        })
    });
    for outcome in futures_util::future::join_all(writers).await {
        assert!(matches!(
            outcome.unwrap(),
            PutOutcome::Committed { .. } | PutOutcome::QuotaExceeded(_)
        ));
    }
    let s = f.store.as_ref();
    let stored: u64 = s
        .entries(EntryRange {
            user: &alice,
            after: "/",
            before: "/{",
            descending: false,
            limit: 1000,
        })
        .await
        .unwrap()
        .iter()
        .map(|e| e.size)
        .sum();
    assert_eq!(used(s, &alice).await, stored);
    assert!(stored <= 300, "{stored}");
}

/// Cursors are final in commit order: while many writers commit, readers that walk the
/// feed never see an event appear below a cursor they already passed, and together see
/// every event exactly once. On a backend that several instances may share, the writers
/// go through two separately opened stores (two instances' pools).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cursors_are_commit_ordered() {
    let f = fixture().await;
    let stores: Vec<Arc<dyn MetadataStore>> = if crate::backend::Backend::current().shared() {
        vec![f.store.clone(), f.db.open().await]
    } else {
        vec![f.store.clone()]
    };
    const USERS: u32 = 6;
    const WRITES: u32 = 40;
    for u in 0..USERS {
        sign_up(f.store.as_ref(), &key(u)).await;
    }
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let store = f.store.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let mut seen: Vec<u64> = Vec::new();
                let mut passed = 0;
                loop {
                    let finished = done.load(Ordering::SeqCst);
                    let page = store
                        .events(EventQuery {
                            users: &[],
                            after: passed,
                            up_to: i64::MAX as u64,
                            path_prefix: None,
                            limit: 7,
                        })
                        .await
                        .unwrap();
                    for e in &page {
                        assert!(e.cursor > passed, "cursor {} after {passed}", e.cursor);
                        passed = e.cursor;
                        seen.push(e.cursor);
                    }
                    if page.is_empty() && finished {
                        return seen;
                    }
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..USERS)
        .map(|u| {
            let store = stores[u as usize % stores.len()].clone();
            tokio::spawn(async move {
                for w in 0..WRITES {
                    let user = key(u);
                    let outcome = put(store.as_ref(), &user, &format!("/pub/{}", w % 5), 1).await;
                    assert!(matches!(outcome, PutOutcome::Committed { .. }));
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let all: Vec<u64> = all_events(f.store.as_ref())
        .await
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(all.len(), (USERS * WRITES) as usize);
    for r in readers {
        let seen = r.await.unwrap();
        assert_eq!(seen, all, "a reader saw every event once, in order");
    }
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len());
}

/// The repairs fsck makes: removing an entry only while it still points at the lost
/// blob (usage and a DEL event with it), and usage recomputed from the entries.
#[tokio::test]
async fn repairs_are_rules_too() {
    let f = fixture().await;
    let s = f.store.as_ref();
    let alice = key(1);
    sign_up(s, &alice).await;
    put(s, &alice, "/pub/a", 10).await;
    put(s, &alice, "/pub/b", 5).await;
    let blob_a = s
        .entry(&alice, "/pub/a")
        .await
        .unwrap()
        .unwrap()
        .stored
        .into_blob_key()
        .unwrap();
    // Not the entry's blob any more (an overwrite came first): left alone.
    assert!(
        !s.remove_entry_if_blob(&alice, "/pub/a", "someone/else", 2000)
            .await
            .unwrap()
    );
    assert!(
        s.remove_entry_if_blob(&alice, "/pub/a", &blob_a, 2000)
            .await
            .unwrap()
    );
    assert!(s.entry(&alice, "/pub/a").await.unwrap().is_none());
    assert_eq!(used(s, &alice).await, 5);
    let events = all_events(s).await;
    let last = events.last().unwrap();
    assert_eq!((last.2.as_str(), last.3), ("/pub/a", EventKind::Del));
    // A usage that drifted is set to the entries' sum, atomically.
    assert_eq!(s.recompute_usage(&alice).await.unwrap(), Some((5, 5)));
    assert_eq!(s.recompute_usage(&key(9)).await.unwrap(), None);
}

/// Copying a deployment: every kind of row goes over as it is, upserts make a second
/// copy a no-op, events keep their cursors and later appends continue above them.
#[tokio::test]
async fn copies_carry_rows_as_they_are() {
    let from = fixture().await;
    let to = fixture().await;
    let (a, b) = (from.store.as_ref(), to.store.as_ref());
    let alice = key(1);
    sign_up(a, &alice).await;
    put(a, &alice, "/pub/x", 7).await;
    put(a, &alice, "/pub/y", 3).await;
    a.commit_delete(&alice, "/pub/y", 1500, Some(mark()))
        .await
        .unwrap();
    assert!(a.create_signup_token("AAAA-BBBB-CCCC", 50).await.unwrap());
    a.create_session(
        &SessionRecord {
            token_hash: [7; 32],
            user: alice.clone(),
            capabilities: vec!["read:/pub/".into()],
            created_at: 10,
            expires_at: 5000,
        },
        mark(),
    )
    .await
    .unwrap();
    a.set_user_quota(&alice, Some(999)).await.unwrap();

    for _ in 0..2 {
        let users = a.users_after("", 100).await.unwrap();
        b.copy_users(&users).await.unwrap();
        let entries = a
            .entries(EntryRange {
                user: &alice,
                after: "",
                before: "{",
                descending: false,
                limit: 100,
            })
            .await
            .unwrap();
        b.copy_entries(&alice, &entries).await.unwrap();
        let events = a
            .events(EventQuery {
                users: &[],
                after: 0,
                up_to: i64::MAX as u64,
                path_prefix: None,
                limit: 100,
            })
            .await
            .unwrap();
        b.copy_events(&events).await.unwrap();
        b.copy_signup_tokens(&a.signup_tokens_after("", 100).await.unwrap())
            .await
            .unwrap();
        b.copy_sessions(&a.sessions_after(&[0; 32], 100).await.unwrap())
            .await
            .unwrap();
    }
    assert_eq!(b.user(&alice).await.unwrap(), a.user(&alice).await.unwrap());
    assert_eq!(
        b.entry(&alice, "/pub/x").await.unwrap(),
        a.entry(&alice, "/pub/x").await.unwrap()
    );
    assert!(b.entry(&alice, "/pub/y").await.unwrap().is_none());
    assert_eq!(all_events(b).await, all_events(a).await);
    assert_eq!(b.stats().await.unwrap(), a.stats().await.unwrap());
    assert_eq!(
        b.signup_token("AAAA-BBBB-CCCC").await.unwrap(),
        a.signup_token("AAAA-BBBB-CCCC").await.unwrap()
    );
    assert_eq!(
        b.session(&[7; 32]).await.unwrap(),
        a.session(&[7; 32]).await.unwrap()
    );
    // New events on the copy come after the copied ones.
    let copied_head = b.latest_cursor().await.unwrap();
    assert_eq!(copied_head, a.latest_cursor().await.unwrap());
    put(b, &alice, "/pub/z", 1).await;
    assert!(b.latest_cursor().await.unwrap() > copied_head);
}

/// Group commit: many writes at once are committed together, each caller gets its own
/// outcome, and a write that fails takes none of the others with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_procedures_share_transactions_but_not_failures() {
    use homeserver::persistence::metadata::Procedure;
    let f = fixture().await;
    let alice = key(1);
    sign_up(f.store.as_ref(), &alice).await;
    let tasks: Vec<_> = (0..40u64)
        .map(|i| {
            let store = f.store.clone();
            let alice = alice.clone();
            tokio::spawn(async move {
                if i == 17 {
                    // A procedure that fails after a step: its batch must not commit
                    // that step, and the others must still go through.
                    let user = alice.clone();
                    return store
                        .run_procedure(Procedure::new(alice.clone(), move |tx| {
                            let user = user.clone();
                            Box::pin(async move {
                                tx.set_usage(&user, 999_999, 0).await?;
                                Err::<(), _>(StoreError::Internal("poison".into()))
                            })
                        }))
                        .await
                        .map(|_| ());
                }
                let blob = format!("b{i}");
                let outcome = store
                    .commit_put(
                        new_entry(&alice, &format!("/pub/{i}"), &blob, 10),
                        Some(mark()),
                    )
                    .await?;
                assert!(
                    matches!(outcome, PutOutcome::Committed { .. }),
                    "{outcome:?}"
                );
                Ok(())
            })
        })
        .collect();
    let mut failed = 0;
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            assert!(e.to_string().contains("poison"), "{e}");
            failed += 1;
        }
    }
    assert_eq!(failed, 1);
    let s = f.store.as_ref();
    assert_eq!(
        used(s, &alice).await,
        39 * 10,
        "the poisoned write changed nothing"
    );
    assert_eq!(all_events(s).await.len(), 39);
}
