//! Metrics-ready counters of a node (exported as Prometheus text by the HTTP API later).

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Live counters, updated by the writer and read by anyone.
#[derive(Debug, Default)]
pub struct Metrics {
    pub(crate) commits: AtomicU64,
    pub(crate) commits_inline: AtomicU64,
    pub(crate) commit_groups_ops: AtomicU64,
    pub(crate) commit_group_max: AtomicU64,
    pub(crate) commit_latency_us_sum: AtomicU64,
    pub(crate) commit_latency_us_max: AtomicU64,
    pub(crate) ops_applied: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) rejected_ops: AtomicU64,
    pub(crate) backpressure: AtomicU64,
    pub(crate) log_entries: AtomicU64,
    pub(crate) wal_bytes: AtomicU64,
    pub(crate) checkpoints: AtomicU64,
    pub(crate) compaction_reclaimed_bytes: AtomicU64,
    pub(crate) remote_rejected: AtomicU64,
    pub(crate) hlc_rejected: AtomicU64,
    pub(crate) frames_oversize: AtomicU64,
    pub(crate) reidentified: AtomicU64,
    pub(crate) status_requests: AtomicU64,
    pub(crate) commit_histograms: CommitHistograms,
    /// The applied-writes counter sampled about once a second, the last ten minutes.
    pub(crate) write_history: std::sync::Mutex<std::collections::VecDeque<WriteSample>>,
}

/// The applied-writes counter at one moment: consecutive samples give the write rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WriteSample {
    /// When (wall clock, ms since the Unix epoch).
    pub at_ms: u64,
    /// Operations and events applied since the node opened.
    pub applied: u64,
}

/// Samples [`Metrics::write_history`] keeps: ten minutes at one a second.
pub const WRITE_HISTORY_SAMPLES: usize = 600;

/// One local commit group as the writer saw it: what the driver reports after each successful
/// commit (the commit hook).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitSample {
    /// Ops carried by the group (an event or an op-less write counts as one).
    pub ops: u64,
    /// Time of the redb commit of the group (transaction and, when durable, its fsync).
    pub elapsed: Duration,
    /// Whether the commit was durable (fsync before return: `Durability::Immediate`).
    pub durable: bool,
}

/// Histograms of local commit groups, shared by every clone: each successful group adds
/// exactly one observation to `group_ops` and `commit_seconds`, and, when it was durable, one to
/// `fsync_seconds`.
#[derive(Clone, Debug)]
pub struct CommitHistograms {
    /// Ops per commit group (buckets 1, 2, 4, .. 65536).
    pub group_ops: Histogram,
    /// Seconds per commit group (buckets 50 µs .. ~26 s).
    pub commit_seconds: Histogram,
    /// Seconds per durable commit group, fsync included (`Durability::Immediate` only; relaxed
    /// groups are not durable when they commit).
    pub fsync_seconds: Histogram,
}

impl Default for CommitHistograms {
    fn default() -> Self {
        let seconds = || Histogram::new(exponential_buckets(0.000_05, 2.0, 20));
        Self {
            group_ops: Histogram::new(exponential_buckets(1.0, 2.0, 17)),
            commit_seconds: seconds(),
            fsync_seconds: seconds(),
        }
    }
}

