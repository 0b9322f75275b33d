//! Integration tests of the homeserver over real HTTP: one binary, a `TestHost` per test.

#![allow(clippy::unwrap_used)]

mod backend;
mod balancer;
mod fixture;
mod process;
mod tcp_proxy;

mod abuse;
mod access_log;
mod account;
mod admin_api;
mod admin_page;
mod auth;
mod backup;
mod backup_procedure;
mod blob_grace;
mod concurrency;
mod cors;
mod crash;
mod deploy;
mod escaped_paths;
mod events;
mod first_run;
mod guests;
mod health;
mod inline_values;
mod limits;
mod listing;
mod maintenance;
mod metrics;
mod move_deployment;
mod nginx;
mod openapi;
mod pkarr;
mod scale_out;
mod sessions;
mod signup;
mod signup_tokens;
mod storage;
mod store;
mod throttling;
mod tls;
mod upgrade;
