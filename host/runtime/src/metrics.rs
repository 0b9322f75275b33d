//! The runtime's per-slot and per-module figures as Prometheus series (feature
//! `prometheus`): one collector, read at scrape time from the lock-free stats, used by
//! the homeserver (`hs_guest_*`) and by pkbot (`bot_guest_*`) for the slots each calls.
//! The per-slot series count across hot swaps; the `module_*` ones, labelled with the
//! module's BLAKE3, tell a new module's cost from the old one's (at most
//! `MODULES_KEPT` modules a slot, so their number stays bounded).

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

use crate::{PolicyRuntime, SlotStats};

/// Exports the runtime's per-slot stats at scrape time.
pub struct GuestCollector {
    runtime: Arc<PolicyRuntime>,
    /// The full name of each of [`SERIES`] then [`MODULE_SERIES`], in their order.
    names: Vec<String>,
    descs: Vec<Desc>,
}

/// Each series: its name after `{prefix}_guest_`, help, labels and kind. `collect`
/// returns their families in this order.
const SERIES: [(&str, &str, &[&str], MetricType); 8] = [
    (
        "calls_total",
        "Calls into a Wasm guest, by slot.",
        &["slot"],
        MetricType::COUNTER,
    ),
    (
        "call_failures_total",
        "Guest calls that failed and gave the slot's safe default, by slot and reason.",
        &["slot", "reason"],
        MetricType::COUNTER,
    ),
    (
        "call_duration_seconds",
        "Guest call latency, by slot.",
        &["slot"],
        MetricType::HISTOGRAM,
    ),
    (
        "reloads_total",
        "Loads of a new guest module or data, by slot and result.",
        &["slot", "result"],
        MetricType::COUNTER,
    ),
    (
        "memory_high_water_bytes",
        "The most linear memory an instance of the slot's guest was given, in bytes.",
        &["slot"],
        MetricType::GAUGE,
    ),
    (
        "cancelled_total",
        "Calls of the slot's guest whose caller stopped waiting before they ended (a \
         client gone); they are in calls_total too.",
        &["slot"],
        MetricType::COUNTER,
    ),
    (
        "epoch_ticks_total",
        "Epoch ticks (1 ms) at which a call of the slot's guest was running: its CPU time \
         in ms, estimated (a call is seen at a tick in proportion to its length).",
        &["slot"],
        MetricType::COUNTER,
    ),
    (
        "throttled_seconds_total",
        "Time calls of the slot's guest slept because guest calls had used up their \
         share of the cores (policies.guest_cpu_share).",
        &["slot"],
        MetricType::COUNTER,
    ),
];

/// The per-module series, after `{prefix}_guest_module_`, as [`SERIES`]; each also has
/// the label `module` (the module's BLAKE3, hex).
const MODULE_SERIES: [(&str, &str, &[&str], MetricType); 6] = [
    (
        "serving",
        "1 for the module that serves its slot now, 0 for one it served before (its \
         figures are kept until more modules have been swapped in).",
        &["slot", "module", "source"],
        MetricType::GAUGE,
    ),
    (
        "calls_total",
        "Calls into a Wasm guest, by slot and module.",
        &["slot", "module"],
        MetricType::COUNTER,
    ),
    (
        "call_failures_total",
        "Calls of a module that failed and gave the slot's safe default, by reason.",
        &["slot", "module", "reason"],
        MetricType::COUNTER,
    ),
    (
        "call_duration_seconds",
        "Call latency, by slot and module.",
        &["slot", "module"],
        MetricType::HISTOGRAM,
    ),
    (
        "epoch_ticks_total",
        "Epoch ticks (1 ms) at which a call of the module was running: its CPU time in \
         ms, estimated.",
        &["slot", "module"],
        MetricType::COUNTER,
    ),
    (
        "memory_high_water_bytes",
        "The most linear memory an instance of the module was given, in bytes.",
        &["slot", "module"],
        MetricType::GAUGE,
    ),
];

impl GuestCollector {
    /// The series of `runtime`'s slots, named `{prefix}_guest_*` (`hs` for the
    /// homeserver, `bot` for pkbot).
    pub fn new(runtime: Arc<PolicyRuntime>, prefix: &str) -> Result<Self, prometheus::Error> {
        let names: Vec<String> = SERIES
            .iter()
            .map(|(name, ..)| format!("{prefix}_guest_{name}"))
            .chain(
                MODULE_SERIES
                    .iter()
                    .map(|(name, ..)| format!("{prefix}_guest_module_{name}")),
            )
            .collect();
        let descs = SERIES
            .iter()
            .chain(&MODULE_SERIES)
            .zip(&names)
            .map(|((_, help, labels, _), name)| {
                let labels = labels.iter().map(|l| (*l).to_owned()).collect();
                Desc::new(name.clone(), (*help).into(), labels, Default::default())
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            runtime,
            names,
            descs,
        })
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name((*k).into());
            l.set_value((*v).into());
            l
        })
        .collect()
}

