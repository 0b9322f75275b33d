//! The bot's own HTTP endpoints: `/api/health` (database, bus, AI provider, last mention
//! poll, workers, as JSON), `/api/health/ready` (200 once the bot can answer: database
//! up, signed up on its homeserver, a poll done), `/api/health/live` (200 while the
//! process runs) and `/metrics` (Prometheus text).
//!
//! `/api/health` answers 200 when everything is ok and 503 when something the bot
//! needs is down (`status` says `ok`, `degraded` or `down`). `role` says what the
//! process does (`all`, `leader`, `standby`, `summary-worker`, `factcheck-worker`);
//! polls and the sign-up are expected only of a process that polls.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::context::BotContext;
use crate::store::{ActionType, now_secs};

pub fn router(ctx: Arc<BotContext>) -> Router {
    Router::new()
        .route("/api/health", get(health))
        .route("/api/health/ready", get(ready))
        .route("/api/health/live", get(live))
        .route("/metrics", get(metrics))
        .with_state(ctx)
}

/// The AI and search providers, `degraded` while the last call to one failed (the
/// bot keeps answering what it can; failed actions are tried again).
fn providers(ctx: &BotContext) -> Value {
    let calls = ctx.status.providers();
    let last = |name: &str| {
        calls
            .get(name)
            .map(|(at, error)| json!({"at": at, "ok": error.is_none(), "error": error}))
    };
    let ai_name = ctx.ai_name();
    let search_name = ctx.search.as_ref().map(|s| s.name().to_owned());
    let failing = calls.iter().any(|(name, (_, error))| {
        error.is_some() && (*name == ai_name || Some(name) == search_name.as_ref())
    });
    json!({
        "status": if failing { "degraded" } else { "ok" },
        "name": ai_name,
        "mode": if ctx.ai.is_some() { "ai" } else { "local" },
        "lastCall": last(&ai_name),
        "search": search_name,
        "searchLastCall": search_name.as_deref().and_then(last),
    })
}

/// A poll older than this many poll intervals (and a minute) counts as stalled.
const STALE_POLLS: u64 = 3;

async fn health(State(ctx): State<Arc<BotContext>>) -> Response {
    let database = match ctx.store.ping().await {
        Ok(()) => json!({"status": "ok"}),
        Err(e) => json!({"status": "down", "error": e.to_string()}),
    };
    let database_ok = database["status"] == "ok";
    let counts: Value = match ctx.store.mention_counts().await {
        Ok(rows) => rows.into_iter().map(|(s, n)| (s, json!(n))).collect(),
        Err(_) => Value::Null,
    };
    let (last_poll, poll_error) = ctx.status.last_poll();
    let now = now_secs();
    let stale_after =
        i64::try_from(ctx.config.poller.interval_ms / 1000 * STALE_POLLS + 60).unwrap_or(i64::MAX);
    let polls = ctx.status.polls();
    // A worker or a standby neither polls nor publishes: nothing to expect of either.
    let poll_ok = !polls || last_poll.is_some_and(|at| now - at <= stale_after);
    let signed_up = ctx
        .status
        .signed_up
        .load(std::sync::atomic::Ordering::Relaxed);
    let bus = match ctx.bus.ping().await {
        Ok(()) => json!({"status": "ok", "kind": ctx.bus.kind()}),
        Err(e) => json!({"status": "down", "kind": ctx.bus.kind(), "error": e.to_string()}),
    };
    let bus_ok = bus["status"] == "ok";
    let providers = providers(&ctx);
    let status = if !database_ok || !bus_ok {
        "down"
    } else if poll_ok && (signed_up || !polls) && providers["status"] == "ok" {
        "ok"
    } else {
        "degraded"
    };
    let workers = &ctx.config.workers;
    let body = json!({
        "status": status,
        "botPubky": ctx.key.to_z32(),
        "role": ctx.status.role(),
        "database": database,
        "bus": bus,
        "aiProvider": providers,
        "homeserver": {"url": ctx.config.homeserver.url, "signedUp": signed_up},
        "index": {"kind": ctx.index.kind()},
        "lastPoll": {
            "at": last_poll,
            "secondsAgo": last_poll.map(|at| now - at),
            "error": poll_error,
        },
        "workers": {
            "summary": {
                "concurrency": workers.summary_concurrency,
                "busy": ctx.status.busy_count(ActionType::Summary),
            },
            "factcheck": {
                "concurrency": workers.factcheck_concurrency,
                "busy": ctx.status.busy_count(ActionType::Factcheck),
            },
        },
        "mentions": counts,
    });
    let code = if status == "down" {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, Json(body)).into_response()
}

async fn ready(State(ctx): State<Arc<BotContext>>) -> Response {
    let signed_up = ctx
        .status
        .signed_up
        .load(std::sync::atomic::Ordering::Relaxed);
    // Workers and a standby are ready with their database and bus.
    let polls = ctx.status.polls();
    let polled = !polls || ctx.status.last_poll().0.is_some();
    let signed_up = signed_up || !polls;
    let database = ctx.store.ping().await.is_ok();
    let bus = ctx.bus.ping().await.is_ok();
    if signed_up && polled && database && bus {
        (StatusCode::OK, Json(json!({"status": "ready"}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "not ready",
                "signedUp": signed_up,
                "polled": polled,
                "database": database,
                "bus": bus,
            })),
        )
            .into_response()
    }
}

async fn live() -> Response {
    (StatusCode::OK, Json(json!({"status": "alive"}))).into_response()
}

async fn metrics(State(ctx): State<Arc<BotContext>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        ctx.metrics.render(),
    )
        .into_response()
}
