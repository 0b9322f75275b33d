//! The Redis bus against the real Redis (127.0.0.1:6379, or `PKBOT_TEST_REDIS_URL`):
//! skipped with the reason printed when there is none, a failure under `CI=true`.
//! Each test works under a key prefix of its own.

use std::time::Duration;

use super::*;
use crate::bus::ActionRequested;

/// A bus on its own prefix, or None (skipped).
async fn bus(test: &str, claim_idle_ms: u64, max_deliveries: u64) -> Option<RedisBus> {
    let url =
        std::env::var("PKBOT_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let ops = IntCounterVec::new(prometheus::Opts::new("ops", "ops"), &["operation"]).unwrap();
    let prefix = format!("test-{}-{}-{test}:", std::process::id(), rand_suffix());
    let config = RedisBusConfig {
        url: url.clone(),
        prefix,
        claim_idle: Duration::from_millis(claim_idle_ms),
        max_deliveries,
        block: Duration::from_millis(200),
    };
    match RedisBus::connect(config, ops).await {
        Ok(bus) if bus.ping().await.is_ok() => Some(bus),
        other => {
            let why = format!(
                "no Redis at {url}: {}",
                other.err().map(|e| e.to_string()).unwrap_or_default()
            );
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true and {why}"
            );
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

fn rand_suffix() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b)
}

fn request(id: &str) -> Message {
    Message::ActionRequested(ActionRequested {
        mention_id: id.into(),
        action_type: "summary".into(),
    })
}

async fn next(consumer: &Arc<dyn Consumer>) -> Delivery {
    let stop = CancellationToken::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(d) = consumer.next(&stop).await.unwrap() {
                return d;
            }
        }
    })
    .await
    .expect("a message within 20 s")
}

/// Nothing arrives for `wait`.
async fn nothing_for(consumer: &Arc<dyn Consumer>, wait: Duration) {
    let stop = CancellationToken::new();
    let stopper = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        stopper.cancel();
    });
    if let Some(d) = consumer.next(&stop).await.unwrap() {
        panic!("unexpected delivery {d:?}");
    }
}

#[tokio::test]
async fn each_message_goes_to_one_consumer_and_an_ack_removes_it() {
    let Some(bus) = bus("share", 60_000, 5).await else {
        return;
    };
    // Published before any consumer existed: still read.
    for i in 0..4 {
        bus.publish(Topic::SummaryRequested, request(&format!("m{i}")))
            .await
            .unwrap();
    }
    let a = bus.consumer(Topic::SummaryRequested).await.unwrap();
    let b = bus.consumer(Topic::SummaryRequested).await.unwrap();
    let mut seen = Vec::new();
    for consumer in [&a, &b, &a, &b] {
        let d = next(consumer).await;
        assert_eq!(d.deliveries, 1);
        seen.push(d.mention_id().unwrap().to_owned());
        consumer.ack(&d).await.unwrap();
    }
    seen.sort();
    assert_eq!(seen, ["m0", "m1", "m2", "m3"]);
    let mut conn = bus.connection();
    let len: u64 = redis::cmd("XLEN")
        .arg(bus.key(Topic::SummaryRequested.name()))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 0, "acknowledged messages are deleted");
}

#[tokio::test]
async fn a_message_left_by_a_dead_consumer_goes_to_another() {
    let Some(bus) = bus("dead", 600, 5).await else {
        return;
    };
    let a = bus.consumer(Topic::SummaryRequested).await.unwrap();
    bus.publish(Topic::SummaryRequested, request("m1"))
        .await
        .unwrap();
    let first = next(&a).await;
    assert_eq!(first.deliveries, 1);
    drop(a); // dies without an acknowledgement
    let b = bus.consumer(Topic::SummaryRequested).await.unwrap();
    let again = next(&b).await;
    assert_eq!(again.id, first.id);
    assert_eq!(again.deliveries, 2);
    b.ack(&again).await.unwrap();
    nothing_for(&b, Duration::from_millis(1500)).await;
}

#[tokio::test]
async fn a_message_in_work_is_not_taken_from_a_live_consumer() {
    let Some(bus) = bus("live", 500, 5).await else {
        return;
    };
    let a = bus.consumer(Topic::SummaryRequested).await.unwrap();
    let b = bus.consumer(Topic::SummaryRequested).await.unwrap();
    bus.publish(Topic::SummaryRequested, request("slow"))
        .await
        .unwrap();
    let d = next(&a).await;
    // a works on it for six times the claim time: b never gets it.
    nothing_for(&b, Duration::from_secs(3)).await;
    a.ack(&d).await.unwrap();
}

