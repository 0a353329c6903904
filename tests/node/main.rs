//! Test binary `node`: the embedded node and its storage: durability and crash images, kill -9 loops, fsync
//! failure, limits, idempotent ingest, snapshots, upgrades (format 5 fixtures), in-process sync,
//! hostile decoders, and the layering of `src/` read from its imports.
//!
//! One binary per area (each file is a module): one link and one copy of the dependencies
//! instead of one per file. Tests that measure this process (`memory_soak`, `http_abuse`) or
//! change the host firewall (`cluster_nemesis`) keep binaries of their own.

#[path = "../common/mod.rs"]
mod common;

mod crash_images;
mod crash_kill9;
mod drop_reopen;
mod embedded_sync;
mod fsync_failure;
mod hostile_decode;
mod idempotency;
mod layering;
mod limits;
mod node_ops;
mod relaxed_kill9;
mod relaxed_replication;
mod snapshot;
mod upgrade;