/// A point-in-time copy of [`Metrics`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Local commit groups committed.
    pub commits: u64,
    /// Of those, groups of a lone small write committed on its caller's thread because the
    /// writer was idle (no hand-off to the writer thread and back).
    pub commits_inline: u64,
    /// Writes (ops or events) carried by those groups: `commit_groups_ops / commits` is the
    /// mean group size.
    pub commit_groups_ops: u64,
    /// Largest group so far.
    pub commit_group_max: u64,
    /// Sum of commit latencies in microseconds (mean = sum / commits).
    pub commit_latency_us_sum: u64,
    /// Largest commit latency in microseconds.
    pub commit_latency_us_max: u64,
    /// Client writes applied: ops and stream events, one each, as acknowledged to their
    /// callers (not the view cells, watermarks or records the node writes itself, nor writes
    /// replicated from peers).
    pub ops_applied: u64,
    /// Events or idempotent ops skipped as duplicates.
    pub duplicates: u64,
    /// Ops rejected by validation.
    pub rejected_ops: u64,
    /// Calls refused with backpressure.
    pub backpressure: u64,
    /// Retained delta-log entries.
    pub log_entries: u64,
    /// Bytes of write-ahead log since the last checkpoint (what a restart after a crash would
    /// replay; sampled every writer tick).
    pub wal_bytes: u64,
    /// Checkpoints of the write-ahead log since open (durable redb commits of their own).
    pub checkpoints: u64,
    /// Bytes of log entries reclaimed by compaction.
    pub compaction_reclaimed_bytes: u64,
    /// Remote deltas rejected by validation.
    pub remote_rejected: u64,
    /// Remote timestamps too far ahead for the local clock.
    pub hlc_rejected: u64,
    /// Outgoing protocol messages that could not be sent because they encode to more than
    /// `limits.frame_bytes_max` (or not at all). Always 0 while the size invariants hold
    /// (ARCHITECTURE.md); nonzero is a bug: replication to that peer is stalled.
    pub frames_oversize: u64,
    /// Times this node found its data directory to be a copy restored under its old replica id
    /// (a peer held more of that id than the store) and switched to a new replica id and epoch
    /// (docs/design/principles.md, "Never reuse a dot" (c)). Nonzero means a backup was copied back
    /// in place: prefer `tidemark serve --restore`.
    pub reidentified: u64,
    /// Replication status requests the writer thread answered ([`crate::Node::replication_status`]:
    /// each is one round trip to the writer, queued behind its commits).
    pub status_requests: u64,
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn max(counter: &AtomicU64, n: u64) {
        counter.fetch_max(n, Ordering::Relaxed);
    }

    pub(crate) fn set(counter: &AtomicU64, n: u64) {
        counter.store(n, Ordering::Relaxed);
    }

    /// Samples the applied-writes counter into the history when the last sample is at least a
    /// second old (the writer calls this on its tick); the history keeps the newest
    /// [`WRITE_HISTORY_SAMPLES`].
    pub(crate) fn sample_writes(&self, now_ms: u64) {
        let Ok(mut h) = self.write_history.lock() else {
            return;
        };
        if h.back()
            .is_some_and(|l| now_ms < l.at_ms.saturating_add(1000))
        {
            return;
        }
        if h.len() == WRITE_HISTORY_SAMPLES {
            h.pop_front();
        }
        h.push_back(WriteSample {
            at_ms: now_ms,
            applied: self.ops_applied.load(Ordering::Relaxed),
        });
    }

    /// The write history, oldest first.
    pub fn write_history(&self) -> Vec<WriteSample> {
        self.write_history
            .lock()
            .map(|h| h.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Records one successful local commit group (called by the writer after the commit).
    pub(crate) fn observe_commit(&self, sample: CommitSample) {
        let h = &self.commit_histograms;
        h.group_ops.observe(sample.ops as f64);
        h.commit_seconds.observe(sample.elapsed.as_secs_f64());
        if sample.durable {
            h.fsync_seconds.observe(sample.elapsed.as_secs_f64());
        }
    }

    /// The commit histograms (sharing the live data).
    pub fn commit_histograms(&self) -> CommitHistograms {
        self.commit_histograms.clone()
    }

    /// Copies every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            commits: g(&self.commits),
            commits_inline: g(&self.commits_inline),
            commit_groups_ops: g(&self.commit_groups_ops),
            commit_group_max: g(&self.commit_group_max),
            commit_latency_us_sum: g(&self.commit_latency_us_sum),
            commit_latency_us_max: g(&self.commit_latency_us_max),
            ops_applied: g(&self.ops_applied),
            duplicates: g(&self.duplicates),
            rejected_ops: g(&self.rejected_ops),
            backpressure: g(&self.backpressure),
            log_entries: g(&self.log_entries),
            wal_bytes: g(&self.wal_bytes),
            checkpoints: g(&self.checkpoints),
            compaction_reclaimed_bytes: g(&self.compaction_reclaimed_bytes),
            remote_rejected: g(&self.remote_rejected),
            hlc_rejected: g(&self.hlc_rejected),
            frames_oversize: g(&self.frames_oversize),
            reidentified: g(&self.reidentified),
            status_requests: g(&self.status_requests),
        }
    }
}

/// Resource use of this process, as the `process_*` metrics of Prometheus client libraries
/// report it (read from `/proc/self` on Linux).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU time spent, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_memory_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_memory_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors, when known.
    pub max_fds: Option<u64>,
    /// Start time of the process since the Unix epoch, in seconds.
    pub start_time_seconds: f64,
}

impl ProcessStats {
    /// This process's figures; `None` where `/proc/self` cannot be read (not Linux).
    pub fn read() -> Option<Self> {
        #[cfg(target_os = "linux")]
        {
            read_proc_self()
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }
}

/// `/proc/self/stat` (fields after the command name, whose parentheses may hold anything),
/// `/proc/stat`'s boot time, `/proc/self/fd` and `/proc/self/limits`.
#[cfg(target_os = "linux")]
fn read_proc_self() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields from the state (field 3) on; field n of proc(5) is at index n - 3.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
    let page = rustix::param::page_size() as u64;
    let boot_secs = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits.lines().find_map(|l| {
                l.strip_prefix("Max open files")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
        });
    Some(ProcessStats {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        resident_memory_bytes: field(24)?.saturating_mul(page),
        virtual_memory_bytes: field(23)?,
        open_fds,
        max_fds,
        start_time_seconds: boot_secs as f64 + field(22)? as f64 / ticks,
    })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn process_stats_are_read_from_proc() {
        let p = ProcessStats::read();
        let Some(p) = p else {
            panic!("/proc/self is unreadable");
        };
        assert!(p.resident_memory_bytes > 1024 * 1024, "{p:?}");
        assert!(p.virtual_memory_bytes >= p.resident_memory_bytes, "{p:?}");
        assert!(p.open_fds >= 3, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        // Started within the last day, not in the future (clock-tick rounding aside).
        assert!(
            p.start_time_seconds <= now + 1.0 && p.start_time_seconds > now - 86_400.0,
            "{p:?} now {now}"
        );
        assert!(p.cpu_seconds >= 0.0, "{p:?}");
    }
}
