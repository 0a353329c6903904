//! # tidemark-crdts
//!
//! Pure delta-state CRDTs over dot stores with a compact causal context: the lattice layer of
//! Tidemark. No I/O, no async runtime, no clock reads: time and replica ids come in as
//! arguments. Nothing observable depends on randomness: every result, equality, hash, `Debug`
//! output and encoding is a deterministic function of the inputs. The one random thing is
//! internal layout: the hash seed of [`ORSet`]'s element table is drawn once per process (from
//! `std`'s `RandomState`, i.e. the operating system), against chosen-collision (HashDoS)
//! attacks through untrusted elements; it decides only where entries sit in the table's index,
//! and the set sorts wherever order is observable.
//!
//! ## The model
//! * A **dot** `(replica, seq)` names one event. A [`CausalContext`] is the set of dots a replica
//!   has seen, kept per replica as ranges (a version vector plus a "dot cloud").
//! * A **causal CRDT** is a pair `(store, context)` ([`Causal`]); the store is a [`DotSet`],
//!   [`DotFun`] or [`DotMap`]. Joining keeps a dot iff both sides hold it or the other side has
//!   never seen it, so a removal is "put the dot in the context with no entry": no tombstones.
//! * Every type offers **delta-mutators** that return the small delta of the change; joining the
//!   delta into any replica has the same effect as the change itself (`X ⊔ m^δ(X) = m(X)`).
//! * **Redundancy removal** (`inflation`) extracts the part of a received delta that is new, so
//!   a node stores and forwards only that.
//!
//! ## The types
//! [`GCounter`], [`PNCounter`] (state-based, saturating), [`ORSet`] (add-wins), [`MVRegister`],
//! [`LWWRegister`] over [`Timestamp`]s from a hybrid logical clock [`Hlc`], and the store-level
//! causal map of [`causal_map`] (`(type, name)` keys to typed values sharing one context), which is
//! exactly a Tidemark node's replicated state.
//!
//! ## Example: add wins, in any delivery order
//! ```
//! use tidemark_crdts::{ORSet, ReplicaId};
//! let (a, b) = (ReplicaId(1), ReplicaId(2));
//! let (mut alice, mut bob) = (ORSet::new(), ORSet::new());
//! bob.apply(alice.add(a, "x")?);
//! // Concurrently: alice removes "x" while bob adds it again.
//! let remove = alice.remove(&"x");
//! let re_add = bob.add(b, "x")?;
//! alice.apply(re_add);
//! bob.apply(remove);
//! assert!(alice.contains(&"x"));
//! assert_eq!(alice, bob);
//! # Ok::<(), tidemark_crdts::DotsExhausted>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod causal_map;
#[cfg(feature = "serde")]
pub mod compact;
pub mod context;
pub mod counter;
pub mod dot;
pub mod dotstore;
mod elem_table;
pub mod hlc;
pub mod interval;
pub mod lww;
pub mod mvreg;
pub mod orset;
mod strict_map;

pub use causal_map::{
    DedupMarks, Entry, Json, Key, KeyKind, MemStore, Mutation, MutationError, Rows, Store,
    StoreDelta, Value,
};
pub use context::{CausalContext, DotsExhausted, VersionVector};
pub use counter::{GCounter, PNCounter};
pub use dot::{Dot, ReplicaId};
pub use dotstore::{AdmitsChild, Causal, DotFun, DotMap, DotSet, DotStore};
pub use hlc::{Hlc, HlcError, Timestamp};
pub use interval::IntervalSet;
pub use lww::LWWRegister;
pub use mvreg::{MVRegister, MVRegisterDelta};
pub use orset::{ORSet, ORSetDelta};

/// A join-semilattice.
///
/// Guarantee for every implementation: `join` is commutative, associative and idempotent, and
/// never fails or panics, whatever (decoded) input it is given.
pub trait Lattice {
    /// `self := self ⊔ other`.
    fn join(&mut self, other: Self);
    /// True for the bottom element.
    fn is_bottom(&self) -> bool;
}

impl<S: DotStore> Lattice for Causal<S> {
    fn join(&mut self, other: Self) {
        Causal::join(self, other);
    }
    fn is_bottom(&self) -> bool {
        Causal::is_bottom(self)
    }
}
