//! End-to-end tests of the `pk` binary.
//!
//! Offline, no server (`offline.rs`): `offline_behaviour` (usage errors, key handling,
//! client-side path checks, the unreachable-server message, `host:port` without a
//! scheme, `--json` errors, shell completions), `keys_default_to_the_config_folder`
//! (`pk keygen` saves to ~/.config/pk/keys, 0600, never clobbers; `*.key` is
//! git-ignored) and `config_file_and_profiles` (the layers defaults → config file →
//! environment → flags, profiles, and mistakes named).
//!
//! Against the real `homeserver` binary (the sibling of this test's target directory, or
//! `$HOMESERVER_BIN`) on a free port with a throwaway database, blob store and key:
//! - `storage.rs`: `against_a_real_homeserver` (keygen → signup twice → whoami → put →
//!   get, `-o` without clobbering, binary refused on a terminal → stat → ls, `-l`,
//!   `--json` → rm, `rm -r`) and `posts_and_replies_against_a_real_homeserver`;
//! - `events.rs`: `events_against_a_real_homeserver` (`pk events` and `pk stream`:
//!   history, filters, a live stream fed by another `pk put`, a refused request);
//! - `sync.rs`: `sync_and_cp_against_a_real_homeserver` (folders both ways, only changed
//!   files sent, `--delete`, `--dry-run`, single-file `cp`);
//! - `rate_limits.rs`: `rate_limits_against_a_real_homeserver` (feeds signed with a key
//!   escape the IP's limit; `Retry-After` honoured);
//! - `network.rs`: `keys_records_and_migrating_between_homeservers` (two homeservers
//!   found by key on a local DHT, over raw-public-key TLS, and a user migrated between
//!   them).
//!
//! When the binary has not been built (`cargo test -p pk-client` alone does not build
//! it; `cargo test --workspace` does) these are skipped with a note, unless
//! `PK_E2E_REQUIRE_HOMESERVER=1` or `CI=true` makes them fail instead.
//!
//! `support.rs`: the clean `pk` command and output checks; the `homeserver` process comes
//! from hs-testkit. Every `pk` runs with a clean environment and a home folder of its
//! own, so the user's own config and keys are never read or written.

mod events;
mod network;
mod offline;
mod rate_limits;
mod storage;
mod support;
mod sync;
