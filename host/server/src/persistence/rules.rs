//! The rules of every metadata write, stated once above the backends: the quota rule
//! (also asked before a body is read, by `service::storage`), and the write procedures
//! that run inside one [`WriteTx`] of any backend.
//!
//! Each procedure's changes are all meant to commit, whatever its outcome: a refusal
//! changes nothing but the replay mark, and `Replayed` changes nothing at all (see the
//! replay-mark contract in [`super::metadata`]). So a procedure never needs a rollback,
//! and procedures of several requests could share one transaction (group commit). Each
//! locks the user's row before reading what it decides on, and appends its events last.
//! A blob a procedure leaves unreferenced is retired in the same transaction, never
//! deleted here: the sweep deletes it after the grace period (see `super::blobs`).

use homeserver_protocol::event::EventKind;

use super::metadata::{
    CreateSessionOutcome, DeleteOutcome, EntryRecord, NewEntry, NewEvent, PutOutcome,
    QuotaExceeded, ReplayMark, SessionRecord, SignupOutcome, StoreError, Stored, TokenRedemption,
    UserRecord, WriteTx,
};

/// The quota rule: may `user` replace a value of `old_size` bytes (0 when new) with
/// `new_size` bytes? Returns the usage after the write. A write that does not grow the
/// user's data is always allowed, even over quota (so users can shrink their way back).
/// `default_quota` applies unless the user has an override; 0 means unlimited.
pub fn check_quota(
    user: &UserRecord,
    default_quota: u64,
    old_size: u64,
    new_size: u64,
) -> Result<u64, QuotaExceeded> {
    let quota = user.quota_bytes.unwrap_or(default_quota);
    let used_after = user.used_bytes.saturating_sub(old_size) + new_size;
    if quota != 0 && new_size > old_size && used_after > quota {
        return Err(QuotaExceeded {
            used: user.used_bytes,
            quota,
            needed: new_size - old_size,
        });
    }
    Ok(used_after)
}

/// Records the mark when given; false when it was seen before (the request is a replay).
async fn spend(tx: &mut dyn WriteTx, replay: Option<ReplayMark>) -> Result<bool, StoreError> {
    match replay {
        Some(mark) => tx.insert_replay_mark(mark).await,
        None => Ok(true),
    }
}

pub async fn put(
    tx: &mut dyn WriteTx,
    entry: &NewEntry<'_>,
    replay: Option<ReplayMark>,
) -> Result<PutOutcome, StoreError> {
    if !spend(tx, replay).await? {
        return Ok(PutOutcome::Replayed);
    }
    let Some(user) = tx.lock_user(entry.user).await? else {
        return Ok(PutOutcome::UnknownUser);
    };
    if user.disabled {
        return Ok(PutOutcome::Disabled);
    }
    let old = tx.entry(entry.user, entry.path).await?;
    let old_size = old.as_ref().map_or(0, |o| o.size);
    let used_after = match check_quota(&user, entry.default_quota, old_size, entry.size) {
        Ok(used) => used,
        Err(exceeded) => return Ok(PutOutcome::QuotaExceeded(exceeded)),
    };
    let created_at = old.as_ref().map_or(entry.now, |o| o.created_at);
    tx.put_entry(
        entry.user,
        &EntryRecord {
            path: entry.path.to_owned(),
            stored: entry.stored.clone(),
            size: entry.size,
            content_hash: entry.content_hash,
            created_at,
            updated_at: entry.now,
        },
    )
    .await?;
    tx.set_usage(entry.user, used_after, entry.now).await?;
    if let Some(key) = old.as_ref().and_then(|o| o.stored.blob_key()) {
        tx.retire_blobs(&[key], entry.now).await?;
    }
    tx.append_events(&[NewEvent {
        user: entry.user,
        path: entry.path,
        kind: EventKind::Put,
        content_hash: Some(entry.content_hash),
        created_at: entry.now,
    }])
    .await?;
    Ok(PutOutcome::Committed {
        created_at,
        replaced_blob: old.and_then(|o| o.stored.into_blob_key()),
    })
}

pub async fn delete(
    tx: &mut dyn WriteTx,
    user: &str,
    path: &str,
    now: i64,
    replay: Option<ReplayMark>,
) -> Result<DeleteOutcome, StoreError> {
    if !spend(tx, replay).await? {
        return Ok(DeleteOutcome::Replayed);
    }
    let Some(owner) = tx.lock_user(user).await? else {
        return Ok(DeleteOutcome::UnknownUser);
    };
    if owner.disabled {
        return Ok(DeleteOutcome::Disabled);
    }
    let Some(old) = tx.remove_entry(user, path).await? else {
        return Ok(DeleteOutcome::NotFound);
    };
    tx.set_usage(user, owner.used_bytes.saturating_sub(old.size), now)
        .await?;
    if let Some(key) = old.stored.blob_key() {
        tx.retire_blobs(&[key], now).await?;
    }
    tx.append_events(&[NewEvent {
        user,
        path,
        kind: EventKind::Del,
        content_hash: None,
        created_at: now,
    }])
    .await?;
    Ok(DeleteOutcome::Deleted {
        blob_key: old.stored.into_blob_key(),
    })
}

