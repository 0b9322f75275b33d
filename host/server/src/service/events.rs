//! Events: the `/events/` feed and `/events-stream` subscriptions.
//!
//! The `events` table is the single source of truth. One tailer task follows it (woken
//! by every local commit, by the store's announcement of another instance's commit
//! (PostgreSQL NOTIFY), and polling as a backstop) into a bounded
//! in-memory ring of recent events, then publishes the new head cursor on a `watch`
//! channel. A subscription walks the cursor line in windows `(pos, head]`: from the ring
//! when the ring still holds the whole window, otherwise straight from the database.
//! Windows are contiguous and `pos` only moves to the end of a window it fully read, so
//! no event is lost or sent twice between the history part and the live part, and a slow
//! consumer never holds anyone up: it is simply served from the database later. A
//! thousand subscribers cost one database query per commit batch, not a thousand.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use homeserver_protocol::event::{Event, encode_content_hash, resource_url};
use homeserver_protocol::query::StreamQuery;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::ServiceError;
use super::entry_cache::EntryCache;
use super::visibility::PublicFilter;
use crate::persistence::MetadataStore;
use crate::persistence::metadata::UserCursor;
use crate::persistence::metadata::{EventQuery, EventRecord, ReverseEventQuery};

/// Events kept in memory for live subscribers.
const RING_CAPACITY: usize = 16 * 1024;
/// Rows per database read.
const BATCH: u32 = 1000;
/// How long the tailer waits for the policy's public answers of new events before it
/// hands the events on without them (each subscriber then asks itself): a slow or
/// stuck guest must not hold up delivery to everyone.
const PUBLIC_ANSWERS_WAIT: Duration = Duration::from_millis(100);
/// How often the tailer looks for commits it was not told about, by default (the
/// configured `storage.events_poll_ms`).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);

pub fn to_wire(e: &EventRecord) -> Event {
    Event {
        kind: e.kind,
        url: resource_url(&e.user, &e.path),
        cursor: e.cursor,
        content_hash: e.content_hash.as_ref().map(encode_content_hash),
    }
}

/// An event as subscribers get it: the record, its SSE frame and whether the public may
/// see it, each made once (by the tailer, for the ring; the answer too, or by the first
/// subscriber that asks when the tailer had none) and shared by every subscriber that
/// sends it.
#[derive(Debug)]
pub struct HubEvent {
    pub record: EventRecord,
    pub frame: Bytes,
    /// The policy's public answer for this event's path, with the policy that gave it:
    /// `generation << 1 | allowed`, 0 while nobody asked.
    public: AtomicU64,
}

impl HubEvent {
    pub fn new(record: EventRecord) -> Arc<Self> {
        let frame = Bytes::from(to_wire(&record).sse_frame());
        Arc::new(Self {
            record,
            frame,
            public: AtomicU64::new(0),
        })
    }

    /// Whether the public may see this event, if the policy `generation` answered.
    fn public_answer(&self, generation: u64) -> Option<bool> {
        let known = self.public.load(Ordering::Relaxed);
        (generation != 0 && known >> 1 == generation).then_some(known & 1 == 1)
    }

    fn remember_public_answer(&self, generation: u64, allowed: bool) {
        if generation != 0 {
            self.public
                .store(generation << 1 | u64::from(allowed), Ordering::Relaxed);
        }
    }
}

impl std::ops::Deref for HubEvent {
    type Target = EventRecord;
    fn deref(&self) -> &EventRecord {
        &self.record
    }
}

/// Asks `filter` whether the public may see each of `events`, and keeps each answer on
/// its event with `generation` (the policy's number, read before asking).
async fn ask_public(
    filter: &PublicFilter,
    generation: u64,
    events: &[&HubEvent],
) -> Result<Vec<bool>, ServiceError> {
    let questions = events
        .iter()
        .map(|e| (e.user.clone(), e.path.clone()))
        .collect();
    let answers = filter.visible(questions).await?;
    for (event, &allowed) in events.iter().zip(&answers) {
        event.remember_public_answer(generation, allowed);
    }
    Ok(answers)
}

