//! Which process holds a database file locked: redb takes a `flock` on it, which Linux lists in
//! `/proc/locks` with the pid that took it and the file's device and inode.

use std::path::Path;

/// The pid of the process holding a `flock` or POSIX lock on `path`, when `/proc/locks` names
/// exactly one (`None` elsewhere than on Linux, when the file or `/proc/locks` cannot be read,
/// or when the lock was taken in another pid namespace).
pub(crate) fn lock_holder(path: &Path) -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        let dev = meta.dev();
        holder_in(
            &locks,
            (rustix::fs::major(dev), rustix::fs::minor(dev)),
            meta.ino(),
        )
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        None
    }
}

/// The one pid `locks` (the text of `/proc/locks`) names for the inode `ino`: among the entries
/// of the device `dev` when there are any, else (an overlay filesystem reports the device of the
/// layer below) among all entries for that inode. Open file description locks (`OFDLCK`,
/// pid -1) name no process.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn holder_in(locks: &str, dev: (u32, u32), ino: u64) -> Option<u32> {
    // `1: FLOCK  ADVISORY  WRITE 1234 fe:00:10011038 0 EOF`
    let entries: Vec<(u32, bool)> = locks
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // A blocked waiter's line (`1: -> FLOCK ...`) has `->` here and is skipped.
            let kind = *fields.get(1)?;
            if kind != "FLOCK" && kind != "POSIX" {
                return None;
            }
            let pid: u32 = fields.get(4)?.parse().ok()?;
            let mut id = fields.get(5)?.split(':');
            let major = u32::from_str_radix(id.next()?, 16).ok()?;
            let minor = u32::from_str_radix(id.next()?, 16).ok()?;
            let inode: u64 = id.next()?.parse().ok()?;
            (inode == ino && pid != 0).then_some((pid, (major, minor) == dev))
        })
        .collect();
    let on_dev = entries.iter().any(|(_, same_dev)| *same_dev);
    let mut pids: Vec<u32> = entries
        .into_iter()
        .filter(|(_, same_dev)| *same_dev || !on_dev)
        .map(|(pid, _)| pid)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    match pids.as_slice() {
        [pid] => Some(*pid),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::holder_in;

    const LOCKS: &str = "\
1: OFDLCK ADVISORY  WRITE -1 fe:00:10011038 0 4611686018427388799
2: OFDLCK ADVISORY  WRITE -1 fe:00:10011038 4611686018427388928 EOF
3: FLOCK  ADVISORY  WRITE 29901 fe:00:10011038 0 EOF
4: FLOCK  ADVISORY  WRITE 8697 fe:00:5548385 0 EOF
4: -> FLOCK  ADVISORY  WRITE 8700 fe:00:5548385 0 EOF
5: POSIX  ADVISORY  WRITE 1827 08:01:5548385 0 EOF
";

    #[test]
    fn the_flock_holder_of_the_inode_is_found() {
        assert_eq!(holder_in(LOCKS, (0xfe, 0), 10_011_038), Some(29_901));
        // The same inode number on another device does not count when this device has one;
        // a blocked waiter (`->`) is not the holder.
        assert_eq!(holder_in(LOCKS, (0xfe, 0), 5_548_385), Some(8697));
        assert_eq!(holder_in(LOCKS, (8, 1), 5_548_385), Some(1827));
        // An overlay reports another device: the inode alone, when it names one process.
        assert_eq!(holder_in(LOCKS, (0, 40), 10_011_038), Some(29_901));
        assert_eq!(holder_in(LOCKS, (0, 40), 5_548_385), None);
        assert_eq!(holder_in(LOCKS, (0xfe, 0), 42), None);
        assert_eq!(holder_in("", (0xfe, 0), 10_011_038), None);
    }
}