/// In token mode the token is redeemed in the transaction that creates the user, so
/// two signups racing for one token cannot both win.
pub async fn sign_up(
    tx: &mut dyn WriteTx,
    public_key: &str,
    token: Option<&str>,
    now: i64,
    replay: ReplayMark,
) -> Result<SignupOutcome, StoreError> {
    if !spend(tx, Some(replay)).await? {
        return Ok(SignupOutcome::Replayed);
    }
    if let Some(user) = tx.lock_user(public_key).await? {
        return Ok(SignupOutcome::AlreadyExists {
            created_at: user.created_at,
        });
    }
    if !tx.insert_user(public_key, now, token).await? {
        // A concurrent signup of the same key committed first.
        let created_at = tx
            .lock_user(public_key)
            .await?
            .map_or(now, |u| u.created_at);
        return Ok(SignupOutcome::AlreadyExists { created_at });
    }
    if let Some(token) = token {
        let redeemed = tx.redeem_signup_token(token, public_key, now).await?;
        if redeemed != TokenRedemption::Redeemed {
            // Undo the insert in the same transaction: only the replay mark remains.
            tx.delete_user(public_key).await?;
            return Ok(match redeemed {
                TokenRedemption::Used => SignupOutcome::TokenUsed,
                _ => SignupOutcome::TokenUnknown,
            });
        }
    }
    Ok(SignupOutcome::Created { created_at: now })
}

pub async fn create_session(
    tx: &mut dyn WriteTx,
    session: &SessionRecord,
    replay: ReplayMark,
) -> Result<CreateSessionOutcome, StoreError> {
    if !spend(tx, Some(replay)).await? {
        return Ok(CreateSessionOutcome::Replayed);
    }
    match tx.lock_user(&session.user).await? {
        None => return Ok(CreateSessionOutcome::UnknownUser),
        Some(u) if u.disabled => return Ok(CreateSessionOutcome::Disabled),
        Some(_) => {}
    }
    tx.insert_session(session).await?;
    Ok(CreateSessionOutcome::Created)
}

/// Deletes the user, their sessions and entries, with one DEL event per entry in path
/// order. Returns where each entry's value was (path order), None when the user is
/// unknown.
pub async fn delete_account(
    tx: &mut dyn WriteTx,
    user: &str,
    now: i64,
) -> Result<Option<Vec<Stored>>, StoreError> {
    if tx.lock_user(user).await?.is_none() {
        return Ok(None);
    }
    let removed = tx.remove_all_entries(user).await?;
    tx.delete_user(user).await?;
    let blobs: Vec<&str> = removed.iter().filter_map(|e| e.stored.blob_key()).collect();
    if !blobs.is_empty() {
        tx.retire_blobs(&blobs, now).await?;
    }
    let events: Vec<NewEvent<'_>> = removed
        .iter()
        .map(|e| NewEvent {
            user,
            path: &e.path,
            kind: EventKind::Del,
            content_hash: None,
            created_at: now,
        })
        .collect();
    tx.append_events(&events).await?;
    Ok(Some(removed.into_iter().map(|e| e.stored).collect()))
}

/// Removes an entry whose blob is lost (fsck --repair), if it still points at that
/// blob, as a DELETE would: usage and a DEL event.
pub async fn remove_entry_if_blob(
    tx: &mut dyn WriteTx,
    user: &str,
    path: &str,
    blob_key: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let Some(owner) = tx.lock_user(user).await? else {
        return Ok(false);
    };
    match tx.entry(user, path).await? {
        Some(entry) if entry.stored.blob_key() == Some(blob_key) => {}
        _ => return Ok(false),
    }
    let Some(old) = tx.remove_entry(user, path).await? else {
        return Ok(false);
    };
    tx.set_usage(user, owner.used_bytes.saturating_sub(old.size), now)
        .await?;
    tx.append_events(&[NewEvent {
        user,
        path,
        kind: EventKind::Del,
        content_hash: None,
        created_at: now,
    }])
    .await?;
    Ok(true)
}

/// Sets a user's usage to the sum of their entries (fsck --repair).
pub async fn recompute_usage(
    tx: &mut dyn WriteTx,
    user: &str,
) -> Result<Option<(u64, u64)>, StoreError> {
    let Some(owner) = tx.lock_user(user).await? else {
        return Ok(None);
    };
    let sum = tx.sum_entry_sizes(user).await?;
    if sum != owner.used_bytes {
        tx.set_usage(user, sum, owner.last_activity).await?;
    }
    Ok(Some((owner.used_bytes, sum)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(used: u64, quota: Option<u64>) -> UserRecord {
        UserRecord {
            public_key: "u".into(),
            created_at: 0,
            used_bytes: used,
            quota_bytes: quota,
            disabled: false,
            last_activity: 0,
        }
    }

    #[test]
    fn quota_rule() {
        // Fits exactly.
        assert_eq!(check_quota(&user(60, None), 100, 0, 40), Ok(100));
        // One byte over: `needed` is what the write adds.
        assert_eq!(
            check_quota(&user(60, None), 100, 10, 51),
            Err(QuotaExceeded {
                used: 60,
                quota: 100,
                needed: 41
            })
        );
        // Overwrite counts the difference.
        assert_eq!(check_quota(&user(100, None), 100, 30, 30), Ok(100));
        // Shrinking is allowed even above quota (e.g. after the quota was lowered).
        assert_eq!(check_quota(&user(500, None), 100, 300, 200), Ok(400));
        // 0 = unlimited, and a user's override wins over the default.
        assert_eq!(check_quota(&user(500, None), 0, 0, 1000), Ok(1500));
        assert_eq!(check_quota(&user(500, Some(0)), 100, 0, 1000), Ok(1500));
        assert!(check_quota(&user(0, Some(10)), 0, 0, 11).is_err());
    }
}
