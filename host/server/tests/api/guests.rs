//! A hostile capability policy in a running server: guest calls run on guest threads of
//! their own, so a guest that loops until its deadline (or hoards memory) cannot slow
//! the requests that never ask it, and what it was asked fails closed.

use std::sync::Arc;
use std::time::Instant;

use crate::fixture::*;

/// The hostile test guest (loops on paths with `loop`, allocates without bound on paths
/// with `alloc`), built next to the default guests by the runtime's build script.
fn hostile_module() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/api-xxxx → target/wasm-guests/...
    let target = exe.ancestors().nth(3).unwrap();
    let path = target.join("wasm-guests/wasm32-wasip2/release/hostile.wasm");
    assert!(
        path.exists(),
        "{} missing (built by host/runtime/build.rs)",
        path.display()
    );
    path
}

/// Two async workers, as a small machine has: before guest calls had threads of their
/// own, two looping calls stopped every request of the server for their deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_guest_does_not_slow_requests_that_do_not_ask_it() {
    let host = Arc::new(
        TestHost::start_single_with(|c| {
            let policies = c.policies.dir.clone();
            std::fs::create_dir_all(&policies).unwrap();
            std::fs::copy(hostile_module(), policies.join("hostile.wasm")).unwrap();
            std::fs::write(
                policies.join("policies.toml"),
                "[capability-policy]\nmodule = \"hostile.wasm\"\n",
            )
            .unwrap();
            c.policies.guest_threads = 2;
        })
        .await,
    );
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/data", b"public").await.status(), 200);

    // 24 signed reads the policy loops on (100 ms each, two at a time: over a second of
    // guest time), and one that makes it hoard memory.
    let started = Instant::now();
    let hostile: Vec<_> = (0..25)
        .map(|i| {
            let (host, alice) = (host.clone(), alice.clone());
            let path = if i == 0 { "/pub/alloc" } else { "/pub/loop" };
            tokio::spawn(async move {
                let status = host.get(&alice, path).await.status().as_u16();
                (status, Instant::now())
            })
        })
        .collect();
    // Meanwhile, public reads (the policy is not asked about them).
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    for _ in 0..50 {
        let response = host.public_get(&alice, "/pub/data").await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.bytes().await.unwrap().as_ref(), b"public");
    }
    let public_done = Instant::now();

    let mut last_hostile = started;
    for task in hostile {
        let (status, at) = task.await.unwrap();
        // Failed closed: 500 (the guest ran past its deadline or memory) or 503 (no
        // guest thread free in time); never allowed.
        assert!(status == 500 || status == 503, "{status}");
        last_hostile = last_hostile.max(at);
    }
    // An order, not a timing: fifty public reads finished while the looping calls
    // (over a second of them, two at a time) were still being answered.
    assert!(
        public_done < last_hostile,
        "the public reads waited for the looping guest"
    );
    let addr = host.server().metrics_addr().unwrap();
    let text = host
        .http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let timeouts: f64 = text
        .lines()
        .filter(|l| l.starts_with("hs_guest_call_failures_total{"))
        .filter(|l| l.contains("slot=\"capability-policy\"") && l.contains("reason=\"timeout\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        timeouts >= 1.0,
        "the looping calls timed out in the guest:\n{text}"
    );
}
