//! A TCP proxy between a server under test and a backing store, that a test can cut
//! (every connection reset, new ones refused: the store is "down") and restore.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

pub struct TcpProxy {
    pub addr: SocketAddr,
    upstream: SocketAddr,
    tasks: Arc<Mutex<Option<JoinSet<()>>>>,
}

impl TcpProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Self {
            addr: listener.local_addr().unwrap(),
            upstream,
            tasks: Arc::new(Mutex::new(None)),
        };
        proxy.serve(listener);
        proxy
    }

    fn serve(&self, listener: TcpListener) {
        let upstream = self.upstream;
        let tasks = self.tasks.clone();
        let mut set = JoinSet::new();
        let conns = tasks.clone();
        set.spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                if let Some(set) = conns.lock().unwrap().as_mut() {
                    set.spawn(async move {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                }
            }
        });
        *tasks.lock().unwrap() = Some(set);
    }

    /// The store goes away: open connections are reset and new ones refused.
    pub fn cut(&self) {
        // Dropping the set aborts the accept loop (closing the listener) and every
        // connection task (closing both sockets).
        drop(self.tasks.lock().unwrap().take());
    }

    /// The store is back, on the same address.
    pub async fn restore(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
    }
}
