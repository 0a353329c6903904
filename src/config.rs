//! Node configuration: the data directory, durability, replication policy and views; every
//! limit the node enforces is in [`crate::limits`] (docs/design/principles.md, "Bounded
//! everything").

use std::path::PathBuf;
use std::time::Duration;

pub use crate::limits::{Durability, Limits};

/// Configuration of an embedded node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The data directory (created 0700 if missing).
    pub data_dir: PathBuf,
    /// Limits.
    pub limits: Limits,
    /// Durability mode.
    pub durability: Durability,
    /// In `Relaxed` mode, how often a durable commit is forced.
    pub relaxed_sync_interval: Duration,
    /// Replication timing and policy (gossip interval, retransmit, eviction, message size).
    pub replication: crate::proto::replica::ReplicaConfig,
    /// Delta-log entries kept even when every peer acknowledged them, so briefly disconnected
    /// peers resume with deltas instead of a state transfer (default 10,000).
    pub log_retain_entries: u64,
    /// Stream views (docs/design/principles.md, "Stream views"), validated at open; every node of a
    /// cluster must run the same definitions (default: none).
    pub views: Vec<crate::views::ViewDef>,
    /// This node joins an existing cluster (the daemon sets it when started with `--join`).
    /// Until its state holds another node's announcement of a stream, it seals and removes
    /// no window of it on its own watermark alone and refuses the stream's windowed events
    /// as late (`not_synced`, kept in the late lane); a node that is its cluster's first
    /// (the default) finalizes alone. Two clusters started apart and merged later may each
    /// have sealed windows the other counts differently (ARCHITECTURE.md, "Seals").
    pub joining: bool,
    /// A caller's lone write of at most 64 ops, on a multi-thread tokio runtime, commits on
    /// the caller's thread when the writer is idle, instead of being handed to the writer
    /// thread and back (default on: a single op is acknowledged sooner). The caller's thread
    /// is then blocked for the commit, `fdatasync` included, so a timeout or `select!` around
    /// the call cannot fire while the disk stalls and that worker's other tasks wait (idle
    /// workers steal them). Off: every write goes through the writer thread.
    pub inline_commits: bool,
}

impl NodeConfig {
    /// Defaults for a node in `data_dir`: immediate durability, default limits.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            limits: Limits::default(),
            durability: Durability::Immediate,
            relaxed_sync_interval: Duration::from_millis(100),
            replication: crate::proto::replica::ReplicaConfig {
                gossip_interval_ms: 100,
                retransmit_timeout_ms: 1_000,
                gossip_fanout: 3,
                ..Default::default()
            },
            log_retain_entries: 10_000,
            views: Vec::new(),
            joining: false,
            inline_commits: true,
        }
    }
}
