//! The guests' share of the cores (`policies.guest_cpu_share`), counted in epoch ticks:
//! the sandbox's epoch callback pays a tick for every tick a call is seen running, and
//! makes the call sleep when the share is used up.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// Ticks of guest time the [`CpuBudget`] lets run at once, per core of the share,
/// before it makes calls wait: a guest that needs a few ms now and then is not slowed.
const BUDGET_BURST_TICKS: u32 = 20;

/// The guests' share of the cores, as a rate of epoch ticks: each tick a call is seen
/// running costs one cell. A short call is seen at a tick with a probability
/// proportional to its length, so short calls pay for their CPU time on average (most
/// pay nothing). A long call pays more than it ran: after each yield it resumes part-way
/// into a tick (half a tick on average under contention) and pays the whole tick, so a
/// guest that loops gets up to half its share while others wait for the cores, and its
/// tick count overstates its CPU time by up to 2x. That errs on the host's side. When
/// the cells run out, running calls sleep at their next tick until the rate allows them
/// another: guest calls together never take more than their share for longer than the
/// burst.
pub(crate) struct CpuBudget {
    limiter: DefaultDirectRateLimiter,
    clock: DefaultClock,
    /// Cores the share amounts to.
    cores: f64,
}

impl std::fmt::Debug for CpuBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBudget")
            .field("cores", &self.cores)
            .finish()
    }
}

impl CpuBudget {
    pub(crate) fn new(share: f64, tick: Duration) -> Self {
        let machine = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        let cores = (share.clamp(0.01, 1.0) * machine).max(0.01);
        let per_second = (cores * 1_000_000.0 / tick.as_micros() as f64).round();
        let cells = NonZeroU32::new(per_second.clamp(1.0, f64::from(u32::MAX)) as u32)
            .unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(((cores.ceil() as u32).max(1)) * BUDGET_BURST_TICKS)
            .unwrap_or(NonZeroU32::MIN);
        Self {
            limiter: RateLimiter::direct(Quota::per_second(cells).allow_burst(burst)),
            clock: DefaultClock::default(),
            cores,
        }
    }

    /// Pays for one tick of guest time if the share allows it now.
    pub(crate) fn try_pay_tick(&self) -> bool {
        self.limiter.check().is_ok()
    }

    /// Waits until the share allows one more tick of guest time and pays for it; at
    /// `deadline` it stops waiting unpaid (the call then traps at its next tick). Adds
    /// the time it slept to `slept`, in ns.
    pub(crate) async fn pay_tick(self: Arc<Self>, deadline: Instant, slept: Arc<AtomicU64>) {
        let started = Instant::now();
        while let Err(not_until) = self.limiter.check() {
            let wait = not_until.wait_time_from(self.clock.now());
            if Instant::now() + wait >= deadline {
                tokio::time::sleep_until(deadline.into()).await;
                break;
            }
            tokio::time::sleep(wait).await;
        }
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        slept.fetch_add(nanos, Ordering::Relaxed);
    }
}
