//! Snapshot files written into the data directory to be streamed out of a running node
//! (`GET /v1/snapshot`): where they live, how much room they need, and the leftovers of a
//! crashed process. The data directory's layout is known here, not in the HTTP layer.
//!
//! Guarantees: such a file is a complete verified snapshot ([`super::snapshot`]) opened and
//! then unlinked before it is handed out, so no copy outlives its reader; leftovers (the
//! published names and the snapshot writer's own hidden temporaries) are removable at any
//! time no such snapshot is being written.

use super::DB_FILE;
use std::path::{Path, PathBuf};

/// Prefix of the streamed snapshot files in the data directory.
const TEMP_PREFIX: &str = ".http-snapshot-";

/// Free space a snapshot must leave in the data directory besides its own size: the node's
/// writes go on meanwhile, and a full disk would halt them.
pub const ROOM_SPARE_BYTES: u64 = 256 << 20;

/// Removes streamed snapshot files a crashed process left in `dir` (call only while no
/// snapshot is being streamed): the published ones and the writer's hidden temporaries
/// (`.<name>.tmp-…`).
pub fn remove_stream_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let ours = TEMP_PREFIX.trim_start_matches('.');
    for e in entries.flatten() {
        if e.file_name()
            .to_string_lossy()
            .trim_start_matches('.')
            .starts_with(ours)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A fresh path for a streamed snapshot in the data directory `dir`.
pub fn stream_snapshot_path(dir: &Path) -> PathBuf {
    dir.join(format!("{TEMP_PREFIX}{}.tmsnap", uuid::Uuid::new_v4()))
}

/// `Err` with a message when the filesystem of the data directory `dir` has less free space
/// than the database (an upper bound of a snapshot's size: it holds the same rows without the
/// log) plus [`ROOM_SPARE_BYTES`].
///
/// # Errors
/// A message saying how much room there is and how much a snapshot needs.
pub fn check_snapshot_room(dir: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        let need = std::fs::metadata(dir.join(DB_FILE))
            .map_or(0, |m| m.len())
            .saturating_add(ROOM_SPARE_BYTES);
        if let Ok(st) = rustix::fs::statvfs(dir) {
            let free = st.f_bavail.saturating_mul(st.f_frsize);
            if free < need {
                return Err(format!(
                    "the data directory has {} MiB free; a snapshot of this node needs about {} MiB \
                     there (the database's size plus {} MiB for the node's own writes)",
                    free >> 20,
                    need >> 20,
                    ROOM_SPARE_BYTES >> 20
                ));
            }
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// The `device:inode` identity of the database file in the data directory `dir` (see
/// [`super::file_identity`]), so a client can tell which node holds a directory.
pub fn data_file_identity(dir: &Path) -> Option<String> {
    super::file_identity(&dir.join(DB_FILE))
}
