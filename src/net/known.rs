//! Members a node knew, kept across its restarts in `members.json` in its data directory (as
//! Serf keeps a snapshot of its members): a restarted node dials them again, so it rejoins its
//! cluster without `--join` (a seed restarts too, and every other member saw it leave), and it
//! still lists the members it has not heard from since it started (down, or removed for good).
//!
//! The file is JSON, written whole (a temporary file, fsync, rename) when SWIM's view adds or
//! moves a member; reading it is bounded ([`BYTES_MAX`], [`MEMBERS_MAX`]) and a file that does
//! not parse is ignored with a warning: it is a hint for rejoining, never state.

use super::{MemberState, MemberStatus};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;

/// The file's name in the data directory.
pub const FILE: &str = "members.json";

/// Largest file read (bytes); a larger one is ignored.
pub const BYTES_MAX: u64 = 1 << 20;

/// Most members kept (the most recently seen first).
pub const MEMBERS_MAX: usize = 1024;

/// A member as the file keeps it: its name, the address it listened at when last seen and its
/// replica id (hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownMember {
    /// The node name.
    pub name: String,
    /// Its peer endpoint address, as last announced.
    pub addr: SocketAddr,
    /// Its replica id (hex), as last announced.
    pub replica: String,
}

/// The members kept in `dir` (empty when there is no file, or it cannot be read or parsed: a
/// warning says which).
pub fn load(dir: &Path) -> Vec<KnownMember> {
    let path = dir.join(FILE);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the known members");
            return Vec::new();
        }
    };
    let mut text = String::new();
    if let Err(e) = file.take(BYTES_MAX + 1).read_to_string(&mut text) {
        tracing::warn!(path = %path.display(), error = %e, "cannot read the known members");
        return Vec::new();
    }
    if text.len() as u64 > BYTES_MAX {
        tracing::warn!(path = %path.display(), "known members file over 1 MiB: ignored");
        return Vec::new();
    }
    // Entry by entry: one bad entry costs that member, not the others (a node that cannot
    // name its members cannot rejoin them).
    let entries = match serde_json::from_str::<Vec<serde_json::Value>>(&text) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "known members file ignored");
            return Vec::new();
        }
    };
    let mut members = Vec::new();
    for entry in entries.into_iter().take(MEMBERS_MAX) {
        match serde_json::from_value::<KnownMember>(entry) {
            Ok(m) => members.push(m),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "known member entry ignored");
            }
        }
    }
    members
}

/// Merges SWIM's view `members` into `known` (this node, `me`, left out): a member seen now
/// moves to the front with its current address and replica. Returns whether `known` changed.
pub fn merge(known: &mut Vec<KnownMember>, members: &[MemberStatus], me: &str) -> bool {
    let before = known.clone();
    for m in members.iter().rev() {
        if m.name == me {
            continue;
        }
        known.retain(|k| k.name != m.name);
        known.insert(
            0,
            KnownMember {
                name: m.name.clone(),
                addr: m.addr,
                replica: m.replica.clone(),
            },
        );
    }
    known.truncate(MEMBERS_MAX);
    *known != before
}

/// Writes `known` to `dir` whole: a temporary file, fsync, rename, so a crash leaves the old
/// file or the new one.
///
/// # Errors
/// The OS error of the write, fsync or rename.
pub fn save(dir: &Path, known: &[KnownMember]) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(known).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    // Owner only, as the database beside it.
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp)?;
    f.write_all(&text)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(FILE))
}

/// The members of `known` SWIM does not know (`swim`), shown as down: not heard from since
/// this node started. Their replica id is the one last seen; `last_contact_ms` is `None`.
pub fn unheard(known: &[KnownMember], swim: &[MemberStatus], me: &str) -> Vec<MemberStatus> {
    known
        .iter()
        .filter(|k| k.name != me && !swim.iter().any(|m| m.name == k.name))
        .map(|k| MemberStatus {
            name: k.name.clone(),
            addr: k.addr,
            state: MemberState::Down,
            incarnation: 0,
            replica: k.replica.clone(),
            epoch: 0,
            last_contact_ms: None,
            left: false,
            version: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, port: u16) -> MemberStatus {
        MemberStatus {
            name: name.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            state: MemberState::Alive,
            incarnation: 0,
            replica: format!("{name}-replica"),
            epoch: 1,
            last_contact_ms: Some(5),
            left: false,
            version: None,
        }
    }

    #[test]
    fn members_are_kept_across_a_save_and_listed_when_unheard() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(load(dir.path()).is_empty());
        let mut known = Vec::new();
        assert!(merge(
            &mut known,
            &[member("me", 1), member("beta", 2), member("gamma", 3)],
            "me"
        ));
        assert!(!merge(&mut known, &[member("beta", 2)], "me"));
        // A member seen at a new address is kept at the new one, first.
        assert!(merge(&mut known, &[member("gamma", 4)], "me"));
        assert_eq!(known[0].addr.port(), 4);
        save(dir.path(), &known).expect("save");
        let back = load(dir.path());
        assert_eq!(back, known);
        let down = unheard(&back, &[member("beta", 2)], "me");
        assert_eq!(down.len(), 1);
        assert_eq!(down[0].name, "gamma");
        assert_eq!(down[0].state, MemberState::Down);
        assert_eq!(down[0].last_contact_ms, None);
    }

    #[test]
    fn a_file_that_does_not_parse_or_is_too_large_is_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE), "not json").expect("write");
        assert!(load(dir.path()).is_empty());
        // One bad entry costs only itself.
        std::fs::write(
            dir.path().join(FILE),
            r#"[{"name": 1}, {"name": "b", "addr": "127.0.0.1:7", "replica": "r"}]"#,
        )
        .expect("write");
        let kept = load(dir.path());
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].name, "b");
        let big = vec![b' '; usize::try_from(BYTES_MAX).unwrap_or(0) + 10];
        std::fs::write(dir.path().join(FILE), big).expect("write");
        assert!(load(dir.path()).is_empty());
    }
}
