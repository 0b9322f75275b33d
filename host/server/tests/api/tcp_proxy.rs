//! A TCP proxy between a server under test and a backing store, that a test can cut
//! (every connection reset, new ones refused: the store is "down"), stall (connections
//! stay open but nothing gets through: the store "hangs", as behind a network
//! partition), and restore.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub struct TcpProxy {
    pub addr: SocketAddr,
    upstream: SocketAddr,
    tasks: Arc<Mutex<Option<JoinSet<()>>>>,
    /// True while stalled: bytes are held, new connections wait.
    stalled: watch::Sender<bool>,
}

impl TcpProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Self {
            addr: listener.local_addr().unwrap(),
            upstream,
            tasks: Arc::new(Mutex::new(None)),
            stalled: watch::Sender::new(false),
        };
        proxy.serve(listener);
        proxy
    }

    fn serve(&self, listener: TcpListener) {
        let upstream = self.upstream;
        let tasks = self.tasks.clone();
        let stalled = self.stalled.subscribe();
        let mut set = JoinSet::new();
        let conns = tasks.clone();
        set.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut stalled = stalled.clone();
                let task = async move {
                    // A stalled store accepts but does not answer.
                    if stalled.wait_for(|s| !*s).await.is_err() {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pipe(client_read, server_write, stalled.clone()),
                        pipe(server_read, client_write, stalled),
                    );
                };
                if let Some(set) = conns.lock().unwrap().as_mut() {
                    set.spawn(task);
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

    /// The store stops answering: connections stay open, nothing gets through.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// A stalled store answers again (what was held goes through).
    pub fn unstall(&self) {
        self.stalled.send_replace(false);
    }

    /// The store is back, on the same address.
    pub async fn restore(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }
}

/// Copies `from` to `to`, holding each read while the proxy is stalled.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut stalled: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
    }
}
