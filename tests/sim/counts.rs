//! How often the interesting cases happened, and which of them each backend's default seeds
//! must hit (coverage).

use super::Backend;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub ops_acked: u64,
    /// Invalid groups refused (nothing written, the store not halted).
    pub ops_refused_invalid: u64,
    pub writes_while_down: u64,
    /// Acknowledged ops a wipe lost (no other node had them).
    pub ops_lost: u64,
    pub crashes: u64,
    pub crash_with_unacked: u64,
    pub crash_idle: u64,
    pub crash_during_write: u64,
    pub crash_during_delivery: u64,
    pub crash_during_tick: u64,
    /// Crashes inside a tick that compacted the log.
    pub crash_during_compaction: u64,
    /// A second crash while the reopened store recovered.
    pub crash_during_recovery: u64,
    pub images: BTreeMap<&'static str, u64>,
    /// The reopened store holds the in-flight input's commit although no sync of it was in the
    /// image (unsynced writes recovered).
    pub recovered_unsynced: u64,
    /// The in-flight client commit (never acknowledged) was kept by the image / was lost.
    pub maybe_kept: u64,
    pub maybe_lost: u64,
    /// The in-flight remote join was kept / lost.
    pub join_kept: u64,
    pub join_lost: u64,
    /// The in-flight compaction was kept / lost.
    pub compaction_kept: u64,
    pub compaction_lost: u64,
    pub wipes: u64,
    pub pauses: u64,
    pub partitions: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub compactions: u64,
    pub checkpoints: u64,
    pub transfers: u64,
    pub transfers_behind_log: u64,
    pub transfers_received: u64,
    pub later_chunks: u64,
    pub chunk_nacks: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub stale_acks: u64,
    pub retransmits: u64,
    pub evictions: u64,
    pub filtered: u64,
    pub stale_chunks: u64,
    pub rejected: u64,
    pub hlc_rejected: u64,
    pub empty_intervals: u64,
    pub events: u64,
    pub duplicate_events: u64,
    pub large_values: u64,
    pub large_batches: u64,
    /// Commit groups logged in several records.
    pub split_commits: u64,
    pub snapshots: u64,
    pub restores: u64,
    /// Restored from a snapshot of its own store / of another node's.
    pub restored_from_own: u64,
    pub restored_from_other: u64,
    /// The snapshot's source was still running under the snapshot's replica id (the restored
    /// store's seed cursor names a live log).
    pub restored_source_live: u64,
    /// A second store restored from one snapshot file.
    pub restored_twice: u64,
    /// Restores that lost acknowledged ops (held by no remaining store and not in the
    /// snapshot), and those ops.
    pub restore_lost_writes: u64,
    pub restore_lost_ops: u64,
    /// Retirements a restore lost although the retiring op survived (its commit's removal part
    /// was held only by the restored node).
    pub restore_lost_retirements: u64,
    /// Ops acknowledged by restored replicas (under their new ids).
    pub restored_ops_acked: u64,
    /// A restore under the snapshot source's replica id refused.
    pub restore_source_id_refused: u64,
    /// A restored store got its source's log from the seed cursor on, as deltas.
    pub restore_seeded_by_deltas: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        macro_rules! add { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        add!(
            ops_acked,
            ops_refused_invalid,
            writes_while_down,
            ops_lost,
            crashes,
            crash_with_unacked,
            crash_idle,
            crash_during_write,
            crash_during_delivery,
            crash_during_tick,
            crash_during_compaction,
            crash_during_recovery,
            recovered_unsynced,
            maybe_kept,
            maybe_lost,
            join_kept,
            join_lost,
            compaction_kept,
            compaction_lost,
            wipes,
            pauses,
            partitions,
            delivered,
            dropped,
            duplicated,
            compactions,
            checkpoints,
            transfers,
            transfers_behind_log,
            transfers_received,
            later_chunks,
            chunk_nacks,
            duplicates,
            gaps,
            stale_acks,
            retransmits,
            evictions,
            filtered,
            stale_chunks,
            rejected,
            hlc_rejected,
            empty_intervals,
            events,
            duplicate_events,
            large_values,
            large_batches,
            split_commits,
            snapshots,
            restores,
            restored_from_own,
            restored_from_other,
            restored_source_live,
            restored_twice,
            restore_lost_writes,
            restore_lost_ops,
            restore_lost_retirements,
            restored_ops_acked,
            restore_source_id_refused,
            restore_seeded_by_deltas
        );
        for (k, v) in &o.images {
            *self.images.entry(k).or_default() += v;
        }
    }
}

