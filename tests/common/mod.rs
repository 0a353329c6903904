//! Shared helpers of the crash and durability tests (docs/design/principles.md, "Testing goals"):
//! seeds that replay with `SEED=<n>`, budgets scaled by `SOAK=1`, and a fault-injecting redb
//! [`StorageBackend`] that records every write, resize and sync so crash images can be rebuilt
//! afterwards.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redb::StorageBackend;
use std::sync::{Arc, Mutex, MutexGuard};

/// True under `SOAK=1` (longer runs).
pub fn soak() -> bool {
    std::env::var("SOAK").is_ok_and(|v| v == "1")
}

/// A `usize` from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The run's seed: `SEED` if set, else drawn from the clock. Printed, so a failure names it.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| {
                    d.as_secs().wrapping_mul(1_000_000_007) ^ u64::from(d.subsec_nanos())
                })
        });
    println!("{test}: SEED={seed} (replay with SEED={seed})");
    eprintln!("{test}: SEED={seed} (replay with SEED={seed})");
    seed
}

/// A number the parent process passed to a re-executed child test through the environment.
pub fn child_env_u64(name: &str) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("child env")
}

/// A deterministic generator for `seed`.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Resident and peak memory of this process in KiB (`VmRSS`, `VmHWM` of /proc/self/status).
pub fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// One recorded backend call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rec {
    /// `write(offset, data)`.
    Write {
        /// Offset.
        offset: u64,
        /// Bytes.
        data: Vec<u8>,
    },
    /// `set_len(len)`.
    SetLen(u64),
    /// A `sync_data` that succeeded: everything before it is durable.
    Sync,
    /// A `sync_data` that failed (injected): nothing is known to be durable.
    SyncFailed,
}

#[derive(Default)]
struct State {
    live: Vec<u8>,
    recording: bool,
    log: Vec<Rec>,
    syncs: u64,
    /// The 1-based `sync_data` call that fails.
    fail_sync_at: Option<u64>,
    /// After the first injected failure, every later sync fails too.
    sticky: bool,
    failures: u64,
    /// A recording shared with other backends (one ordered log of every file's calls).
    shared: Option<(SharedRecorder, File)>,
}

impl State {
    fn record(&mut self, rec: Rec) {
        if let Some((shared, file)) = &self.shared {
            shared.push(*file, rec.clone());
        }
        if self.recording {
            self.log.push(rec);
        }
    }
}

/// Which file of a store a shared record is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum File {
    /// The redb database.
    Db,
    /// The write-ahead log.
    Wal,
}

/// One ordered record of the calls to several backends (the files of one store), so a crash
/// image is a consistent cut across them: a power loss at record `i` keeps, per file, what
/// that file's last sync before `i` made durable, plus whatever the image kind keeps of its
/// later writes ([`crash_images_at`]).
#[derive(Clone, Default)]
pub struct SharedRecorder {
    log: Arc<Mutex<Vec<(File, Rec)>>>,
}

impl SharedRecorder {
    /// An empty recording.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(File, Rec)>> {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, file: File, rec: Rec) {
        self.lock().push((file, rec));
    }

    /// An empty file whose every call is recorded here, tagged `file` (not in the backend's
    /// own log).
    pub fn backend(&self, file: File) -> FaultBackend {
        let b = FaultBackend::default();
        b.lock().shared = Some((self.clone(), file));
        b
    }

    /// A file holding `image` (recorded here as one durable write: the base of later cuts),
    /// whose every later call is recorded here too, tagged `file`.
    pub fn backend_with(&self, file: File, image: &[u8]) -> FaultBackend {
        let b = self.backend(file);
        if !image.is_empty() {
            b.write(0, image).expect("in memory");
        }
        b.sync_data().expect("in memory");
        b
    }

    /// The records so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// A copy of the records.
    pub fn log(&self) -> Vec<(File, Rec)> {
        self.lock().clone()
    }

    /// The records, leaving the recording empty (no copy).
    pub fn take(&self) -> Vec<(File, Rec)> {
        std::mem::take(&mut *self.lock())
    }
}

