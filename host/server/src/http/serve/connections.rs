//! The open connections of one listener: how many there may be, what each is doing, and
//! which one gives way when the limit is reached.
//!
//! Every connection is registered while it is open, with the number of requests it has
//! in flight, how many it has served, and when it was last active. At the limit a new
//! connection takes the place of the one idle the longest (no request in flight: a
//! client that connected and never spoke, or a kept-alive connection between requests),
//! as nginx reuses idle keep-alive connections; only when every connection is busy is
//! the new one refused. So clients that open connections and send nothing cannot keep
//! anyone else out, however many they open.
//!
//! Busy connections (a stream held open, an upload trickling in) cannot be taken back,
//! so one address may hold at most `max_per_ip` connections (trusted proxies, which
//! carry many clients, are exempt): at that limit a new connection from it takes the
//! place of its own longest-idle one, or is refused. A client must then use many
//! addresses to fill the server.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio_util::sync::CancellationToken;

/// The registry of one listener's connections.
pub struct Connections {
    max: usize,
    /// Connections one address may hold (those in `exempt` excepted).
    max_per_ip: usize,
    exempt: Arc<HashSet<IpAddr>>,
    gauge: prometheus::IntGauge,
    /// The time origin of `last_active` stamps.
    origin: Instant,
    /// The listener's stop; each connection's close token is a child of it.
    stop: CancellationToken,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<ConnectionState>>>,
}

/// What the registry knows of one connection, shared with its task.
pub struct ConnectionState {
    origin: Instant,
    ip: IpAddr,
    in_flight: AtomicUsize,
    served: AtomicU64,
    /// Milliseconds since the registry's origin.
    last_active_ms: AtomicU64,
    /// Cancelled when the connection must close: to make room, or because the listener
    /// stops (a child of its stop token, so a connection's task waits on one token, not
    /// two, at each wake).
    close: CancellationToken,
}

impl ConnectionState {
    fn new(origin: Instant, ip: IpAddr, close: CancellationToken) -> Self {
        let state = Self {
            origin,
            ip,
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            last_active_ms: AtomicU64::new(0),
            close,
        };
        state.touch();
        state
    }

    fn touch(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_active_ms.store(ms, Ordering::Relaxed);
    }

    /// Marks a request as started; the guard marks it finished when dropped (after its
    /// response body was sent in full, or abandoned).
    pub fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.fetch_add(1, Ordering::Relaxed);
        self.touch();
        InFlight(self.clone())
    }

    /// Whether no request is in flight.
    pub fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Requests this connection has started so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// How long since a request started or finished (or the connection opened).
    pub fn idle_for(&self) -> Duration {
        let now = self.origin.elapsed();
        let last = Duration::from_millis(self.last_active_ms.load(Ordering::Relaxed));
        now.saturating_sub(last)
    }

    /// Cancelled when this connection must close: the registry wants its place, or the
    /// listener stops (see its stop token to tell which).
    pub fn told_to_close(&self) -> &CancellationToken {
        &self.close
    }
}

/// A request in flight on a connection.
pub struct InFlight(Arc<ConnectionState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's place in the registry, given up when dropped.
pub struct Admitted {
    registry: Arc<Connections>,
    id: u64,
    pub state: Arc<ConnectionState>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.registry.lock();
        open.remove(&self.id);
        self.registry.gauge.set(open.len() as i64);
    }
}

/// Per-address limits of a registry.
#[derive(Debug, Clone, Default)]
pub struct PerIpLimit {
    /// Connections one address may hold; 0 = no limit of its own.
    pub max: usize,
    /// Addresses without that limit (reverse proxies).
    pub exempt: Arc<HashSet<IpAddr>>,
}