fn counter_metric(pairs: &[(&str, &str)], value: impl Into<f64>) -> Metric {
    let mut c = Counter::default();
    c.set_value(value.into());
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_counter(c);
    m
}

fn gauge_metric(pairs: &[(&str, &str)], value: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(value);
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_gauge(g);
    m
}

fn histogram_metric(pairs: &[(&str, &str)], s: &SlotStats) -> Metric {
    let mut h = Histogram::default();
    h.set_sample_count(s.latency.count);
    h.set_sample_sum(s.latency.sum_seconds);
    h.set_bucket(
        s.latency
            .cumulative()
            .into_iter()
            .map(|(bound, count)| {
                let mut b = Bucket::default();
                b.set_upper_bound(bound);
                b.set_cumulative_count(count);
                b
            })
            .collect(),
    );
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_histogram(h);
    m
}

/// The call series a slot and a module both have, for one set of labels each.
#[derive(Default)]
struct CallSeries {
    calls: Vec<Metric>,
    failures: Vec<Metric>,
    durations: Vec<Metric>,
    memory: Vec<Metric>,
    ticks: Vec<Metric>,
}

impl CallSeries {
    /// `s`'s figures under `pairs`; failures also by `reason`, for the reasons `keep`s.
    fn push(&mut self, pairs: &[(&str, &str)], s: &SlotStats, keep: impl Fn(&str) -> bool) {
        self.calls.push(counter_metric(pairs, s.calls as f64));
        for (reason, n) in s.failures.by_reason() {
            if keep(reason) {
                let mut with_reason = pairs.to_vec();
                with_reason.push(("reason", reason));
                self.failures.push(counter_metric(&with_reason, n as f64));
            }
        }
        self.durations.push(histogram_metric(pairs, s));
        self.memory
            .push(gauge_metric(pairs, s.memory_high_water_bytes as f64));
        self.ticks.push(counter_metric(pairs, s.epoch_ticks as f64));
    }
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.into());
    f.set_help(help.into());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

impl Collector for GuestCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut slots = CallSeries::default();
        let mut reloads = Vec::new();
        let mut throttled = Vec::new();
        let mut cancelled = Vec::new();
        for s in &self.runtime.stats() {
            let slot = s.slot.name();
            slots.push(&[("slot", slot)], s, |_| true);
            cancelled.push(counter_metric(&[("slot", slot)], s.cancelled as f64));
            throttled.push(counter_metric(&[("slot", slot)], s.throttled_seconds));
            reloads.push(counter_metric(
                &[("slot", slot), ("result", "ok")],
                s.reloads.saturating_sub(s.reload_failures) as f64,
            ));
            reloads.push(counter_metric(
                &[("slot", slot), ("result", "failed")],
                s.reload_failures as f64,
            ));
        }
        let mut serving = Vec::new();
        let mut modules = CallSeries::default();
        for (slot, kept) in self.runtime.module_stats() {
            let slot = slot.name();
            for m in &kept {
                serving.push(gauge_metric(
                    &[("slot", slot), ("module", &m.blake3), ("source", &m.source)],
                    if m.serving { 1.0 } else { 0.0 },
                ));
                // `unavailable` is the slot's (no module served): never a module's.
                modules.push(
                    &[("slot", slot), ("module", &m.blake3)],
                    &m.stats,
                    |reason| reason != "unavailable",
                );
            }
        }
        // In the order of SERIES, then MODULE_SERIES.
        let metrics = [
            slots.calls,
            slots.failures,
            slots.durations,
            reloads,
            slots.memory,
            cancelled,
            slots.ticks,
            throttled,
            serving,
            modules.calls,
            modules.failures,
            modules.durations,
            modules.ticks,
            modules.memory,
        ];
        SERIES
            .iter()
            .chain(&MODULE_SERIES)
            .zip(&self.names)
            .zip(metrics)
            .map(|(((_, help, _, kind), name), metrics)| family(name, help, *kind, metrics))
            .collect()
    }
}
