//! Each subscriber's own check of its stream: every committed write of its user exactly
//! once, cursors increasing, nothing foreign. Writes are named by their number
//! ([`write_path`]), which the events carry back.

use super::write_state;

/// Where write `j` is stored (the events carry it back).
const WRITE_PREFIX: &str = "/pub/bench/fanout/w";

/// The path of write `j`.
pub fn write_path(j: usize) -> String {
    format!("{WRITE_PREFIX}{j}")
}

/// The write number of an event's path (as in its URL: without the leading `/`).
pub fn write_index(url_path: &str) -> Option<usize> {
    let digits = url_path.strip_prefix(&WRITE_PREFIX[1..])?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// How one event counted for a subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The first delivery of this write.
    First(usize),
    /// This write was delivered before.
    Repeat,
    /// Not a write of this run to this subscriber's user.
    Foreign,
}

/// One subscriber's view of its stream: it must get every committed write of its user
/// exactly once, with increasing cursors.
#[derive(Debug)]
pub struct StreamCheck {
    user: usize,
    users: usize,
    /// Deliveries of each write of this user (write `j` at `j / users`), saturating.
    counts: Vec<u8>,
    /// Highest cursor seen (cursors start at 1).
    last_cursor: u64,
    events: u64,
    out_of_order: u64,
    foreign: u64,
}

/// The checks of one or more subscribers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckCounts {
    /// Events received, of any kind.
    pub events: u64,
    /// Committed writes (2xx) of the subscriber's user that never arrived.
    pub missing: u64,
    /// Extra deliveries of a write already delivered.
    pub duplicates: u64,
    /// First deliveries whose cursor was not above every cursor before it.
    pub out_of_order: u64,
    /// Events for another user, for no write of this run, or for a refused write.
    pub unexpected: u64,
}

impl std::ops::AddAssign for CheckCounts {
    fn add_assign(&mut self, other: Self) {
        self.events += other.events;
        self.missing += other.missing;
        self.duplicates += other.duplicates;
        self.out_of_order += other.out_of_order;
        self.unexpected += other.unexpected;
    }
}

impl StreamCheck {
    /// A subscriber of `user` (of `users`), in a run of `writes` writes.
    pub fn new(user: usize, users: usize, writes: usize) -> Self {
        let users = users.max(1);
        let mine = writes.saturating_sub(user).div_ceil(users);
        Self {
            user,
            users,
            counts: vec![0; mine],
            last_cursor: 0,
            events: 0,
            out_of_order: 0,
            foreign: 0,
        }
    }

    /// Records one event: `write` is the write number its path names (None when it
    /// names none, or belongs to another user).
    pub fn record(&mut self, write: Option<usize>, cursor: u64) -> Seen {
        self.events += 1;
        let slot = write
            .filter(|j| j % self.users == self.user)
            .and_then(|j| self.counts.get_mut(j / self.users).map(|slot| (j, slot)));
        let Some((j, slot)) = slot else {
            self.foreign += 1;
            return Seen::Foreign;
        };
        let first = *slot == 0;
        *slot = slot.saturating_add(1);
        if !first {
            return Seen::Repeat;
        }
        if cursor <= self.last_cursor {
            self.out_of_order += 1;
        }
        self.last_cursor = self.last_cursor.max(cursor);
        Seen::First(j)
    }

