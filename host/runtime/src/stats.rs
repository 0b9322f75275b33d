//! Call counters and a latency histogram per slot and per module: lock-free atomics,
//! cheap enough for every call, read by the server's metrics endpoint and admin API
//! through [`SlotStats`] and [`ModuleStats`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::error::{GuestFailure, TrapKind};
use crate::types::Slot;

/// Upper bounds of the latency buckets, in seconds (a Prometheus histogram's `le`).
pub const LATENCY_BUCKETS: [f64; 14] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 2.5e-2, 0.1, 1.0,
];

/// A snapshot of one slot's counters (or of one module's: see [`ModuleStats`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotStats {
    pub slot: Slot,
    /// Calls made, failed or not.
    pub calls: u64,
    /// Calls whose caller stopped waiting before they ended (a client gone): counted
    /// in `calls` and the latency up to that moment; their instance is dropped.
    pub cancelled: u64,
    /// Calls that yielded the safe default, by reason.
    pub failures: FailureCounts,
    /// Fresh instances created (the rest of the calls reused one).
    pub instantiations: u64,
    /// Successful and failed loads of a new module or new data.
    pub reloads: u64,
    pub reload_failures: u64,
    pub latency: LatencyHistogram,
    /// The most linear memory any instance of the slot was given, in bytes.
    pub memory_high_water_bytes: u64,
    /// Epoch ticks (1 ms each) at which a call was running: an estimate of the guest
    /// CPU time the slot used, in ms (a call of a few µs is seen at a tick rarely, in
    /// proportion to its length).
    pub epoch_ticks: u64,
    /// Time calls slept because guest calls had used up their share of the cores
    /// (`policies.guest_cpu_share`).
    pub throttled_seconds: f64,
}

/// The figures of one module a slot has served in this process, told apart by its
/// BLAKE3: what a hot swap changed shows as the new module's figures beside the old
/// one's. Swapping a module back in carries on with its figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleStats {
    /// The module's BLAKE3, hex.
    pub blake3: String,
    /// Where it was last loaded from (a file in `policies.dir`, or `builtin`).
    pub source: String,
    /// When it was last swapped in (Unix seconds).
    pub loaded_at: u64,
    /// Whether it is the slot's module now.
    pub serving: bool,
    /// Its calls since it was first swapped in (`reloads`: the times it was swapped in,
    /// `reload_failures` 0; `unavailable` is the slot's alone: no module was there).
    pub stats: SlotStats,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FailureCounts {
    pub unavailable: u64,
    /// Calls that found every one of the slot's call permits taken for
    /// `policies.guest_wait_ms`.
    pub busy: u64,
    pub instantiate: u64,
    pub timeout: u64,
    pub memory: u64,
    /// The guest panicked.
    pub panic: u64,
    /// The guest called `exit`.
    pub exit: u64,
    /// Any other trap (a stack overflow, an access out of bounds, ...).
    pub trap: u64,
}

impl FailureCounts {
    pub fn total(&self) -> u64 {
        self.by_reason().iter().map(|(_, n)| n).sum()
    }

    /// Each count with its metrics label (`GuestFailure::kind`).
    pub fn by_reason(&self) -> [(&'static str, u64); 8] {
        [
            ("unavailable", self.unavailable),
            ("busy", self.busy),
            ("instantiate", self.instantiate),
            ("timeout", self.timeout),
            ("memory", self.memory),
            ("panic", self.panic),
            ("exit", self.exit),
            ("trap", self.trap),
        ]
    }
}

/// Call latency (including instantiation when no warm instance was free).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyHistogram {
    /// Calls per bucket of [`LATENCY_BUCKETS`] (not cumulative); one more entry at the
    /// end counts calls slower than the last bound.
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl LatencyHistogram {
    /// The upper bound (seconds) of the bucket that holds the `q`-quantile call
    /// (`0 < q <= 1`): the call at that rank took at most this long. None without calls,
    /// or when it is slower than the last bound.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        self.cumulative()
            .into_iter()
            .find(|&(_, below)| below >= rank)
            .map(|(bound, _)| bound)
    }

    /// Cumulative counts per bound, as Prometheus `_bucket{le=..}` wants them (the
    /// `+Inf` bucket is `count`).
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        LATENCY_BUCKETS
            .iter()
            .zip(&self.counts)
            .map(|(&bound, &n)| {
                total += n;
                (bound, total)
            })
            .collect()
    }
}

#[derive(Debug, Default)]
pub(crate) struct StatsCell {
    calls: AtomicU64,
    cancelled: AtomicU64,
    unavailable: AtomicU64,
    busy: AtomicU64,
    instantiate: AtomicU64,
    timeout: AtomicU64,
    memory: AtomicU64,
    panic: AtomicU64,
    exit: AtomicU64,
    trap: AtomicU64,
    memory_peak: AtomicU64,
    ticks: AtomicU64,
    throttled_nanos: AtomicU64,
    instantiations: AtomicU64,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl StatsCell {
    /// A call dropped before it ended, `elapsed` after it started.
    pub(crate) fn record_cancelled(&self, elapsed: Duration) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
        self.record_call(elapsed, None);
    }