/// The files a crash at `log[..upto]` of a shared recording leaves behind: for each
/// `(file, kind)`, that file's records cut as [`crash_image`] cuts a single file's.
pub fn crash_images_at(
    log: &[(File, Rec)],
    upto: usize,
    kinds: &[(File, ImageKind)],
    rng: &mut ChaCha8Rng,
) -> Vec<Vec<u8>> {
    kinds
        .iter()
        .map(|(file, kind)| {
            let recs: Vec<&Rec> = log[..upto]
                .iter()
                .filter(|(f, _)| f == file)
                .map(|(_, r)| r)
                .collect();
            cut_image(&recs, *kind, rng)
        })
        .collect()
}

/// An in-memory redb backend that can record every call and fail a chosen `sync_data` with EIO.
/// Clones share the same file.
#[derive(Clone, Default)]
pub struct FaultBackend {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for FaultBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultBackend").finish_non_exhaustive()
    }
}

fn eio() -> std::io::Error {
    std::io::Error::from_raw_os_error(5)
}

fn apply(image: &mut Vec<u8>, rec: &Rec) {
    match rec {
        Rec::Write { offset, data } => {
            let at = usize::try_from(*offset).expect("offset fits");
            if image.len() < at + data.len() {
                image.resize(at + data.len(), 0);
            }
            image[at..at + data.len()].copy_from_slice(data);
        }
        Rec::SetLen(len) => image.resize(usize::try_from(*len).expect("len fits"), 0),
        Rec::Sync | Rec::SyncFailed => {}
    }
}

impl FaultBackend {
    /// An empty file that records every call.
    pub fn recording() -> Self {
        let b = Self::default();
        b.lock().recording = true;
        b
    }