struct Ring {
    events: VecDeque<Arc<HubEvent>>,
    /// The ring holds every event with a cursor in `(floor, head]`.
    floor: u64,
}

pub struct EventHub {
    metadata: Arc<dyn MetadataStore>,
    ring: RwLock<Ring>,
    ring_capacity: usize,
    /// Every event the tailer sees invalidates its entry here (writes of any instance).
    entry_cache: Arc<EntryCache>,
    head: watch::Sender<u64>,
    wake: Notify,
    stop: CancellationToken,
    /// How often the tailer looks without being told.
    poll_interval: Duration,
    /// The policy's public answers: the tailer asks them once per new event, before
    /// subscribers wake, so a thousand public subscribers do not ask a thousand times.
    public: std::sync::OnceLock<PublicFilter>,
}

/// What a subscriber asked for.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// The users, each with the cursor to resume after (0 = from the start).
    users: Vec<UserCursor>,
    pub path_prefix: Option<String>,
    pub limit: Option<u32>,
    pub live: bool,
    pub reverse: bool,
    /// The public's view (event streams are public): events of paths the policy hides
    /// are left out before `limit` counts them. `None`: every event.
    pub visible: Option<PublicFilter>,
    /// Once a live subscription has caught up with its history, it hands on a batch at
    /// most once per this interval: the events that come in meanwhile go together in
    /// the next (`http.event_stream_write_interval_ms`; one write each for the stream).
    /// The first after a quiet spell goes at once; history, and the database pages of
    /// a subscriber that fell behind the ring, are never held back.
    pub live_interval: Duration,
}

impl Subscription {
    /// What an event-stream request asks for. The same user twice keeps the lower
    /// cursor, so nothing asked for is skipped. An EventSource reconnecting sends the
    /// last id it saw with the original URL: read forward for one user, the stream
    /// resumes after it (with several users, the per-user cursors in the URL rule).
    pub fn from_query(query: StreamQuery, last_event_id: Option<u64>) -> Self {
        let mut users: Vec<UserCursor> = query
            .users
            .into_iter()
            .map(|(user, cursor)| UserCursor {
                user: user.to_z32(),
                cursor: cursor.unwrap_or(0),
            })
            .collect();
        users.sort_by(|a, b| a.user.cmp(&b.user).then(a.cursor.cmp(&b.cursor)));
        users.dedup_by(|later, first| later.user == first.user);
        if let (Some(id), [only], false) = (last_event_id, users.as_mut_slice(), query.reverse) {
            only.cursor = only.cursor.max(id);
        }
        Self {
            users,
            path_prefix: query.path,
            limit: query.limit,
            live: query.live,
            reverse: query.reverse,
            visible: None,
            live_interval: Duration::ZERO,
        }
    }

    fn matches(&self, e: &EventRecord) -> bool {
        self.users
            .iter()
            .any(|u| u.user == e.user && e.cursor > u.cursor)
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| e.path.starts_with(p))
    }
}

impl EventHub {
    /// A hub whose tailer also polls every `poll_interval` for commits it was not told
    /// about (another instance's, when a notification was lost).
    pub async fn new(
        metadata: Arc<dyn MetadataStore>,
        entry_cache: Arc<EntryCache>,
        stop: CancellationToken,
        poll_interval: Duration,
    ) -> Result<Arc<Self>, ServiceError> {
        Self::build(metadata, entry_cache, stop, RING_CAPACITY, poll_interval).await
    }

    /// Like [`new`](Self::new) with a chosen ring size (tests use a tiny one).
    pub async fn with_ring_capacity(
        metadata: Arc<dyn MetadataStore>,
        entry_cache: Arc<EntryCache>,
        stop: CancellationToken,
        ring_capacity: usize,
    ) -> Result<Arc<Self>, ServiceError> {
        Self::build(
            metadata,
            entry_cache,
            stop,
            ring_capacity,
            DEFAULT_POLL_INTERVAL,
        )
        .await
    }