#[tokio::test]
async fn a_message_failing_every_time_is_dead_lettered_then_replayed() {
    let Some(bus) = bus("poison", 300, 3).await else {
        return;
    };
    let consumer = bus.consumer(Topic::SummaryRequested).await.unwrap();
    bus.publish(Topic::SummaryRequested, request("m1"))
        .await
        .unwrap();
    for attempt in 1..=3 {
        let d = next(&consumer).await;
        assert_eq!(d.deliveries, attempt);
        consumer
            .failed(&d, &format!("provider down ({attempt})"))
            .await
            .unwrap();
    }
    // The fourth delivery comes with the last reason: the pipeline dead-letters it.
    let d = next(&consumer).await;
    let reason = d.exhausted.clone().expect("too many deliveries");
    assert!(reason.contains("provider down (3)"), "{reason}");
    consumer.dead_letter(&d, &reason).await.unwrap();
    nothing_for(&consumer, Duration::from_secs(1)).await;
    let letters = bus.dead_letters().await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.stream, "action.summary.requested.v1");
    assert_eq!(letter.deliveries, 4);
    assert!(
        letter.reason.contains("provider down (3)"),
        "{}",
        letter.reason
    );
    assert_eq!(letter.mention_id().as_deref(), Some("m1"));

    // Replayed: a new message, counted from one; the letter is gone.
    assert!(bus.replay("0-1").await.unwrap().is_none());
    bus.replay(&letter.id).await.unwrap().unwrap();
    assert!(bus.dead_letters().await.unwrap().is_empty());
    let d = next(&consumer).await;
    assert_eq!(d.deliveries, 1);
    assert_eq!(d.mention_id(), Some("m1"));
    consumer.ack(&d).await.unwrap();
}

#[tokio::test]
async fn an_unreadable_payload_is_handed_out_as_such() {
    let Some(bus) = bus("garbage", 60_000, 3).await else {
        return;
    };
    let consumer = bus.consumer(Topic::MentionReceived).await.unwrap();
    let mut conn = bus.connection();
    let _: String = redis::cmd("XADD")
        .arg(bus.key(Topic::MentionReceived.name()))
        .arg("*")
        .arg("payload")
        .arg("{not json")
        .query_async(&mut conn)
        .await
        .unwrap();
    let d = next(&consumer).await;
    assert!(d.message.is_err());
    assert!(
        consumer
            .dead_letter(&d, "unreadable")
            .await
            .unwrap()
            .is_some()
    );
    let letters = bus.dead_letters().await.unwrap();
    assert_eq!(letters[0].payload, "{not json");
    assert_eq!(letters[0].mention_id(), None);
}

/// The next delivery, reading again through errors (as the pipeline's loop does).
async fn next_through_errors(consumer: &RedisConsumer) -> Delivery {
    let stop = CancellationToken::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match consumer.next(&stop).await {
                Ok(Some(d)) => return d,
                Ok(None) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .expect("a message within 20 s")
}

#[tokio::test]
async fn a_consumer_reads_on_after_its_connection_is_killed_or_its_group_lost() {
    let Some(bus) = bus("reconnect", 60_000, 5).await else {
        return;
    };
    let consumer = bus.redis_consumer(Topic::ActionCompleted).await.unwrap();
    let completed = |n: u32| {
        Message::ActionCompleted(crate::bus::ActionCompleted {
            mention_id: format!("m{n}"),
            action_type: "summary".into(),
            reply: "r".into(),
        })
    };
    bus.publish(Topic::ActionCompleted, completed(1))
        .await
        .unwrap();
    let d = next_through_errors(&consumer).await;
    consumer.ack(&d).await.unwrap();

    // Its reading connection dies (Redis restarted, a network cut).
    let id: u64 = {
        let mut reader = consumer.reader.lock().await;
        redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut *reader)
            .await
            .unwrap()
    };
    let mut admin = bus.connection();
    let _: Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(&mut admin)
        .await
        .unwrap();
    bus.publish(Topic::ActionCompleted, completed(2))
        .await
        .unwrap();
    let d = next_through_errors(&consumer).await;
    assert_eq!(d.mention_id(), Some("m2"));
    consumer.ack(&d).await.unwrap();

    // Redis lost the stream and its group (restarted without its data).
    let _: Value = redis::cmd("DEL")
        .arg(bus.key(Topic::ActionCompleted.name()))
        .query_async(&mut admin)
        .await
        .unwrap();
    bus.publish(Topic::ActionCompleted, completed(3))
        .await
        .unwrap();
    let d = next_through_errors(&consumer).await;
    assert_eq!(d.mention_id(), Some("m3"));
    consumer.ack(&d).await.unwrap();
}

