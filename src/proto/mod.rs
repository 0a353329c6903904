//! The sans-IO replication core (docs/design/principles.md, "Replication protocol"): deterministic,
//! no tokio, no sockets, no clock, no OS randomness. Time (`now`) and a seeded RNG come in as
//! arguments; the outside world is reached only through `poll_*` outputs and the [`StateStore`]
//! trait.

pub mod message;
mod peers;
pub mod replica;
pub mod state_store;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod transfer_review_tests;
#[cfg(test)]
mod transfer_rx_tests;
#[cfg(test)]
mod transfer_rx_review_tests;
#[cfg(test)]
mod transfer_set_parts_tests;
pub(crate) mod transfer;

pub use message::Message;
pub use replica::{
    Now, RejectReason, Replica, ReplicaConfig, ReplicaEvent, ReplicaStats, Transmit,
};
pub use state_store::{
    ApplyOutcome, ChunkRead, LogInterval, MarksRead, RowPart, StateStore, TransferId,
};

/// A peer's identity as the host knows it (e.g. derived from its certificate's node name, or
/// a simulation's node index). Stable across the peer's restarts and wipes; the peer's replica
/// id and epoch tell incarnations apart.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
pub struct PeerId(pub u64);
