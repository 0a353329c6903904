//! The deterministic cluster simulator (docs/design/principles.md, "Testing goals"), shared by
//! `tests/sim.rs` and `tests/sim_redb.rs`.
//!
//! [`Replica`](tidemark::proto::Replica)s over the production [`RedbStore`](tidemark::store::RedbStore)
//! exchange messages through a simulated network in virtual time; one seed drives everything
//! (one `ChaCha8Rng`, `BTreeMap`s only), and the same seed gives the same trace hash. Each node's
//! store runs on a `tests/common` [`FaultBackend`](crate::common::FaultBackend); the
//! [`Backend`] decides what a crash does and which faults the schedule draws:
//!
//! * [`Backend::Memory`]: five nodes, an in-memory backend. The nemesis partitions (five shapes),
//!   drops, duplicates, delays/reorders, pauses, crashes, wipes (new replica id: the one allowed
//!   loss) and skews clocks by up to an hour; clients write on every node, including idempotent
//!   events from many sources, large values and large batches. A crash reopens the store from
//!   everything it wrote (each commit is synced) and must serve exactly what the crashed one did.
//! * [`Backend::Recording`]: 3–4 nodes (or a fixed shape), a recording backend and small
//!   limits and caches. A node crashes idle or inside a client commit, a remote delta/chunk join
//!   or a timer tick with its compaction, and reopens from a crash image cut anywhere inside
//!   that input (`crash.rs`); snapshots are taken and nodes are restored from them under new
//!   replica ids (`restore.rs`).
//!
//! Checked on both backends:
//!
//! * After every input (`checks.rs`): whatever the input committed was synced before it
//!   returned; no node is ever detected as a restored copy; and, whenever the input changed the
//!   node's state, the context has not shrunk, own dots are contiguous, every stored dot is in
//!   the context, a causal counter holds at most one live dot per replica and the HLC mark has
//!   not gone back. `verify` holds after every input that committed something (on the memory
//!   backend in one seed of fifty: there it costs more than every other check together), after
//!   every reopen and at the end. No effect delivered to a node and retired there lacks a
//!   witness (an op that retired it and that some node still holds); the harness tracks which
//!   ops' effects reached each node (its own commits, what a delta or a transfer's last chunk
//!   carried whose sender had it, what a kept crash image or a restored snapshot holds), and
//!   that, not what a context claims, is the oracle's happens-before.
//! * Every message fits in `frame_bytes_max`. Dots (`dots.rs`): a cluster-wide map dot → op of
//!   every acknowledged (or crash-kept) commit never sees a dot twice, every commit takes exactly
//!   the next dots of the store's current id, and every dot in a message sent, a reopened store
//!   and a final store stands for the op that issued it.
//! * Writes (`clients.rs`): a write is acknowledged only once `commit_local` returned `Ok` after
//!   a sync; an invalid group (a counter delete) is refused without writing anything or halting;
//!   a duplicate event is a no-op.
//! * After the schedule (`checks.rs`): heal, stop writes, and require convergence within the
//!   backend's deadline to byte-identical states equal to the sequential-specification oracle
//!   (`oracle.rs`) over the acknowledged (minus allowed-lost) ops; every store holds every
//!   surviving acknowledged dot, passes `verify` and redb's integrity check, reopens from its
//!   durable image to the same state, and reads its whole retained log back; every surviving
//!   event retried at a random node is a no-op. Where compaction keeps no entries back (the
//!   memory backend; recording seeds whose `log_retain` is 0) every log drains once all peers
//!   acknowledged it.
//! * Coverage (`counts.rs`): each interesting case of the backend occurs over the default seeds.

pub mod checks;
pub mod clients;
pub mod counts;
pub mod crash;
pub mod dots;
pub mod harness;
pub mod oracle;
pub mod restore;
pub mod run;
pub mod workload;

/// What each node's store runs on, and so which faults the schedule draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// An in-memory redb backend: the five-node nemesis run (pauses, wipes, clock skew, events).
    Memory,
    /// A recording redb backend: crash images inside inputs, snapshots and restores.
    #[allow(dead_code)] // `tests/sim.rs` runs the memory backend only
    Recording,
}

impl Backend {
    /// Virtual time during which the schedule acts.
    pub fn fault_window_ms(self) -> u64 {
        match self {
            Backend::Memory => 60_000,
            Backend::Recording => 90_000,
        }
    }

    /// Virtual time allowed from the heal until every store is identical.
    pub fn converge_ms(self) -> u64 {
        match self {
            Backend::Memory => 30_000,
            Backend::Recording => 60_000,
        }
    }
}