impl Connections {
    /// A registry of at most `max` connections (and `per_ip.max` from one address)
    /// whose count `gauge` shows, for a listener that `stop` stops.
    pub fn new(
        max: usize,
        per_ip: PerIpLimit,
        gauge: prometheus::IntGauge,
        stop: &CancellationToken,
    ) -> Arc<Self> {
        let max = max.max(1);
        Arc::new(Self {
            max,
            max_per_ip: if per_ip.max == 0 { max } else { per_ip.max },
            exempt: per_ip.exempt,
            gauge,
            origin: Instant::now(),
            stop: stop.clone(),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<ConnectionState>>> {
        // A panic while holding this lock leaves the map intact (inserts and removes
        // only), so a poisoned lock is still usable.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open connections.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Registers a new connection from `ip`. At the address's limit its own
    /// longest-idle connection is told to close and gives its place; at the listener's
    /// limit, the longest-idle of all. `None` when every candidate is busy.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Admitted> {
        let mut open = self.lock();
        if !self.exempt.contains(&ip)
            && open.values().filter(|c| c.ip == ip).count() >= self.max_per_ip
        {
            evict_longest_idle(&mut open, |c| c.ip == ip)?;
        }
        if open.len() >= self.max {
            evict_longest_idle(&mut open, |_| true)?;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnectionState::new(
            self.origin,
            ip,
            self.stop.child_token(),
        ));
        open.insert(id, state.clone());
        self.gauge.set(open.len() as i64);
        Some(Admitted {
            registry: self.clone(),
            id,
            state,
        })
    }
}

/// Tells the longest-idle connection among those `which` selects to close and forgets
/// it; None when all of them are busy.
fn evict_longest_idle(
    open: &mut HashMap<u64, Arc<ConnectionState>>,
    which: impl Fn(&ConnectionState) -> bool,
) -> Option<()> {
    let victim = open
        .iter()
        .filter(|(_, c)| which(c) && c.is_idle() && !c.close.is_cancelled())
        .max_by_key(|(_, c)| c.idle_for())
        .map(|(id, _)| *id)?;
    if let Some(state) = open.remove(&victim) {
        state.close.cancel();
    }
    Some(())
}

/// A response body that keeps its request counted as in flight until the body is sent
/// in full (an event stream stays in flight while it is open).
pub struct TrackedBody<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B> TrackedBody<B> {
    pub fn new(inner: B, in_flight: InFlight) -> Self {
        Self {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl<B> Body for TrackedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauge() -> prometheus::IntGauge {
        prometheus::IntGauge::new("open", "test").unwrap()
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));

    #[test]
    fn admits_up_to_the_limit_then_evicts_the_longest_idle() {
        let registry =
            Connections::new(2, PerIpLimit::default(), gauge(), &CancellationToken::new());
        let first = registry.admit(A).expect("room");
        std::thread::sleep(Duration::from_millis(5));
        let second = registry.admit(A).expect("room");
        assert_eq!(registry.len(), 2);
        assert_eq!(registry.gauge.get(), 2);

        let third = registry.admit(A).expect("an idle connection gives way");
        assert!(
            first.state.told_to_close().is_cancelled(),
            "the oldest idle goes"
        );
        assert!(!second.state.told_to_close().is_cancelled());
        assert_eq!(registry.len(), 2);
        drop(first); // its task ends; the registry already forgot it
        assert_eq!(registry.len(), 2);
        drop((second, third));
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn busy_connections_are_never_evicted() {
        let registry =
            Connections::new(1, PerIpLimit::default(), gauge(), &CancellationToken::new());
        let busy = registry.admit(A).expect("room");
        let request = busy.state.request_started();
        assert!(registry.admit(A).is_none(), "the only connection is busy");
        assert!(!busy.state.told_to_close().is_cancelled());
        drop(request);
        assert!(busy.state.is_idle());
        assert_eq!(busy.state.served(), 1);
        let _next = registry.admit(A).expect("idle again");
        assert!(busy.state.told_to_close().is_cancelled());
    }

    #[test]
    fn one_address_cannot_hold_more_than_its_share() {
        let per_ip = PerIpLimit {
            max: 2,
            exempt: Arc::new(HashSet::from([B])),
        };
        let registry = Connections::new(10, per_ip, gauge(), &CancellationToken::new());
        let first = registry.admit(A).expect("room");
        let second = registry.admit(A).expect("room");
        let (_r1, _r2) = (
            first.state.request_started(),
            second.state.request_started(),
        );
        assert!(registry.admit(A).is_none(), "A's connections are all busy");
        let _other = registry.admit(B).expect("another address is not held back");
        let _more: Vec<_> = (0..5)
            .map(|_| registry.admit(B).expect("B is exempt"))
            .collect();
        assert_eq!(registry.len(), 8);

        let idle = registry
            .admit(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
            .expect("room");
        drop(idle);
        drop(_r1);
        let _third = registry.admit(A).expect("A's idle connection gives way");
        assert!(first.state.told_to_close().is_cancelled());
        assert!(!second.state.told_to_close().is_cancelled());
    }
}
