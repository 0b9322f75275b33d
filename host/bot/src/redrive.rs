//! `pkbot redrive --status processing --older-than 10m`: sends again the mentions that
//! have been stuck in a state for a while, as when Redis lost its data (restarted
//! without persistence) and with it the messages in flight: nothing else would ever
//! move them on.
//!
//! A `pending` mention goes back to the router (`mention.received.v1`); a `processing`
//! one to where its routing decision sends it: its action's workers (which hand on the
//! reply of an action that succeeded before) or, for a notice, the publisher. Each
//! stage finds its own earlier answer, and a reply reserved before is the one that is
//! published, so a redrive never answers twice. Mentions whose message is still on a
//! stream are left alone (the bus will deliver it), so running it when nothing was lost
//! does nothing.

use std::collections::HashSet;
use std::time::Duration;

use crate::bus::{Bus, MentionReceived, Message, RedisBus, Topic};
use crate::dlq::DlqError;
use crate::store::{Mention, MentionStatus, Store, now_secs};

/// One mention sent again, and where.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Redriven {
    pub mention_id: String,
    pub status: &'static str,
    pub stream: &'static str,
}

/// Parses `90s`, `10m`, `2h`, `1d` (or plain seconds).
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |at| text.split_at(at));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not an age such as 90s, 10m, 2h or 1d"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(format!("`{text}`: the unit is one of s, m, h, d")),
    };
    Ok(Duration::from_secs(secs))
}

/// Sends again the mentions in `status` whose state changed `older_than` ago or more
/// (at most `limit`), on `bus`; returns them. Only `pending` and `processing` can be
/// stuck.
pub async fn redrive(
    store: &Store,
    bus: &RedisBus,
    status: MentionStatus,
    older_than: Duration,
    limit: u32,
) -> Result<Vec<Redriven>, DlqError> {
    if !matches!(status, MentionStatus::Pending | MentionStatus::Processing) {
        return Err(DlqError::Usage(format!(
            "only pending and processing mentions are re-driven, not {}",
            status.as_str()
        )));
    }
    let by = now_secs().saturating_sub(i64::try_from(older_than.as_secs()).unwrap_or(i64::MAX));
    let stuck = store.mentions_in_state(status, by, limit).await?;
    let queued = queued(bus).await?;
    let mut sent = Vec::new();
    for mention in stuck {
        if queued.contains(&mention.id) {
            continue;
        }
        let Some((topic, message)) = next(store, &mention).await? else {
            continue;
        };
        bus.publish(topic, message).await.map_err(bus_error)?;
        sent.push(Redriven {
            mention_id: mention.id,
            status: status.as_str(),
            stream: topic.name(),
        });
    }
    Ok(sent)
}

/// The mentions with a message on any stage's stream now.
async fn queued(bus: &RedisBus) -> Result<HashSet<String>, DlqError> {
    let mut all = HashSet::new();
    for topic in [
        Topic::MentionReceived,
        Topic::SummaryRequested,
        Topic::FactcheckRequested,
        Topic::ActionCompleted,
    ] {
        all.extend(
            bus.queued_mentions(topic)
                .await
                .map_err(bus_error)?
                .unwrap_or_default(),
        );
    }
    Ok(all)
}

/// Where a stuck mention goes now.
async fn next(store: &Store, m: &Mention) -> Result<Option<(Topic, Message)>, DlqError> {
    if m.status == MentionStatus::Processing
        && let Some(decision) = store.routing_decision(&m.id).await?
    {
        return Ok(crate::router::next_message(&m.id, &decision));
    }
    if m.status == MentionStatus::Processing {
        store
            .set_mention_status(&m.id, MentionStatus::Pending, None)
            .await?;
    }
    Ok(Some((
        Topic::MentionReceived,
        Message::MentionReceived(MentionReceived {
            mention_id: m.id.clone(),
            author_pubky: m.author.clone(),
            post_uri: m.post_uri.clone(),
        }),
    )))
}

fn bus_error(source: crate::bus::BusError) -> DlqError {
    DlqError::Bus {
        url: "redis".into(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_operators_write_them() {
        assert_eq!(parse_age("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_age("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse_age("ten minutes").is_err());
        assert!(parse_age("5w").is_err());
    }
}