    async fn build(
        metadata: Arc<dyn MetadataStore>,
        entry_cache: Arc<EntryCache>,
        stop: CancellationToken,
        ring_capacity: usize,
        poll_interval: Duration,
    ) -> Result<Arc<Self>, ServiceError> {
        let head = metadata.latest_cursor().await?;
        Ok(Arc::new(Self {
            metadata,
            ring_capacity,
            entry_cache,
            ring: RwLock::new(Ring {
                events: VecDeque::new(),
                floor: head,
            }),
            head: watch::Sender::new(head),
            wake: Notify::new(),
            stop,
            poll_interval,
            public: std::sync::OnceLock::new(),
        }))
    }

    /// Lets the tailer ask the policy's public answers for new events, once each (what
    /// public subscribers would otherwise each ask). Set once; later calls change nothing.
    pub fn answer_public_questions_with(&self, filter: PublicFilter) {
        let _ = self.public.set(filter);
    }

    /// Asks the public answers of new events once, for every subscriber, and keeps them
    /// on the events. A failure, or no answer within [`PUBLIC_ANSWERS_WAIT`], is only
    /// logged: each subscriber then asks itself (and gets the error, or waits for the
    /// guest, as before).
    async fn answer_public_questions(&self, events: &[Arc<HubEvent>]) {
        let Some(filter) = self.public.get() else {
            return;
        };
        if events.is_empty() || self.subscribers() == 0 {
            return;
        }
        let events: Vec<&HubEvent> = events.iter().map(AsRef::as_ref).collect();
        let asked = ask_public(filter, filter.generation(), &events);
        match tokio::time::timeout(PUBLIC_ANSWERS_WAIT, asked).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "public answers for new events not known yet");
            }
            Err(_) => tracing::debug!("public answers for new events slow: handed on without"),
        }
    }

    /// Tells the tailer that this process committed an event.
    pub fn committed(&self) {
        self.wake.notify_one();
    }

    /// The newest cursor the hub has seen.
    pub fn head(&self) -> u64 {
        *self.head.borrow()
    }

    /// Live subscribers right now.
    pub fn subscribers(&self) -> usize {
        self.head.receiver_count()
    }

    /// Follows the events table until shutdown.
    pub async fn run_tailer(self: Arc<Self>) {
        // Commits of other instances: announced by the store (PostgreSQL NOTIFY) when it
        // can; the poll is a backstop for notifications lost in a reconnect.
        let remote = self.metadata.remote_commits();
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = async {
                    match &remote {
                        Some(remote) => remote.notified().await,
                        None => std::future::pending().await,
                    }
                } => {}
                _ = tokio::time::sleep(self.poll_interval) => {}
            }
            if let Err(e) = self.catch_up().await {
                tracing::warn!(error = %e, "event tailer could not read new events");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    async fn catch_up(&self) -> Result<(), ServiceError> {
        loop {
            let head = self.head();
            let batch = self
                .metadata
                .events(EventQuery {
                    users: &[],
                    after: head,
                    up_to: i64::MAX as u64,
                    path_prefix: None,
                    limit: BATCH,
                })
                .await?;
            let Some(last) = batch.last().map(|e| e.cursor) else {
                return Ok(());
            };
            let full = batch.len() == BATCH as usize;
            for event in &batch {
                self.entry_cache.invalidate_named(&event.user, &event.path);
            }
            let batch: Vec<Arc<HubEvent>> = batch.into_iter().map(HubEvent::new).collect();
            self.answer_public_questions(&batch).await;
            {
                let mut ring = self.ring.write().unwrap_or_else(|p| p.into_inner());
                ring.events.extend(batch);
                while ring.events.len() > self.ring_capacity {
                    if let Some(old) = ring.events.pop_front() {
                        ring.floor = old.cursor;
                    }
                }
            }
            self.head.send_replace(last);
            if !full {
                return Ok(());
            }
        }
    }

    /// The ring's events in `(after, up_to]`, or None when the ring does not hold all
    /// of that window.
    fn ring_window(&self, after: u64, up_to: u64) -> Option<Vec<Arc<HubEvent>>> {
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        let ring_head = ring.events.back().map_or(ring.floor, |e| e.cursor);
        if after < ring.floor || up_to > ring_head {
            return None;
        }
        let start = ring.events.partition_point(|e| e.cursor <= after);
        Some(
            ring.events
                .range(start..)
                .take_while(|e| e.cursor <= up_to)
                .cloned()
                .collect(),
        )
    }

    /// A page of the feed of all events after `after`.
    pub async fn feed(&self, after: u64, limit: u32) -> Result<Vec<EventRecord>, ServiceError> {
        Ok(self
            .metadata
            .events(EventQuery {
                users: &[],
                after,
                up_to: i64::MAX as u64,
                path_prefix: None,
                limit,
            })
            .await?)
    }

    /// A page of the public feed (`GET /events/`): the events after `after` that
    /// `visible` lets the public see, and the cursor to ask from next: the cursor of the
    /// whole page read, so paging goes past events the policy hides (a page may then hold
    /// fewer than `limit`, or none, before the feed's end).
    pub async fn public_feed(
        &self,
        after: u64,
        limit: u32,
        visible: &PublicFilter,
    ) -> Result<(Vec<EventRecord>, u64), ServiceError> {
        let mut events = self.feed(after, limit).await?;
        let next = events.last().map_or(after, |e| e.cursor);
        let answers = visible
            .visible(
                events
                    .iter()
                    .map(|e| (e.user.clone(), e.path.clone()))
                    .collect(),
            )
            .await?;
        let mut answers = answers.into_iter();
        events.retain(|_| answers.next().unwrap_or(false));
        Ok((events, next))
    }

    /// The events of a subscription, in batches, in cursor order (descending when
    /// reversed). Ends at the history's end unless live; a live stream ends at shutdown.
    pub async fn subscribe(
        self: &Arc<Self>,
        subscription: Subscription,
    ) -> Result<
        impl Stream<Item = Result<Vec<Arc<HubEvent>>, ServiceError>> + Send + 'static,
        ServiceError,
    > {
        // The history ends at the newest committed event, which the tailer may not have
        // seen yet (a client that just wrote expects to see its write).
        let end = self.metadata.latest_cursor().await?.max(self.head());
        let state = Cursoring {
            hub: self.clone(),
            pos: subscription
                .users
                .iter()
                .map(|u| u.cursor)
                .min()
                .unwrap_or(0),
            before: i64::MAX as u64,
            end,
            remaining: subscription.limit,
            head_rx: self.head.subscribe(),
            done: false,
            last_live: None,
            subscription,
        };
        Ok(futures_util::stream::unfold(
            state,
            |mut state| async move {
                let next = if state.subscription.reverse {
                    state.next_reverse().await
                } else {
                    state.next_forward().await
                };
                next.map(|batch| (batch, state))
            },
        ))
    }
}

