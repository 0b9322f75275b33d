//! A round-robin TCP balancer in front of several server instances, as a reverse proxy
//! would be: each new connection goes to the next instance. With the suite's HTTP
//! client opening a connection per request (`HS_TEST_INSTANCES=2`), consecutive
//! requests of a test land on different instances.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct Balancer {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Balancer {
    pub async fn start(upstreams: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let next = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstreams[next.fetch_add(1, Ordering::Relaxed) % upstreams.len()];
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Self { addr, task }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