/// The coverage rows of `backend`: (case, count, asserted to occur over the default seeds).
/// Rows not asserted are too rare for the default seed counts; their code paths have unit tests.
pub fn coverage(backend: Backend, c: &Counts) -> Vec<(&'static str, u64, bool)> {
    match backend {
        Backend::Memory => vec![
            (
                "crash with unacked in-flight / queued input",
                c.crash_with_unacked,
                true,
            ),
            ("state-transfer fallback (any cause)", c.transfers, true),
            (
                "  of which: cursor behind the compacted log",
                c.transfers_behind_log,
                true,
            ),
            ("delta before its causal predecessor (gap)", c.gaps, true),
            ("duplicate interval (from < cursor)", c.duplicates, true),
            ("stale-epoch ack dropped", c.stale_acks, true),
            ("HLC timestamp above max drift", c.hlc_rejected, true),
            ("data wiped (new replica id)", c.wipes, true),
            ("acknowledged op lost by a wipe", c.ops_lost, true),
            ("peer evicted for silence", c.evictions, true),
            ("log compacted", c.compactions, true),
            ("empty (BP-only) interval sent", c.empty_intervals, true),
            ("transfer chunk after the first", c.later_chunks, true),
            ("transfer restarted (ChunkNack)", c.chunk_nacks, false),
            (
                "duplicate chunk of a completed transfer",
                c.stale_chunks,
                true,
            ),
            (
                "interval filtered by the receiver's context",
                c.filtered,
                true,
            ),
            ("idempotent event acknowledged", c.events, true),
            (
                "event retried after convergence (a no-op)",
                c.duplicate_events,
                true,
            ),
            ("large value written", c.large_values, true),
            ("large batch written", c.large_batches, true),
            ("invalid write refused", c.ops_refused_invalid, true),
            (
                "commit group logged in several records",
                c.split_commits,
                false,
            ),
        ],
        Backend::Recording => vec![
            ("crash-restart", c.crashes, true),
            ("  idle", c.crash_idle, true),
            ("  inside a client commit", c.crash_during_write, true),
            ("  inside a remote join", c.crash_during_delivery, true),
            ("  inside a timer tick", c.crash_during_tick, true),
            (
                "    of which: with a log compaction",
                c.crash_during_compaction,
                true,
            ),
            ("crash again during recovery", c.crash_during_recovery, true),
            (
                "crash image recovered unsynced writes",
                c.recovered_unsynced,
                true,
            ),
            ("unacknowledged client commit kept", c.maybe_kept, true),
            ("unacknowledged client commit lost", c.maybe_lost, true),
            ("unacknowledged remote join kept", c.join_kept, true),
            ("unacknowledged remote join lost", c.join_lost, true),
            ("compaction in flight kept", c.compaction_kept, true),
            ("compaction in flight lost", c.compaction_lost, true),
            ("state transfer", c.transfers, true),
            (
                "  cursor behind the compacted log",
                c.transfers_behind_log,
                false,
            ),
            ("transfer chunk after the first", c.later_chunks, true),
            ("duplicate interval (from < cursor)", c.duplicates, true),
            ("delta before its predecessor (gap)", c.gaps, false),
            ("stale-epoch ack dropped", c.stale_acks, false),
            (
                "duplicate chunk of a completed transfer",
                c.stale_chunks,
                false,
            ),
            ("log compacted", c.compactions, true),
            (
                "commit group logged in several records",
                c.split_commits,
                true,
            ),
            ("peer evicted for silence", c.evictions, false),
            (
                "interval filtered by the receiver's context",
                c.filtered,
                false,
            ),
            ("message duplicated", c.duplicated, true),
            ("partition", c.partitions, true),
            ("invalid write refused", c.ops_refused_invalid, false),
            (
                "remote LWW timestamp beyond the clock drift",
                c.hlc_rejected,
                false,
            ),
            ("backend log checkpoint", c.checkpoints, false),
            ("snapshot taken", c.snapshots, true),
            ("restore from a snapshot (new replica id)", c.restores, true),
            ("  of the node's own snapshot", c.restored_from_own, true),
            ("  of another node's snapshot", c.restored_from_other, true),
            (
                "  whose source still runs under its id",
                c.restored_source_live,
                true,
            ),
            ("  a second store from one snapshot", c.restored_twice, true),
            (
                "  lost acknowledged ops (no copy left)",
                c.restore_lost_writes,
                true,
            ),
            (
                "  lost a retirement of a surviving op",
                c.restore_lost_retirements,
                false,
            ),
            (
                "  refused under the source's id",
                c.restore_source_id_refused,
                true,
            ),
            (
                "  caught up from its source's log (seed cursor)",
                c.restore_seeded_by_deltas,
                true,
            ),
            (
                "op acknowledged by a restored replica",
                c.restored_ops_acked,
                true,
            ),
        ],
    }
}
