//! PostgreSQL's commit announcements: every instance LISTENs on the channel the write
//! transactions NOTIFY when they commit events, and wakes its event tailer at once.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::Notify;

use super::dialect::EVENTS_CHANNEL;
use crate::persistence::metadata::StoreError;

/// Starts following the announcements of the database `url` names; `wake` is notified
/// for each (and after every reconnect).
pub(super) fn spawn(
    url: &str,
    wake: Arc<Notify>,
) -> Result<tokio::task::JoinHandle<()>, StoreError> {
    let options = PgConnectOptions::from_str(url)
        // The parser's message does not echo the URL (no password in logs).
        .map_err(|e| StoreError::Internal(format!("database url: {e}")))?
        .application_name("homeserver");
    // The listener's own connection, made when it first connects.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    Ok(tokio::spawn(listen(pool, wake)))
}

/// Follows `NOTIFY hs_events` and wakes the event tailer. sqlx's listener reconnects by
/// itself; after a reconnect it wakes the tailer too (notifications sent meanwhile
/// were lost, and the tailer's read catches up on them).
async fn listen(pool: PgPool, wake: Arc<Notify>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "event LISTEN connection failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(EVENTS_CHANNEL).await {
            tracing::debug!(error = %e, "LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        wake.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(_)) => wake.notify_one(),
                // The connection was lost; the next try_recv reconnects.
                Ok(None) => wake.notify_one(),
                Err(e) => {
                    tracing::debug!(error = %e, "event LISTEN connection lost; reconnecting");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    break;
                }
            }
        }
    }
}
