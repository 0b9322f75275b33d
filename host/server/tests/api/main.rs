//! Integration tests of the homeserver over real HTTP: one binary, a `TestHost` per test.

#![allow(clippy::unwrap_used)]

mod backend;
mod fixture;

mod abuse;
mod auth;
mod concurrency;
mod crash;
mod events;
mod limits;
mod listing;
mod ops;
mod sessions;
mod signup;
mod storage;
mod store;
mod tls;