    /// The verdict, given what became of each write (a `write_state` value).
    pub fn finish(&self, state_of: impl Fn(usize) -> u8) -> CheckCounts {
        let mut c = CheckCounts {
            events: self.events,
            out_of_order: self.out_of_order,
            unexpected: self.foreign,
            ..CheckCounts::default()
        };
        for (k, &n) in self.counts.iter().enumerate() {
            let n = u64::from(n);
            c.duplicates += n.saturating_sub(1);
            match state_of(k * self.users + self.user) {
                write_state::OK if n == 0 => c.missing += 1,
                write_state::REFUSED | write_state::NOT_SENT => c.unexpected += n.min(1),
                _ => {}
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_paths_round_trip() {
        assert_eq!(write_path(0), "/pub/bench/fanout/w0");
        for j in [0, 7, 1999, 123_456] {
            assert_eq!(write_index(&write_path(j)[1..]), Some(j));
        }
        for other in [
            "pub/bench/fanout/w",
            "pub/bench/fanout/wx",
            "pub/bench/fanout/w+1",
            "pub/bench/fanout/w1/2",
            "pub/bench/put-1k/c0-1",
            "/pub/bench/fanout/w1",
        ] {
            assert_eq!(write_index(other), None, "{other}");
        }
    }

    fn all(state: u8) -> impl Fn(usize) -> u8 {
        move |_| state
    }

    #[test]
    fn a_perfect_stream_counts_clean() {
        // 3 users, 10 writes: user 1 owns writes 1, 4, 7.
        let mut c = StreamCheck::new(1, 3, 10);
        assert_eq!(c.counts.len(), 3);
        assert_eq!(c.record(Some(1), 5), Seen::First(1));
        assert_eq!(c.record(Some(4), 9), Seen::First(4));
        assert_eq!(c.record(Some(7), 12), Seen::First(7));
        assert_eq!(
            c.finish(all(write_state::OK)),
            CheckCounts {
                events: 3,
                ..CheckCounts::default()
            }
        );
        // User 2 of 3 owns 2, 5, 8; user 0 owns 0, 3, 6, 9.
        assert_eq!(StreamCheck::new(2, 3, 10).counts.len(), 3);
        assert_eq!(StreamCheck::new(0, 3, 10).counts.len(), 4);
        assert_eq!(StreamCheck::new(5, 8, 3).counts.len(), 0);
    }

    #[test]
    fn counts_missing_duplicate_out_of_order_and_foreign() {
        let mut c = StreamCheck::new(0, 1, 6);
        assert_eq!(c.record(Some(0), 10), Seen::First(0));
        assert_eq!(c.record(Some(2), 12), Seen::First(2));
        assert_eq!(c.record(Some(2), 12), Seen::Repeat); // duplicate, not out of order
        assert_eq!(c.record(Some(1), 11), Seen::First(1)); // late: out of order
        assert_eq!(c.record(Some(0), 10), Seen::Repeat);
        assert_eq!(c.record(Some(6), 20), Seen::Foreign); // no such write
        assert_eq!(c.record(None, 21), Seen::Foreign); // another user or path
        assert_eq!(c.record(Some(3), 13), Seen::First(3)); // order resumes
        // Writes 4 and 5 never arrived.
        assert_eq!(
            c.finish(all(write_state::OK)),
            CheckCounts {
                events: 8,
                missing: 2,
                duplicates: 2,
                out_of_order: 1,
                unexpected: 2,
            }
        );
    }

    #[test]
    fn only_committed_writes_are_owed() {
        let mut c = StreamCheck::new(0, 2, 8); // writes 0, 2, 4, 6
        c.record(Some(0), 1);
        c.record(Some(4), 3); // write 4 was refused: its event should not exist
        c.record(Some(1), 2); // user 1's write
        let states = |j: usize| match j {
            0 => write_state::OK,
            2 => write_state::UNKNOWN, // no answer: owed nothing either way
            4 => write_state::REFUSED, // delivered anyway
            6 => write_state::NOT_SENT, // never sent
            _ => write_state::OK,
        };
        assert_eq!(
            c.finish(states),
            CheckCounts {
                events: 3,
                missing: 0,
                duplicates: 0,
                out_of_order: 0,
                unexpected: 2,
            }
        );
        let mut total = c.finish(states);
        total += c.finish(states);
        assert_eq!((total.events, total.unexpected), (6, 4));
    }

    #[test]
    fn duplicate_counts_saturate() {
        let mut c = StreamCheck::new(0, 1, 1);
        for _ in 0..300 {
            c.record(Some(0), 1);
        }
        assert_eq!(c.finish(all(write_state::OK)).duplicates, 254);
    }
}
