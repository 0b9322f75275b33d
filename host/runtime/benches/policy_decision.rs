//! One capability decision (a session with three capability strings) through the
//! capability-policy guest — on a reused instance and on a fresh instance per call —
//! against the same rule in native code (`homeserver_protocol::Capability::covers`).
//! Prints p50 / p99 / mean per variant. When the Python guest is built
//! (`scripts/build-python-guest`), the same decision through it, its size, its compile
//! time and its load time from the module cache.
//!
//! "async path" is how the server calls: `authorize_isolated` awaited in a task on a
//! Tokio multi-thread runtime.
//!
//! Run: `cargo bench -p homeserver-runtime --bench policy_decision`

use std::hint::black_box;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use homeserver_protocol::capability::{Action, Capability};
use homeserver_runtime::{AuthorizeRequest, Caller, Operation, PolicyRuntime, RuntimeConfig};

const CAPABILITIES: [&str; 3] = ["read:/pub/a/", "write:/pub/b/", "*:/pub/app/"];
const PATH: &str = "/pub/app/posts/0033SSE3B1FQ0";

fn measure(name: &str, iterations: u64, mut call: impl FnMut()) {
    // Warm up caches, the instance pool and the branch predictors.
    for _ in 0..iterations / 10 {
        call();
    }
    let mut histogram =
        Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds");
    let started = Instant::now();
    for _ in 0..iterations {
        let t = Instant::now();
        call();
        let nanos = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        histogram.saturating_record(nanos.max(1));
    }
    let total = started.elapsed();
    let us = |n: u64| Duration::from_nanos(n).as_secs_f64() * 1e6;
    println!(
        "{name:<34} n={iterations:<7} p50={:>8.3} µs  p99={:>8.3} µs  mean={:>8.3} µs",
        us(histogram.value_at_quantile(0.5)),
        us(histogram.value_at_quantile(0.99)),
        total.as_secs_f64() * 1e6 / iterations as f64,
    );
}

/// The process's CPU time so far (user + system, all threads; Linux's /proc, in its
/// 10 ms ticks), or `None` elsewhere.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces) start at state, the
    // 3rd field: utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Prints p50 / p99 / mean of `took`, as [`measure`] does.
fn report(name: &str, took: &[Duration]) {
    let mut histogram =
        Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds");
    for t in took {
        let nanos = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
        histogram.saturating_record(nanos.max(1));
    }
    let us = |n: u64| Duration::from_nanos(n).as_secs_f64() * 1e6;
    let total: Duration = took.iter().sum();
    println!(
        "{name:<34} n={:<7} p50={:>8.3} µs  p99={:>8.3} µs  mean={:>8.3} µs",
        took.len(),
        us(histogram.value_at_quantile(0.5)),
        us(histogram.value_at_quantile(0.99)),
        total.as_secs_f64() * 1e6 / took.len().max(1) as f64,
    );
}

fn runtime(instance_max_calls: u64) -> PolicyRuntime {
    let dir = tempfile::tempdir().expect("tempdir");
    // An empty directory: the built-in guests and data serve.
    PolicyRuntime::load(RuntimeConfig {
        policies_dir: dir.path().join("none"),
        instance_max_calls,
        ..RuntimeConfig::default()
    })
    .expect("runtime")
}

fn main() {
    let user = "8pinxxgqs41n4aididenw5apqp1urfmzdztr8jt4abrkdn435ewo".to_owned();
    let request = AuthorizeRequest::new(
        Operation::Write,
        PATH,
        Caller::Session {
            capabilities: CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
        },
        user.clone(),
    );
    let public = AuthorizeRequest::new(Operation::Read, PATH, Caller::Public, user);

    let reused = runtime(u64::MAX);
    println!("pooling allocator: {}", reused.uses_pooling_allocator());
    assert!(reused.authorize(&request).expect("decision").allow);
    measure("guest, reused instance", 200_000, || {
        black_box(reused.authorize(black_box(&request)).map(|d| d.allow).ok());
    });

    // The server's path: an async call from a task on a Tokio worker (a multi-thread
    // runtime, as the server's), one call after the other.
    let shared = std::sync::Arc::new(runtime(u64::MAX));
    let workers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let task = {
        let (shared, request) = (std::sync::Arc::clone(&shared), request.clone());
        async move {
            let mut took = Vec::with_capacity(100_000);
            for i in 0..110_000 {
                let t = Instant::now();
                let decided = shared.authorize_isolated(black_box(&request)).await;
                black_box(decided.map(|d| d.allow).ok());
                // The first tenth warms up.
                if i >= 10_000 {
                    took.push(t.elapsed());
                }
            }
            took
        }
    };
    let cpu_before = process_cpu();
    let took = workers.block_on(workers.spawn(task)).expect("the task ran");
    report("guest, reused instance, async path", &took);
    if let (Some(before), Some(after)) = (cpu_before, process_cpu()) {
        // All threads: the worker, and before async calls the guest thread too.
        let per_call = (after - before).as_secs_f64() * 1e6 / 110_000.0;
        println!("  process CPU per async call: {per_call:.2} µs");
    }

    // A public read is answered by the guest once, then from the module's cache.
    assert!(reused.authorize(&public).expect("decision").allow);
    measure("public read, cached decision", 1_000_000, || {
        black_box(reused.authorize(black_box(&public)).map(|d| d.allow).ok());
    });

    python(&request);

    // Retiring every instance after one call makes each call instantiate afresh
    // (Store + instantiate from InstancePre + call).
    let fresh = runtime(1);
    measure("guest, fresh instance per call", 20_000, || {
        black_box(fresh.authorize(black_box(&request)).map(|d| d.allow).ok());
    });

    let parsed: Vec<Capability> = CAPABILITIES
        .iter()
        .map(|c| c.parse().expect("capability"))
        .collect();
    measure("native Capability::covers", 1_000_000, || {
        black_box(
            parsed
                .iter()
                .any(|c| c.covers(Action::Write, black_box(PATH))),
        );
    });
    measure("native, parsing the strings too", 1_000_000, || {
        black_box(CAPABILITIES.iter().any(|s| {
            s.parse::<Capability>()
                .is_ok_and(|c| c.covers(Action::Write, black_box(PATH)))
        }));
    });
}

/// The Python guest (guests/python), when it is built: compile, cached load, per call.
fn python(request: &AuthorizeRequest) {
    let module = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/python-guest/capability_policy_py.wasm");
    let Ok(bytes) = std::fs::read(&module) else {
        println!("(no Python guest: scripts/build-python-guest builds it)");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("policy.wasm"), &bytes).expect("copy");
    std::fs::write(
        dir.path().join("policies.toml"),
        "[capability-policy]\nmodule = \"policy.wasm\"\nfallback = \"none\"\n",
    )
    .expect("policies.toml");
    let load = || {
        let started = Instant::now();
        let runtime = PolicyRuntime::load(RuntimeConfig {
            policies_dir: dir.path().to_owned(),
            cache_dir: Some(dir.path().join("cache")),
            ..RuntimeConfig::default()
        })
        .expect("runtime");
        (runtime, started.elapsed())
    };
    let (_, compiled) = load();
    let (runtime, cached) = load();
    println!(
        "python guest: {} bytes; load with compile {:.2} s, from the module cache {:.1} ms",
        bytes.len(),
        compiled.as_secs_f64(),
        cached.as_secs_f64() * 1e3
    );
    assert!(runtime.authorize(request).expect("decision").allow);
    measure("python guest, reused instance", 20_000, || {
        black_box(runtime.authorize(black_box(request)).map(|d| d.allow).ok());
    });
}