/// A subscription's position on the cursor line.
struct Cursoring {
    hub: Arc<EventHub>,
    subscription: Subscription,
    /// Every event at or below `pos` has been considered (forward).
    pos: u64,
    /// Every event at or above `before` has been considered (reverse).
    before: u64,
    /// The newest event when the subscription started: where history ends.
    end: u64,
    remaining: Option<u32>,
    head_rx: watch::Receiver<u64>,
    done: bool,
    /// When the last live batch (one past the history's end) was handed on.
    last_live: Option<tokio::time::Instant>,
}

impl Cursoring {
    /// What of `batch` the subscriber gets: the events it may see, up to its limit.
    /// A policy that cannot answer ends the subscription with the error.
    async fn take(
        &mut self,
        mut batch: Vec<Arc<HubEvent>>,
    ) -> Result<Vec<Arc<HubEvent>>, ServiceError> {
        if let Some(filter) = &self.subscription.visible {
            // The answer does not depend on the subscriber (all of them are the
            // public): the first to ask about an event keeps the answer on it, with
            // the policy that gave it, for the others.
            let generation = filter.generation();
            let mut shown: Vec<Option<bool>> =
                batch.iter().map(|e| e.public_answer(generation)).collect();
            let open: Vec<usize> = (0..batch.len()).filter(|&i| shown[i].is_none()).collect();
            if !open.is_empty() {
                let asked: Vec<&HubEvent> = open.iter().map(|&i| batch[i].as_ref()).collect();
                match ask_public(filter, generation, &asked).await {
                    Ok(answers) => {
                        for (&i, allowed) in open.iter().zip(answers) {
                            shown[i] = Some(allowed);
                        }
                    }
                    Err(e) => {
                        self.done = true;
                        return Err(e);
                    }
                }
            }
            let mut shown = shown.into_iter();
            batch.retain(|_| shown.next().flatten().unwrap_or(false));
        }
        if let Some(remaining) = &mut self.remaining {
            batch.truncate(*remaining as usize);
            *remaining -= batch.len() as u32;
            if *remaining == 0 {
                self.done = true;
            }
        }
        Ok(batch)
    }

