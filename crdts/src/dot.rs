//! Replica identities and dots.

use core::fmt;

/// A replica's identity: 128 bits, normally minted from a random (v4) UUID.
///
/// Guarantee: ordering and equality are those of the 128-bit integer, so every replica orders ids
/// the same way (used to break LWW ties deterministically).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ReplicaId(pub u128);

impl ReplicaId {
    /// Builds a replica id from 16 bytes (big-endian), e.g. `uuid::Uuid::as_bytes()`.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(u128::from_be_bytes(bytes))
    }

    /// The 16 big-endian bytes of this id (the UUID bytes it was built from).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }
}

impl fmt::Debug for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Short form: enough to tell replicas apart in test output.
        write!(f, "R{:08x}", (self.0 >> 96) as u32)
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A dot: the `seq`-th event created by `replica` (`seq` starts at 1).
///
/// Guarantee: a correct replica never issues the same dot twice, so a dot names one write.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
// serde: hand-written in `crate::compact` (indexed form inside a `Causal`).
pub struct Dot {
    /// The replica that created the event.
    pub replica: ReplicaId,
    /// Its per-replica sequence number, from 1.
    pub seq: u64,
}

impl Dot {
    /// Creates a dot.
    pub fn new(replica: ReplicaId, seq: u64) -> Self {
        Self { replica, seq }
    }
}
