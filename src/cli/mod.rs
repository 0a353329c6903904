//! The pieces of the `tidemark` binary: config, `serve`, and the client commands.

pub mod certs;
pub mod client;
pub mod config;
pub mod ingest;
pub mod late;
pub mod output;
pub mod serve;
pub mod snapshot;
pub mod views;