#[tokio::test]
async fn a_message_another_consumer_took_over_is_not_claimed_back() {
    let Some(bus) = bus("steal", 900, 5).await else {
        return;
    };
    let a = bus.redis_consumer(Topic::SummaryRequested).await.unwrap();
    let b = bus.redis_consumer(Topic::SummaryRequested).await.unwrap();
    bus.publish(Topic::SummaryRequested, request("m1"))
        .await
        .unwrap();
    let first = next_through_errors(&a).await;
    // a stalls: its claims stop (as if its process froze) while b takes the message.
    let id = first.id.clone();
    a.working().remove(&id);
    let taken = next_through_errors(&b).await;
    assert_eq!(taken.id, id);
    // a wakes up and still lists it as in work: its next renewal must not take it back.
    a.working().insert(id.clone());
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!a.working().contains(&id), "a gave it up");
    let mut conn = bus.connection();
    let pending: StreamPendingCountReply = redis::cmd("XPENDING")
        .arg(bus.key(Topic::SummaryRequested.name()))
        .arg(Topic::SummaryRequested.group())
        .arg(&id)
        .arg(&id)
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pending.ids[0].consumer, b.name, "b still owns it");
    b.ack(&taken).await.unwrap();
}

#[tokio::test]
async fn a_consumer_that_stalled_past_the_claim_time_does_not_acknowledge() {
    let Some(bus) = bus("stalled-ack", 600, 5).await else {
        return;
    };
    let a = bus.consumer(Topic::SummaryRequested).await.unwrap();
    bus.publish(Topic::SummaryRequested, request("m"))
        .await
        .unwrap();
    let first = next(&a).await;
    // a stops keeping it claimed (as a frozen process does): b takes it over.
    a.failed(&first, "frozen").await.unwrap();
    let b = bus.consumer(Topic::SummaryRequested).await.unwrap();
    let again = next(&b).await;
    assert_eq!(again.id, first.id);
    // a wakes up and acknowledges, or dead-letters: neither touches b's message.
    a.ack(&first).await.unwrap();
    assert!(a.dead_letter(&first, "late").await.is_err());
    let mut conn = bus.connection();
    let pending: StreamPendingCountReply = redis::cmd("XPENDING")
        .arg(bus.key(Topic::SummaryRequested.name()))
        .arg(Topic::SummaryRequested.group())
        .arg("-")
        .arg("+")
        .arg(10)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pending.ids.len(), 1, "still b's to finish");
    assert!(bus.dead_letters().await.unwrap().is_empty());
    b.ack(&again).await.unwrap();
}

#[tokio::test]
async fn a_publish_is_fenced_by_the_leader_lease() {
    let Some(bus) = bus("fenced-publish", 600, 5).await else {
        return;
    };
    let mut conn = bus.connection();
    let lease = bus.key("pkbot:leader");
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("a#1")
        .query_async(&mut conn)
        .await
        .unwrap();
    bus.set_fence("a#1".into());
    bus.publish(Topic::SummaryRequested, request("while-leading"))
        .await
        .unwrap();
    // Another process took the lease: this one's publishes are refused.
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("b#2")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(matches!(
        bus.publish(Topic::SummaryRequested, request("stale")).await,
        Err(BusError::Fenced)
    ));
    let queued = bus
        .queued_mentions(Topic::SummaryRequested)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(queued, HashSet::from(["while-leading".to_owned()]));
}

#[tokio::test]
async fn a_delivery_let_go_untried_does_not_count() {
    let Some(bus) = bus("released", 500, 1).await else {
        return;
    };
    let a = bus.consumer(Topic::SummaryRequested).await.unwrap();
    bus.publish(Topic::SummaryRequested, request("m"))
        .await
        .unwrap();
    let first = next(&a).await;
    // A process that no longer leads lets it go: the next delivery is not its last.
    a.release(&first).await.unwrap();
    let b = bus.consumer(Topic::SummaryRequested).await.unwrap();
    let again = next(&b).await;
    assert_eq!(
        (again.id.as_str(), again.deliveries),
        (first.id.as_str(), 2)
    );
    assert_eq!(
        again.exhausted, None,
        "one delivery of the limit of 1 was tried"
    );
    // A failure that counts: the next delivery is past the limit.
    b.failed(&again, "boom").await.unwrap();
    let last = next(&a).await;
    assert!(last.exhausted.as_deref().unwrap_or("").contains("boom"));
    a.ack(&last).await.unwrap();
}