    pub(crate) fn record_call(&self, elapsed: Duration, failure: Option<&GuestFailure>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if let Some(failure) = failure {
            let counter = match failure {
                GuestFailure::Unavailable { .. } => &self.unavailable,
                GuestFailure::Busy { .. } => &self.busy,
                GuestFailure::Instantiate { .. } => &self.instantiate,
                GuestFailure::Timeout { .. } => &self.timeout,
                GuestFailure::MemoryLimit { .. } => &self.memory,
                GuestFailure::Trap { kind, .. } => match kind {
                    TrapKind::Panic => &self.panic,
                    TrapKind::Exit => &self.exit,
                    TrapKind::Other => &self.trap,
                },
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An instance's memory high-water mark after a call.
    pub(crate) fn record_memory(&self, bytes: usize) {
        self.memory_peak
            .fetch_max(u64::try_from(bytes).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The epoch ticks a call ran through and the time it slept for the share (most
    /// calls have neither: two loads and no store).
    pub(crate) fn record_ticks(&self, ticks: u64, throttled: Duration) {
        if ticks > 0 {
            self.ticks.fetch_add(ticks, Ordering::Relaxed);
        }
        if !throttled.is_zero() {
            let nanos = u64::try_from(throttled.as_nanos()).unwrap_or(u64::MAX);
            self.throttled_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
    }

    pub(crate) fn record_instantiation(&self) {
        self.instantiations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_reload(&self, ok: bool) {
        let counter = if ok {
            &self.reloads
        } else {
            &self.reload_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, slot: Slot) -> SlotStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counts: Vec<u64> = self.buckets.iter().map(load).collect();
        SlotStats {
            slot,
            calls: load(&self.calls),
            cancelled: load(&self.cancelled),
            failures: FailureCounts {
                unavailable: load(&self.unavailable),
                busy: load(&self.busy),
                instantiate: load(&self.instantiate),
                timeout: load(&self.timeout),
                memory: load(&self.memory),
                panic: load(&self.panic),
                exit: load(&self.exit),
                trap: load(&self.trap),
            },
            instantiations: load(&self.instantiations),
            reloads: load(&self.reloads),
            reload_failures: load(&self.reload_failures),
            latency: LatencyHistogram {
                count: counts.iter().sum(),
                counts,
                sum_seconds: load(&self.sum_nanos) as f64 / 1e9,
            },
            memory_high_water_bytes: load(&self.memory_peak),
            epoch_ticks: load(&self.ticks),
            throttled_seconds: load(&self.throttled_nanos) as f64 / 1e9,
        }
    }
}

/// Where a call is counted: its slot's cell, and the cell of the module that serves it
/// when the runtime keeps one (tools' calls and a module's test call at load have none).
#[derive(Clone, Copy)]
pub(crate) struct Tally<'a> {
    pub slot: &'a StatsCell,
    pub module: Option<&'a StatsCell>,
}

impl Tally<'_> {
    fn each(&self, record: impl Fn(&StatsCell)) {
        record(self.slot);
        if let Some(module) = self.module {
            record(module);
        }
    }

    pub(crate) fn call(&self, elapsed: Duration, failure: Option<&GuestFailure>) {
        self.each(|cell| cell.record_call(elapsed, failure));
    }

    pub(crate) fn cancelled(&self, elapsed: Duration) {
        self.each(|cell| cell.record_cancelled(elapsed));
    }

    pub(crate) fn instantiation(&self) {
        self.each(StatsCell::record_instantiation);
    }

    pub(crate) fn memory(&self, bytes: usize) {
        self.each(|cell| cell.record_memory(bytes));
    }

    pub(crate) fn ticks(&self, ticks: u64, throttled: Duration) {
        self.each(|cell| cell.record_ticks(ticks, throttled));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets() {
        let cell = StatsCell::default();
        cell.record_call(Duration::from_nanos(800), None);
        cell.record_call(Duration::from_micros(30), None);
        cell.record_call(
            Duration::from_secs(2),
            Some(&GuestFailure::Timeout {
                slot: Slot::SafetyFilter,
                deadline: Duration::from_millis(50),
            }),
        );
        let s = cell.snapshot(Slot::SafetyFilter);
        assert_eq!(s.calls, 3);
        assert_eq!(s.failures.timeout, 1);
        assert_eq!(s.latency.count, 3);
        let cumulative = s.latency.cumulative();
        assert_eq!(cumulative[0], (1e-6, 1));
        assert_eq!(cumulative[5], (5e-5, 2));
        assert_eq!(cumulative.last().map(|c| c.1), Some(2));
        assert_eq!(s.latency.quantile_bound(0.3), Some(1e-6));
        assert_eq!(s.latency.quantile_bound(0.5), Some(5e-5));
        assert_eq!(
            s.latency.quantile_bound(0.99),
            None,
            "slower than the last bound"
        );
        assert_eq!(s.failures.total(), 1);
    }

    #[test]
    fn traps_are_counted_by_kind_and_memory_by_its_high_water() {
        let cell = StatsCell::default();
        assert_eq!(
            cell.snapshot(Slot::CapabilityPolicy)
                .latency
                .quantile_bound(0.5),
            None
        );
        for kind in [
            TrapKind::Panic,
            TrapKind::Exit,
            TrapKind::Other,
            TrapKind::Panic,
        ] {
            let failure = GuestFailure::Trap {
                slot: Slot::CapabilityPolicy,
                message: String::new(),
                kind,
            };
            cell.record_call(Duration::from_micros(3), Some(&failure));
        }
        cell.record_memory(1 << 20);
        cell.record_memory(64 << 10);
        let s = cell.snapshot(Slot::CapabilityPolicy);
        assert_eq!(
            (s.failures.panic, s.failures.exit, s.failures.trap),
            (2, 1, 1)
        );
        assert_eq!(s.memory_high_water_bytes, 1 << 20);
    }
}
