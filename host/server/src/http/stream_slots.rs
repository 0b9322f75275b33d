//! How many event streams each client address has open: a stream is held for as long
//! as its client wants, so without a cap one address could open thousands (HTTP/2
//! carries 128 on one connection) and hold their memory. Counted per address; a slot is
//! given back when its stream's body is dropped (the client left, or shutdown).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// The open-stream counts of every address.
#[derive(Debug)]
pub struct StreamSlots {
    /// Streams one address may have open; 0 = unlimited.
    per_ip: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One open stream's slot, given back when dropped.
#[derive(Debug)]
pub struct StreamSlot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

fn lock(open: &Mutex<HashMap<IpAddr, usize>>) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
    // Counts only change under the lock in whole steps: a poisoned map is still right.
    open.lock().unwrap_or_else(|e| e.into_inner())
}

impl StreamSlots {
    pub fn new(per_ip: usize) -> Self {
        Self {
            per_ip,
            open: Arc::default(),
        }
    }

    /// The most streams one address may have open (0 = unlimited).
    pub fn per_ip(&self) -> usize {
        self.per_ip
    }

    /// A slot for a new stream from `ip`, or None when it has `per_ip` open already.
    pub fn acquire(&self, ip: IpAddr) -> Option<StreamSlot> {
        let mut open = lock(&self.open);
        let count = open.entry(ip).or_insert(0);
        if self.per_ip != 0 && *count >= self.per_ip {
            return None;
        }
        *count += 1;
        Some(StreamSlot {
            ip,
            open: self.open.clone(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = lock(&self.open);
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_share_and_slots_come_back() {
        let slots = StreamSlots::new(2);
        let a: IpAddr = [192, 0, 2, 1].into();
        let b: IpAddr = [192, 0, 2, 2].into();
        let first = slots.acquire(a).expect("room");
        let _second = slots.acquire(a).expect("room");
        assert!(slots.acquire(a).is_none(), "a has two open");
        let _other = slots.acquire(b).expect("b has its own share");
        drop(first);
        let _third = slots.acquire(a).expect("a slot came back");
        assert!(slots.acquire(a).is_none());
    }

    #[test]
    fn zero_means_unlimited_and_nothing_is_kept_for_gone_addresses() {
        let slots = StreamSlots::new(0);
        let a: IpAddr = [192, 0, 2, 1].into();
        let held: Vec<_> = (0..1000)
            .map(|_| slots.acquire(a).expect("unlimited"))
            .collect();
        drop(held);
        assert!(lock(&slots.open).is_empty());
    }
}
