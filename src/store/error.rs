//! Errors of the durable store.

use crate::codec::CodecError;

/// A failure of the durable store. After any error from a write path the store is halted:
/// nothing more is acknowledged until it is reopened (no retry-and-continue after an fsync
/// error: pitfall "fsync retry", docs/design/principles.md).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another process (or another `Node` in this one) has the data directory open.
    #[error("data directory {path} is in use by another tidemark process{}", holder_note(*.holder))]
    AlreadyOpen {
        /// The database path.
        path: String,
        /// The pid of the process holding its lock, when the system says (Linux: `/proc/locks`).
        holder: Option<u32>,
    },
    /// The data directory holds what a restore from a snapshot left when it stopped before
    /// finishing (killed, or the machine went down): it is not a store to open or restore into.
    /// Nothing in it was ever served; remove the directory and restore again.
    #[error(
        "{dir} was left by a restore that did not finish ({note}); nothing in it was served: \
         remove it (rm -r {dir}) and restore again"
    )]
    RestoreUnfinished {
        /// The data directory.
        dir: String,
        /// What the restore's marker says: the snapshot and when the restore started.
        note: String,
    },
    /// redb reported an error (I/O, corruption, commit failure).
    /// (Its message carries redb's, not a separate cause: a chain of causes would print it
    /// twice.)
    #[error("storage engine: {0}")]
    Redb(redb::Error),
    /// A stored record could not be decoded: the database is corrupt or from another build.
    #[error("corrupt record in table {table}: {source}")]
    Codec {
        /// The table.
        table: &'static str,
        /// The decode error.
        source: CodecError,
    },
    /// The stored state violates an invariant the node relies on.
    #[error("stored state is inconsistent: {0}")]
    Corrupt(String),
    /// This commit group failed and was not acknowledged (the cause follows); the store now
    /// refuses writes until reopened.
    #[error("commit failed and was not acknowledged: {0}")]
    CommitFailed(String),
    /// A previous commit failed; the store accepts no more writes until reopened.
    #[error("the store stopped accepting writes after an earlier storage failure: {0}")]
    Halted(String),
    /// A local operation does not apply to its key (callers validate first; nothing was
    /// written and the store stays usable).
    #[error("invalid operation: {0}")]
    InvalidOp(String),
    /// A write would store a record (state row, log record) over `limits.record_bytes_max`,
    /// which could never be read back: nothing was written and the store stays usable.
    #[error("{what} of {len} bytes is over the record limit of {limit}")]
    TooLarge {
        /// The record.
        what: &'static str,
        /// Its encoded size.
        len: usize,
        /// `limits.record_bytes_max`.
        limit: usize,
    },
    /// The replica cannot take a fresh dot or timestamp any more (its seq `u64::MAX` was
    /// seen, or its clock reads `(u64::MAX, u32::MAX)`): nothing was written. It must restart
    /// under a new replica id; it never reissues a dot or stamps backwards.
    #[error("replica exhausted: {0}")]
    Exhausted(String),
    /// A peer asked for log entries that compaction already dropped.
    #[error("log entries below {start} were compacted")]
    LogTruncated {
        /// The first retained log seq.
        start: u64,
    },
    /// A snapshot cannot be taken, verified or restored (the message says why); nothing was
    /// left under the snapshot's or the data directory's final name.
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// Filesystem error around the database (creating the data directory).
    #[error("i/o error on {path}: {error}")]
    Io {
        /// The path.
        path: String,
        /// The OS error (in the message, not a separate cause).
        error: std::io::Error,
    },
}

impl StoreError {
    pub(crate) fn redb<E: Into<redb::Error>>(e: E) -> Self {
        StoreError::Redb(e.into())
    }
}

/// ` (pid N)` for [`StoreError::AlreadyOpen`], or nothing when the holder is unknown.
fn holder_note(holder: Option<u32>) -> String {
    match holder {
        Some(pid) if pid == std::process::id() => format!(" (this process, pid {pid})"),
        Some(pid) => format!(" (pid {pid})"),
        None => String::new(),
    }
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        StoreError::Redb(e)
    }
}
