//! # Tidemark
//!
//! A replicated stream state store: nodes ingest events and operations into lattice-typed state
//! (counters, add-wins sets, LWW and multi-value registers) built as delta-state CRDTs, keep it
//! durably in redb, and converge with their peers by delta anti-entropy.
//!
//! Layers, lowest first (the table of ARCHITECTURE.md, "Layers", enforced by
//! `tests/node/layering.rs`; no import runs back up): [`tidemark_crdts`] (pure lattices) → the
//! leaves [`limits`], `clock`, `metrics`, `codec`, `model`, [`api`] (the HTTP API's JSON
//! bodies as types, shared by the server and clients) → `proto` (sans-IO replication core)
//! → `admission` → `store` (redb) and [`net`] (QUIC), which do not know
//! each other → [`error`] → [`ops`] → [`views`] → [`config`] → the writer thread → the embedded
//! `Node` → `http`.
//!
//! The modules shown without a link are internal: public only with the `testing` feature (for the
//! crate's simulations, crash suites, benches and fuzzers; not a stable API). The types of theirs
//! that appear in the public API are re-exported at the crate root.
//!
//! ## Example
//! ```
//! use tidemark::{Key, KeyKind, Node, NodeConfig, Op, Value};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = tokio::runtime::Runtime::new()?;
//! runtime.block_on(async {
//!     let dir = tempfile::tempdir()?;
//!     let node = Node::open(NodeConfig::new(dir.path())).await?;
//!     node.apply(Op::inc_gcounter("visits", 2)).await?; // durable when it returns
//!     let visits = node.get(&Key::new(KeyKind::GCounter, "visits"))?;
//!     assert_eq!(visits, Value::GCounter(2));
//!     node.shutdown().await?;
//!     Ok(())
//! })
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// Every type a public item mentions is nameable by users (internal types stay internal).
#![deny(unnameable_types)]

/// Declares a module that is internal (`pub(crate)`) unless the `testing` feature is on; with
/// it, the module is public for the simulations, crash suites, benches and fuzzers. Nothing in
/// such a module is a stable API: what an embedded user needs is re-exported below.
macro_rules! internal {
    ($(#[$attr:meta])* $name:ident) => {
        #[cfg(feature = "testing")]
        $(#[$attr])*
        pub mod $name;
        #[cfg(not(feature = "testing"))]
        #[allow(dead_code, unreachable_pub, unused_imports)]
        $(#[$attr])*
        pub(crate) mod $name;
    };
}

/// Declares a function of a public module that is internal (`pub(crate)`) unless the
/// `testing` feature is on (as [`internal!`] does for modules): for functions whose types
/// belong to an internal module.
macro_rules! testing_pub {
    ($(#[$attr:meta])* fn $name:ident $($rest:tt)*) => {
        #[cfg(feature = "testing")]
        $(#[$attr])*
        pub fn $name $($rest)*
        #[cfg(not(feature = "testing"))]
        $(#[$attr])*
        pub(crate) fn $name $($rest)*
    };
}

internal!(admission);
pub mod api;
mod clock;
internal!(codec);
pub mod config;
mod driver;
pub mod error;
#[cfg(feature = "server")]
pub mod http;
pub mod limits;
internal!(metrics);
internal!(model);
pub mod net;
mod node;
pub mod ops;
internal!(proto);
internal!(store);
pub mod views;
mod watch;

pub use config::NodeConfig;
pub use driver::{CompactReport, ReplicationStatus};
pub use error::Error;
pub use limits::{Durability, Limits};
pub use node::{Node, Removal, WriteOutcome};
pub use ops::{Event, Op, value_to_json};
pub use tidemark_crdts::{Key, KeyKind, ReplicaId, Value};
pub use watch::{
    Behind, Change, Cursor, CursorError, FeedStatus, KeyFilter, Watch, WatchEvent, WatchProbe,
};

pub use tidemark_crdts as crdts;

// Types of the internal modules that appear in the public API (results of `Node` calls, error
// causes, configuration), and the data-directory helpers the `tidemark` binary uses.
pub use codec::CodecError;
pub use metrics::{CommitHistograms, MetricsSnapshot, WriteSample};
pub use model::{ChangedIter, ChangedKeys, Delta, Rejected};
pub use proto::{ApplyOutcome, PeerId, ReplicaConfig, ReplicaStats};
pub use store::{
    DB_FILE, DeltasSince, EventId, LateMark, LateNote, LatePage, LateTotals, LogBytes,
    SnapshotInfo, StoreError, file_identity, publish_file, restore_snapshot, snapshot_data_dir,
    verify_snapshot,
};
