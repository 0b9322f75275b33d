//! Readiness: whether this instance can serve requests now. Ready means both backing
//! stores answer (each within `storage.timeout_secs`, the check `/admin/stats` shows)
//! and every guest slot the server calls is served by a module (a slot on its safe
//! default refuses what it decides).
//!
//! The check runs in the background every [`CHECK_INTERVAL`] (the orchestrator's task)
//! and keeps its last result here; `GET /ready` only reads it. So a load balancer that
//! probes every 100 ms, or ten of them, costs the stores nothing more: each instance
//! asks its database and blob store one question per interval, and the `hs_backend_up`
//! gauges stay current even when nobody probes. A store going down shows within the
//! interval plus the storage timeout; coming back, within the interval.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use homeserver_runtime::{PolicyRuntime, Slot};

use super::admin::{AdminService, BackendHealth, StoreHealth};

/// How often the stores are asked.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// The guest slots this process calls; the others serve the bot (`pkbot`), which loads
/// them from its own `policies.dir`.
pub const SERVER_SLOTS: [Slot; 1] = [Slot::CapabilityPolicy];

/// The process that calls `slot`: `homeserver` for [`SERVER_SLOTS`], `pkbot` for the
/// others (this process loads them too, so the admin API shows them, but never asks).
pub fn caller_of(slot: Slot) -> &'static str {
    if SERVER_SLOTS.contains(&slot) {
        "homeserver"
    } else {
        "pkbot"
    }
}

/// One readiness check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub backends: BackendHealth,
    /// The slots of [`SERVER_SLOTS`] with no module serving them.
    pub slots_not_serving: Vec<Slot>,
}

impl Readiness {
    /// Before the first check: nothing is known to work.
    fn unchecked() -> Self {
        let unknown = || StoreHealth {
            backend: String::new(),
            status: "unchecked".into(),
            error: None,
        };
        Self {
            backends: BackendHealth {
                metadata: unknown(),
                blobs: unknown(),
            },
            slots_not_serving: Vec::new(),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.backends.metadata.is_ok()
            && self.backends.blobs.is_ok()
            && self.slots_not_serving.is_empty()
    }

    /// What is not ready, one phrase each, for people (no causes: they may hold host
    /// names or paths, and `/ready` answers anyone; the log and `/admin/stats` have them).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, store) in [
            ("metadata store", &self.backends.metadata),
            ("blob store", &self.backends.blobs),
        ] {
            if !store.is_ok() {
                problems.push(format!("the {name} does not answer"));
            }
        }
        for slot in &self.slots_not_serving {
            problems.push(format!(
                "policy slot {} is not serving (every call gets its safe default, {})",
                slot.name(),
                slot.safe_default()
            ));
        }
        problems
    }
}

/// The last readiness check, shared by the probes and the checker.
pub struct ReadinessBoard {
    last: ArcSwap<Readiness>,
}

impl Default for ReadinessBoard {
    fn default() -> Self {
        Self {
            last: ArcSwap::from_pointee(Readiness::unchecked()),
        }
    }
}

impl ReadinessBoard {
    /// The last result (a pointer copy: what a probe costs).
    pub fn get(&self) -> Arc<Readiness> {
        self.last.load_full()
    }

    /// Checks now, keeps the result, and returns it with the one it replaced.
    pub async fn check(
        &self,
        admin: &AdminService,
        policy: &PolicyRuntime,
    ) -> (Arc<Readiness>, Arc<Readiness>) {
        let backends = admin.backend_health().await;
        let slots_not_serving = policy
            .status()
            .into_iter()
            .filter(|s| SERVER_SLOTS.contains(&s.slot) && !s.serving)
            .map(|s| s.slot)
            .collect();
        let now = Arc::new(Readiness {
            backends,
            slots_not_serving,
        });
        let before = self.last.swap(now.clone());
        (now, before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(status: &str) -> StoreHealth {
        StoreHealth {
            backend: "postgres".into(),
            status: status.into(),
            error: (status == "down").then(|| "connection refused to 10.0.0.5".into()),
        }
    }

    #[test]
    fn ready_only_when_every_part_is() {
        let mut r = Readiness {
            backends: BackendHealth {
                metadata: store("ok"),
                blobs: store("ok"),
            },
            slots_not_serving: vec![],
        };
        assert!(r.is_ready());
        assert!(r.problems().is_empty());
        r.backends.metadata = store("down");
        r.slots_not_serving = vec![Slot::CapabilityPolicy];
        assert!(!r.is_ready());
        let problems = r.problems().join("; ");
        assert!(problems.contains("metadata store"), "{problems}");
        assert!(problems.contains("capability-policy"), "{problems}");
        assert!(!problems.contains("10.0.0.5"), "no causes: {problems}");
        assert!(!Readiness::unchecked().is_ready());
    }
}