    /// A file holding `image` (not recording).
    pub fn from_image(image: Vec<u8>) -> Self {
        let b = Self::default();
        b.lock().live = image;
        b
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes the `n`-th `sync_data` call (1-based, counting from now on's total) fail with EIO;
    /// with `sticky`, every later one fails too.
    pub fn fail_sync_at(&self, n: u64, sticky: bool) {
        let mut s = self.lock();
        s.fail_sync_at = Some(n);
        s.sticky = sticky;
    }

    /// `sync_data` calls so far (failed ones included).
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Injected failures so far.
    pub fn failures(&self) -> u64 {
        self.lock().failures
    }

    /// The recorded calls so far.
    pub fn log_len(&self) -> usize {
        self.lock().log.len()
    }

    /// A copy of the recorded calls.
    pub fn log(&self) -> Vec<Rec> {
        self.lock().log.clone()
    }

    /// The current file contents (as if every write reached the disk).
    pub fn live(&self) -> Vec<u8> {
        self.lock().live.clone()
    }
}

impl StorageBackend for FaultBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.lock().live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let s = self.lock();
        let at = usize::try_from(offset).map_err(|_| eio())?;
        let end = at
            .checked_add(out.len())
            .filter(|e| *e <= s.live.len())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(&s.live[at..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut s = self.lock();
        let rec = Rec::SetLen(len);
        apply(&mut s.live, &rec);
        s.record(rec);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let mut s = self.lock();
        s.syncs += 1;
        let fail = match s.fail_sync_at {
            Some(n) => s.syncs == n || (s.sticky && s.syncs > n),
            None => false,
        };
        if fail {
            s.failures += 1;
            s.record(Rec::SyncFailed);
            return Err(eio());
        }
        s.record(Rec::Sync);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut s = self.lock();
        let rec = Rec::Write {
            offset,
            data: data.to_vec(),
        };
        apply(&mut s.live, &rec);
        s.record(rec);
        Ok(())
    }
}

/// How a crash image is cut from a recorded log (simulated power loss).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// Only what the last successful sync made durable.
    DurableOnly,
    /// Durable, plus a random subset of the later writes and resizes (in order).
    DurableSubset,
    /// Durable, plus every later write, the last of them torn at a `n`-byte boundary.
    TornLast(usize),
    /// Durable, plus the later writes to the header (offset 0) but not the file extension nor
    /// any other later write (redb's `CrashBackend`).
    HeaderNotExtension,
    /// Every write up to the crash point reached the disk.
    Everything,
}

impl ImageKind {
    /// A random kind.
    pub fn pick(rng: &mut ChaCha8Rng) -> Self {
        match rng.random_range(0..6) {
            0 => ImageKind::DurableOnly,
            1 => ImageKind::DurableSubset,
            2 => ImageKind::TornLast(512),
            3 => ImageKind::TornLast(4096),
            4 => ImageKind::HeaderNotExtension,
            _ => ImageKind::Everything,
        }
    }
}

/// Index one past the last successful sync in `log[..upto]` (0 if none).
pub fn durable_prefix(log: &[Rec], upto: usize) -> usize {
    log[..upto]
        .iter()
        .rposition(|r| *r == Rec::Sync)
        .map_or(0, |i| i + 1)
}

/// The file a crash at `log[..upto]` leaves behind, as `kind` says.
pub fn crash_image(log: &[Rec], upto: usize, kind: ImageKind, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let recs: Vec<&Rec> = log[..upto].iter().collect();
    cut_image(&recs, kind, rng)
}

/// The file a crash after the calls `log` leaves behind, as `kind` says.
fn cut_image(log: &[&Rec], kind: ImageKind, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let durable = log
        .iter()
        .rposition(|r| **r == Rec::Sync)
        .map_or(0, |i| i + 1);
    let mut image = Vec::new();
    for rec in &log[..durable] {
        apply(&mut image, rec);
    }
    let tail = &log[durable..];
    match kind {
        ImageKind::DurableOnly => {}
        ImageKind::Everything => {
            for rec in tail {
                apply(&mut image, rec);
            }
        }
        ImageKind::DurableSubset => {
            let p = rng.random_range(0.0..1.0);
            for rec in tail {
                if rng.random_bool(p) {
                    apply(&mut image, rec);
                }
            }
        }
        ImageKind::TornLast(boundary) => {
            let last = tail
                .iter()
                .rposition(|r| matches!(r, Rec::Write { .. }))
                .unwrap_or(tail.len());
            for rec in &tail[..last] {
                apply(&mut image, rec);
            }
            if let Some(Rec::Write { offset, data }) = tail.get(last).copied() {
                let start = usize::try_from(*offset).expect("offset fits");
                // Cut points inside the write where the file offset is on a boundary.
                let first = (start / boundary + 1) * boundary - start;
                let cuts: Vec<usize> = (first..data.len()).step_by(boundary).collect();
                let cut = if cuts.is_empty() {
                    0
                } else {
                    cuts[rng.random_range(0..cuts.len())]
                };
                apply(
                    &mut image,
                    &Rec::Write {
                        offset: *offset,
                        data: data[..cut].to_vec(),
                    },
                );
            }
        }
        ImageKind::HeaderNotExtension => {
            let len = image.len();
            for rec in tail {
                if let Rec::Write { offset: 0, data } = rec {
                    let n = data.len().min(len);
                    image[..n].copy_from_slice(&data[..n]);
                }
            }
        }
    }
    image
}

pub mod rebase;
pub mod workload;

/// Runs `run(seed)` for seeds `first..first + seeds` (`first` from env `SEED_START`, default 1)
/// on up to `max_threads` threads, catching panics.
/// Returns every seed's result in seed order; a failure is the panic message with how to replay
/// the seed (`SEED=<n>`). Panics, after printing every failure, when any seed failed.
pub fn run_seeds<R: Send>(
    seeds: u64,
    max_threads: usize,
    run: impl Fn(u64) -> R + Sync,
) -> Vec<(u64, R)> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, max_threads.max(1)) as u64;
    let run = &run;
    let first = std::env::var("SEED_START")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1);
    let results: Vec<(u64, Result<R, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (first..first + seeds)
                        .filter(|seed| seed % threads == t)
                        .map(|seed| {
                            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                run(seed)
                            }))
                            .map_err(|e| {
                                let msg = e
                                    .downcast_ref::<String>()
                                    .cloned()
                                    .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                                    .unwrap_or_default();
                                format!("seed {seed} FAILED (replay with SEED={seed}): {msg}")
                            });
                            (seed, r)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<_> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("worker"))
            .collect();
        all.sort_by_key(|(seed, _)| *seed);
        all
    });
    let failures: Vec<&String> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    for f in &failures {
        eprintln!("{f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {seeds} seeds failed",
        failures.len()
    );
    results
        .into_iter()
        .filter_map(|(seed, r)| r.ok().map(|r| (seed, r)))
        .collect()
}
