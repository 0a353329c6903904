//! Every bound the node enforces and its durability mode: a leaf that every layer may use.

/// Every bound the node enforces, with documented defaults. Units and qualifiers come last in
/// each name (`frame_bytes_max`). Local callers over a limit get a typed error or backpressure;
/// peers over a limit get their message rejected and counted.
///
/// In a TOML config (`[limits]`) every field is optional (missing ones take the default) and an
/// unknown key is rejected by name.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Longest key name in bytes (default 256, API.md).
    pub key_bytes_max: usize,
    /// Largest canonical JSON value of a register in bytes (default 64 KiB).
    pub value_bytes_max: usize,
    /// Largest canonical JSON element of a set in bytes (default 1 KiB).
    pub element_bytes_max: usize,
    /// Most ops or events in one `apply_batch`/`ingest` call (default 10,000).
    pub batch_ops_max: usize,
    /// Most ops waiting for the writer across all callers; beyond it callers get
    /// `Error::Backpressure` instead of queueing (default 100,000).
    pub write_queue_ops_max: usize,
    /// Most ops committed in one group-commit transaction (default 20,000).
    pub commit_group_ops_max: usize,
    /// Largest encoded protocol frame, checked before decoding (default 4 MiB).
    pub frame_bytes_max: usize,
    /// Target size of one delta-interval or state chunk sent to a peer (default 1 MiB); also the
    /// per-peer in-flight bound, as at most one unacknowledged message is in flight per peer.
    pub message_bytes_target: usize,
    /// Largest disk record (state row, log entry) decoded at recovery (default 64 MiB).
    pub record_bytes_max: usize,
    /// Most recent changes the node holds for watchers to read and resume from (default
    /// 65,536), shared by every watcher: one further behind is reset (`watch.rs`).
    pub watch_buffer_max: usize,
    /// Most bytes of recent changes (keys and whole values) held for watchers (default
    /// 16 MiB), shared by every watcher: a watcher that stops reading holds nothing of its
    /// own, so this bounds the feed's memory whatever the number of watchers (one change
    /// larger than it is still held alone).
    pub watch_buffer_bytes_max: usize,
    /// How long changes are still recorded after the last watcher left, and after a clean
    /// restart that ended while recording (default 600 s): a watcher that comes back within it
    /// resumes from its cursor; after it, its next changes are not held and it is reset.
    pub watch_resume_secs: u64,
    /// Most bytes of late events kept per stream in the late lane (default 16 MiB): past it the
    /// oldest are dropped first, and counted.
    pub late_bytes_max: usize,
    /// redb page cache in bytes (default 64 MiB): with per-key rows this bounds resident memory.
    pub cache_bytes: usize,
    /// How far ahead of our clock a remote HLC timestamp may be before our clock refuses to
    /// follow it (default 500 ms).
    pub max_clock_drift_ms: u64,
    /// Most streams × sources tracked for dedup marks in one ingest call (default 10,000).
    /// Over it the call is refused with `too_large` (field `source`), nothing applied.
    pub sources_per_batch_max: usize,
    /// Most disjoint seq ranges kept per `(stream, source)` (default 1,024). A source whose
    /// seqs arrive with gaps grows one range per gap; an event whose seq would open a range
    /// beyond this bound is refused (`Error::DedupGaps`, nothing of it applied), never silently
    /// treated as a duplicate, so no acknowledged write is lost and none is counted twice. It
    /// bounds each dedup row (about 20 bytes a range) and so the cost of rewriting it.
    pub dedup_ranges_max: usize,
    /// Bytes of the in-memory record of the elements this node's `distinct` view cells are
    /// known to hold under its own dot (default 8 MiB; 0 disables it). Past it the least
    /// recently used cells are dropped; a cell not recorded costs one element-row read per
    /// element of an ingest batch, never a wrong value (`views::held`).
    pub view_held_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            key_bytes_max: 256,
            value_bytes_max: 64 * 1024,
            element_bytes_max: 1024,
            batch_ops_max: 10_000,
            write_queue_ops_max: 100_000,
            commit_group_ops_max: 20_000,
            frame_bytes_max: 4 * 1024 * 1024,
            message_bytes_target: 1024 * 1024,
            record_bytes_max: 64 * 1024 * 1024,
            watch_buffer_max: 65_536,
            watch_buffer_bytes_max: 16 * 1024 * 1024,
            watch_resume_secs: 600,
            late_bytes_max: 16 * 1024 * 1024,
            cache_bytes: 64 * 1024 * 1024,
            max_clock_drift_ms: 500,
            sources_per_batch_max: 10_000,
            dedup_ranges_max: 1024,
            view_held_bytes: 8 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// Checks how the limits relate, so that every message and record the node writes fits
    /// where it must by construction: a value or element fits a message with room for the
    /// envelope (`value_bytes_max`, `element_bytes_max` ≤ `message_bytes_target` / 4), a
    /// message fits a frame twice over (`message_bytes_target` ≤ `frame_bytes_max` / 2), a frame
    /// fits a disk record (`frame_bytes_max` ≤ `record_bytes_max`, so any log record is
    /// readable), and a batch fits the queue and a commit group.
    ///
    /// # Errors
    /// A message naming the offending field.
    pub fn validate(&self) -> Result<(), String> {
        let nonzero = [
            ("key_bytes_max", self.key_bytes_max),
            ("value_bytes_max", self.value_bytes_max),
            ("element_bytes_max", self.element_bytes_max),
            ("batch_ops_max", self.batch_ops_max),
            ("write_queue_ops_max", self.write_queue_ops_max),
            ("commit_group_ops_max", self.commit_group_ops_max),
            ("frame_bytes_max", self.frame_bytes_max),
            ("message_bytes_target", self.message_bytes_target),
            ("record_bytes_max", self.record_bytes_max),
            ("watch_buffer_max", self.watch_buffer_max),
            ("watch_buffer_bytes_max", self.watch_buffer_bytes_max),
            ("late_bytes_max", self.late_bytes_max),
            ("sources_per_batch_max", self.sources_per_batch_max),
            ("dedup_ranges_max", self.dedup_ranges_max),
        ];
        if let Some((name, _)) = nonzero.iter().find(|(_, v)| *v == 0) {
            return Err(format!("limits.{name} must be positive"));
        }
        if self.message_bytes_target.saturating_mul(2) > self.frame_bytes_max {
            return Err(
                "limits.message_bytes_target must be at most half of limits.frame_bytes_max".into(),
            );
        }
        if self.batch_ops_max > self.write_queue_ops_max {
            return Err("limits.batch_ops_max must not exceed limits.write_queue_ops_max".into());
        }
        if self.value_bytes_max.saturating_add(self.key_bytes_max) * 4 > self.message_bytes_target {
            return Err(
                "limits.message_bytes_target must hold at least four maximal values".into(),
            );
        }
        if self.element_bytes_max.saturating_add(self.key_bytes_max) * 4 > self.message_bytes_target
        {
            return Err(
                "limits.message_bytes_target must hold at least four maximal set elements".into(),
            );
        }
        if self.frame_bytes_max > self.record_bytes_max {
            return Err("limits.frame_bytes_max must not exceed limits.record_bytes_max".into());
        }
        if self.batch_ops_max > self.commit_group_ops_max {
            return Err("limits.batch_ops_max must not exceed limits.commit_group_ops_max".into());
        }
        Ok(())
    }
}

/// When a write is acknowledged (docs/design/principles.md, "Acknowledged means durable").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Acknowledge after the redb transaction holding the write is durably committed (default).
    #[default]
    Immediate,
    /// Acknowledge after the commit without fsync; a crash may lose the writes of commits since
    /// the last durable one (at most `relaxed_sync_interval`). Opt-in.
    ///
    /// Only local callers (and watchers) see writes early: peers are served, announced and
    /// acknowledged durable state only, so a crash never makes the node reissue a dot a peer
    /// holds. A relaxed write therefore reaches peers after the next durable commit: while a
    /// peer is connected one is forced at the replication core's next timer (its gossip tick,
    /// `replication.gossip_interval_ms`), so writes are served within about one gossip
    /// interval whatever `relaxed_sync_interval` is; every remote join is made durable before
    /// it is acknowledged.
    Relaxed,
}
