//! The relay's integration tests, one binary (one build and one link, where 22 files each
//! linked the whole relay): each module is one face or one concern. Most start the relay in
//! this process through `common::Server::start`; crash, restart, log, file-limit and metrics
//! tests run it as a process. The NATS cluster suite is a binary of its own (`tests/nats/`),
//! which `scripts/test` runs alongside this one. See docs/testing.md.

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod auth_matrix;
mod bad_input;
mod cli;
mod cluster_example;
mod coordination;
mod crash;
mod cross_claude;
mod disk_full;
mod dockerfile;
mod fuzz_tools;
mod long_poll;
mod mcp_coordination;
mod mcp_resources;
mod mcp_tools;
mod mcp_transport;
mod metrics;
mod oauth;
mod ordering;
mod reservations;
mod restart;
mod search;
mod security;
mod sse;
mod stdio;
mod stored;
mod tasks;
mod wake;
mod webhooks;