    async fn next_forward(&mut self) -> Option<Result<Vec<Arc<HubEvent>>, ServiceError>> {
        loop {
            if self.done {
                return None;
            }
            let target = if self.subscription.live {
                self.end.max(*self.head_rx.borrow_and_update())
            } else {
                self.end
            };
            // Caught up with the history: live batches are paced by `live_interval`.
            let live = self.subscription.live && self.pos >= self.end;
            if live
                && let Some(at) = self.last_live
                && at.elapsed() < self.subscription.live_interval
            {
                // Not raced against shutdown: the wait is short (at most a second), and
                // a cancellation waiter per wait costs every subscriber a lock on the
                // token's shared list, many times a second under a steady flow.
                tokio::time::sleep_until(at + self.subscription.live_interval).await;
                continue;
            }
            if self.pos >= target {
                if !self.subscription.live {
                    return None;
                }
                tokio::select! {
                    _ = self.hub.stop.cancelled() => return None,
                    changed = self.head_rx.changed() => {
                        if changed.is_err() {
                            return None;
                        }
                    }
                }
                continue;
            }
            // Pages read from the database are a subscriber catching up (it fell behind
            // the ring): they are not paced, only what the ring hands on live is.
            let mut from_ring = true;
            let batch = match self.hub.ring_window(self.pos, target) {
                Some(events) => {
                    self.pos = target;
                    events
                        .into_iter()
                        .filter(|e| self.subscription.matches(e))
                        .collect::<Vec<_>>()
                }
                None => {
                    from_ring = false;
                    let rows = self
                        .hub
                        .metadata
                        .events(EventQuery {
                            users: &self.subscription.users,
                            after: self.pos,
                            up_to: target,
                            path_prefix: self.subscription.path_prefix.as_deref(),
                            limit: BATCH,
                        })
                        .await;
                    let rows = match rows {
                        Ok(rows) => rows,
                        Err(e) => {
                            self.done = true;
                            return Some(Err(e.into()));
                        }
                    };
                    // A full batch may have more behind it: resume after its last row.
                    self.pos = match rows.last() {
                        Some(last) if rows.len() == BATCH as usize => last.cursor,
                        _ => target,
                    };
                    rows.into_iter().map(HubEvent::new).collect()
                }
            };
            match self.take(batch).await {
                Ok(batch) if batch.is_empty() => {}
                Ok(batch) => {
                    if live && from_ring && !self.subscription.live_interval.is_zero() {
                        self.last_live = Some(tokio::time::Instant::now());
                    }
                    return Some(Ok(batch));
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }

    async fn next_reverse(&mut self) -> Option<Result<Vec<Arc<HubEvent>>, ServiceError>> {
        // A batch the filter emptied is not the end: read on.
        loop {
            match self.next_reverse_batch().await? {
                Ok(batch) if batch.is_empty() => {}
                other => return Some(other),
            }
        }
    }

    async fn next_reverse_batch(&mut self) -> Option<Result<Vec<Arc<HubEvent>>, ServiceError>> {
        if self.done {
            return None;
        }
        let rows = self
            .hub
            .metadata
            .events_reverse(ReverseEventQuery {
                users: &self.subscription.users,
                before: self.before,
                path_prefix: self.subscription.path_prefix.as_deref(),
                limit: BATCH,
            })
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                self.done = true;
                return Some(Err(e.into()));
            }
        };
        if rows.len() < BATCH as usize {
            self.done = true;
        }
        match rows.last() {
            Some(last) => self.before = last.cursor,
            None => return None,
        }
        Some(
            self.take(rows.into_iter().map(HubEvent::new).collect())
                .await,
        )
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use crate::persistence::metadata::{NewEntry, ReplayMark, Stored};
    use crate::persistence::{DatabaseUrl, MetadataWrites, open_metadata};

    fn users(query: &str, last_event_id: Option<u64>) -> Vec<(String, u64)> {
        let query = StreamQuery::parse(query).unwrap();
        Subscription::from_query(query, last_event_id)
            .users
            .into_iter()
            .map(|u| (u.user, u.cursor))
            .collect()
    }

    #[test]
    fn a_stream_request_keeps_each_user_once_at_the_lower_cursor() {
        let (a, b) = (
            homeserver_protocol::Keypair::from_seed(&[1; 32]).public_key(),
            homeserver_protocol::Keypair::from_seed(&[2; 32]).public_key(),
        );
        let mut got = users(&format!("user={a}:7&user={b}&user={a}:3"), None);
        got.sort();
        let mut want = vec![(a.to_z32(), 3), (b.to_z32(), 0)];
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn last_event_id_resumes_one_user_read_forward() {
        let (a, b) = (
            homeserver_protocol::Keypair::from_seed(&[1; 32]).public_key(),
            homeserver_protocol::Keypair::from_seed(&[2; 32]).public_key(),
        );
        assert_eq!(users(&format!("user={a}:3"), Some(9)), [(a.to_z32(), 9)]);
        // Never backwards: the URL's later cursor wins.
        assert_eq!(users(&format!("user={a}:12"), Some(9)), [(a.to_z32(), 12)]);
        // Reverse reads and several users keep the URL's cursors.
        assert_eq!(
            users(&format!("user={a}:3&reverse=true"), Some(9)),
            [(a.to_z32(), 3)]
        );
        let mut got = users(&format!("user={a}:3&user={b}:4"), Some(9));
        got.sort();
        let mut want = vec![(a.to_z32(), 3), (b.to_z32(), 4)];
        want.sort();
        assert_eq!(got, want);
    }

    /// A subscription to `user`'s events after `cursor`.
    fn following(
        user: impl Into<String>,
        cursor: u64,
        live: bool,
        visible: Option<PublicFilter>,
    ) -> Subscription {
        Subscription {
            users: vec![UserCursor {
                user: user.into(),
                cursor,
            }],
            path_prefix: None,
            limit: None,
            live,
            reverse: false,
            visible,
            live_interval: Duration::ZERO,
        }
    }

    async fn put(store: &Arc<dyn MetadataStore>, user: &str, path: &str, n: u8) {
        let outcome = store
            .commit_put(
                NewEntry {
                    user,
                    path,
                    stored: Stored::Blob("k".into()),
                    size: 1,
                    content_hash: [n; 32],
                    now: 1,
                    default_quota: 0,
                },
                None,
            )
            .await
            .unwrap();
        assert!(matches!(
            outcome,
            crate::persistence::metadata::PutOutcome::Committed { .. }
        ));
    }

    /// A SQLite store in `dir` with one user (returned).
    async fn store_with_a_user(dir: &std::path::Path) -> (Arc<dyn MetadataStore>, String) {
        let url = DatabaseUrl::parse(&format!("sqlite://{}/hs.db", dir.display())).unwrap();
        let store = open_metadata(&url, &Default::default()).await.unwrap();
        let user = "u".repeat(52);
        store
            .sign_up(
                &user,
                None,
                1,
                ReplayMark {
                    signature_id: [0; 32],
                    expires_at: 0,
                },
            )
            .await
            .unwrap();
        (store, user)
    }

    /// A store with a user, and an event hub over it (stopped by the token).
    async fn hub_with_a_user(
        dir: &std::path::Path,
    ) -> (
        Arc<dyn MetadataStore>,
        String,
        CancellationToken,
        Arc<EventHub>,
    ) {
        let (store, user) = store_with_a_user(dir).await;
        let stop = CancellationToken::new();
        let hub = EventHub::new(
            store.clone(),
            Arc::default(),
            stop.clone(),
            DEFAULT_POLL_INTERVAL,
        )
        .await
        .unwrap();
        (store, user, stop, hub)
    }

    /// Every public subscriber gets the policy's answer for an event, asked once per
    /// event (the first subscriber's answer is kept on it), and asked again once the
    /// policy changed.
    #[tokio::test]
    async fn the_public_answer_is_asked_once_an_event_for_every_subscriber() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let (store, user, stop, hub) = hub_with_a_user(dir.path()).await;
        let tailer = tokio::spawn(hub.clone().run_tailer());
        for (i, path) in ["/pub/a", "/pub/hidden/b", "/pub/c", "/pub/d"]
            .iter()
            .enumerate()
        {
            put(&store, &user, path, i as u8).await;
            hub.committed();
        }
        tokio::time::timeout(Duration::from_secs(5), async {
            while hub.head() < 4 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        let asked = Arc::new(AtomicUsize::new(0));
        let generation = Arc::new(AtomicU64::new(7));
        let filter = {
            let (asked, generation) = (asked.clone(), generation.clone());
            PublicFilter::new(
                Arc::new(move |items: Vec<(String, String)>| {
                    asked.fetch_add(items.len(), Ordering::SeqCst);
                    let answers = items.iter().map(|(_, p)| !p.contains("hidden")).collect();
                    Box::pin(async move { Ok(answers) })
                }),
                Arc::new(move || generation.load(Ordering::SeqCst)),
            )
        };
        let seen = |filter: PublicFilter| {
            let (hub, user) = (hub.clone(), user.clone());
            async move {
                let stream = hub
                    .subscribe(following(user, 0, false, Some(filter)))
                    .await
                    .unwrap();
                let batches: Vec<_> = stream.collect().await;
                batches
                    .into_iter()
                    .flat_map(Result::unwrap)
                    .map(|e| e.path.clone())
                    .collect::<Vec<_>>()
            }
        };
        for _ in 0..3 {
            assert_eq!(seen(filter.clone()).await, ["/pub/a", "/pub/c", "/pub/d"]);
        }
        assert_eq!(asked.load(Ordering::SeqCst), 4, "once an event");
        generation.store(8, Ordering::SeqCst);
        assert_eq!(seen(filter.clone()).await, ["/pub/a", "/pub/c", "/pub/d"]);
        assert_eq!(
            asked.load(Ordering::SeqCst),
            8,
            "asked again of a new policy"
        );
        // No policy number (none loaded): nothing is kept, every subscriber asks.
        generation.store(0, Ordering::SeqCst);
        seen(filter.clone()).await;
        seen(filter.clone()).await;
        assert_eq!(asked.load(Ordering::SeqCst), 16);

        // With live subscribers, the tailer asks about each new event before they
        // wake: they ask nothing themselves.
        generation.store(9, Ordering::SeqCst);
        hub.answer_public_questions_with(filter.clone());
        let mut live = Vec::new();
        for _ in 0..3 {
            live.push(Box::pin(
                hub.subscribe(following(user.clone(), 4, true, Some(filter.clone())))
                    .await
                    .unwrap(),
            ));
        }
        put(&store, &user, "/pub/hidden/e", 5).await;
        put(&store, &user, "/pub/f", 6).await;
        hub.committed();
        tokio::time::timeout(Duration::from_secs(5), async {
            while hub.head() < 6 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        let answers: Vec<_> = hub
            .ring_window(4, 6)
            .unwrap()
            .iter()
            .map(|e| e.public_answer(9))
            .collect();
        assert_eq!(
            answers,
            [Some(false), Some(true)],
            "known before anyone reads"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 18);
        for stream in &mut live {
            let mut paths = Vec::new();
            while paths.is_empty() {
                let batch = tokio::time::timeout(Duration::from_secs(5), stream.next())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                paths.extend(batch.iter().map(|e| e.path.clone()));
            }
            assert_eq!(paths, ["/pub/f"]);
        }
        assert_eq!(
            asked.load(Ordering::SeqCst),
            18,
            "the tailer asked, once an event"
        );
        stop.cancel();
        tailer.await.unwrap();
    }

    /// A policy that does not answer in time does not hold up delivery: the tailer
    /// hands the events on without its answers.
    #[tokio::test]
    async fn a_slow_policy_does_not_hold_up_the_tailer() {
        let dir = tempfile::tempdir().unwrap();
        let (store, user, stop, hub) = hub_with_a_user(dir.path()).await;
        hub.answer_public_questions_with(PublicFilter::new(
            Arc::new(|items: Vec<(String, String)>| {
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok(vec![true; items.len()])
                })
            }),
            Arc::new(|| 1),
        ));
        let tailer = tokio::spawn(hub.clone().run_tailer());
        let mut stream = Box::pin(
            hub.subscribe(following(user.clone(), 0, true, None))
                .await
                .unwrap(),
        );
        put(&store, &user, "/pub/a", 1).await;
        hub.committed();
        let batch = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("delivered without waiting for the policy")
            .unwrap()
            .unwrap();
        assert_eq!(batch[0].path, "/pub/a");
        assert_eq!(batch[0].public_answer(1), None);
        stop.cancel();
        tailer.await.unwrap();
    }

    /// A subscriber that falls further behind than the ring holds is served from the
    /// database: it still gets every event once, in order.
    #[tokio::test]
    async fn slow_subscriber_catches_up_from_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let (store, user) = store_with_a_user(dir.path()).await;
        let stop = CancellationToken::new();
        let hub = EventHub::with_ring_capacity(store.clone(), Arc::default(), stop.clone(), 8)
            .await
            .unwrap();
        let tailer = tokio::spawn(hub.clone().run_tailer());
        let mut stream = Box::pin(
            hub.subscribe(following(user.clone(), 0, true, None))
                .await
                .unwrap(),
        );
        // 100 commits while the subscriber reads nothing: the ring keeps only 8.
        for i in 0..100u8 {
            put(&store, &user, &format!("/pub/{i}"), i).await;
            hub.committed();
        }
        tokio::time::timeout(Duration::from_secs(5), async {
            while hub.head() < 100 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        let mut cursors = Vec::new();
        while cursors.len() < 100 {
            let batch = tokio::time::timeout(Duration::from_secs(5), stream.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            cursors.extend(batch.iter().map(|e| e.cursor));
        }
        assert_eq!(cursors, (1..=100).collect::<Vec<u64>>());
        // And live again after catching up.
        put(&store, &user, "/pub/late", 200).await;
        hub.committed();
        let batch = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(batch[0].cursor, 101);
        stop.cancel();
        assert!(stream.next().await.is_none(), "shutdown ends live streams");
        tailer.await.unwrap();
    }
}
