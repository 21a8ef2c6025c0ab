//! The `crosstalk` binary's library: configuration and the faces (REST, long-poll, SSE, MCP) that
//! translate HTTP into messages to the relay's actors and back. No business rules live here.

pub mod api;
pub mod auth;
pub mod bridge;
pub mod cc;
pub mod cli;
pub mod client;
pub mod config;
pub mod error;
pub mod guard;
pub mod http;
pub mod mcp;
pub mod oauth;
pub mod openapi;
pub mod ops;
pub mod rest;
pub mod server;
pub mod sse;
pub mod telemetry;
pub mod ui;
pub mod webhooks;

pub use config::Config;
pub use server::{run, serve};
