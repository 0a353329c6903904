//! Committed changes, numbered, kept in one shared bounded ring that every watcher reads at its
//! own position, so a watcher can resume from the last change it received.
//!
//! The writer publishes a change once it committed; it gets the next number of this node's
//! change sequence. A [`Cursor`] names a position in that sequence: `RUN-N`, the run (a random
//! id drawn each time the node opens) and the number of the last change received. The ring
//! holds the most recent changes, bounded by `limits.watch_buffer_max` changes and
//! `limits.watch_buffer_bytes_max` bytes in total, whatever the number of watchers: a watcher
//! holds only its position, so a stalled watcher costs no memory. A watcher whose next change
//! left the ring (or whose cursor names a run this node cannot vouch for) is told so once
//! ([`WatchEvent::Reset`]) and goes on from the newest change: it never skips a change
//! silently.
//!
//! Changes are recorded (their values read after each commit) while someone watches and for
//! `limits.watch_resume_secs` after the last watcher left, so a watcher that reconnects within
//! that time resumes where it stopped. When the node shuts down cleanly while recording, the
//! cursor of its last change is kept on disk: a watcher resuming from exactly that cursor after
//! the restart continues without a reset. Any other cursor of an earlier run is reset (its
//! changes after the cursor may have been lost with the run: a crash, or relaxed durability).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};
use tidemark_crdts::{Key, KeyKind, Value};
use tokio::sync::Notify;

/// One committed change: a key and its value after the commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The key that changed.
    pub key: Key,
    /// Its value after the commit.
    pub value: Value,
}

impl Change {
    /// Bytes this change holds in memory (key, value and their allocations), as counted
    /// against the ring's byte budget.
    pub fn held_bytes(&self) -> usize {
        // A string's allocation plus its header.
        let text = |s: &String| s.len() + std::mem::size_of::<String>();
        let value = match &self.value {
            Value::GCounter(_) | Value::PNCounter(_) | Value::Lww(None) => 0,
            Value::Lww(Some(v)) => text(v),
            Value::ORSet(items) | Value::MvReg(items) => items.iter().map(text).sum(),
        };
        std::mem::size_of::<Self>() + self.key.name.len() + value
    }
}

/// A position in this node's change sequence: the run that numbered it and the number of the
/// last change received (0: before the run's first change). Its text, `RUN-N` (16 hex digits,
/// a dash, a decimal number), is what an SSE event's `id` carries: opaque, shell-safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Cursor {
    run: u64,
    n: u64,
}

/// A cursor's text is not `RUN-N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a watch cursor is RUN-N (16 hex digits, a dash, a decimal number), as sent in an event's \
     id; got {0:?}"
)]
pub struct CursorError(pub String);

impl Cursor {
    /// The cursor of change `n` of run `run` (as kept on disk).
    pub(crate) fn from_parts(run: u64, n: u64) -> Self {
        Self { run, n }
    }

    /// The run id and change number (as kept on disk).
    pub(crate) fn parts(self) -> (u64, u64) {
        (self.run, self.n)
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}-{}", self.run, self.n)
    }
}

impl std::str::FromStr for Cursor {
    type Err = CursorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || CursorError(s.chars().take(64).collect());
        let (run, n) = s.split_once('-').ok_or_else(bad)?;
        if run.len() != 16 || !run.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        if n.is_empty() || n.len() > 20 || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        Ok(Self {
            run: u64::from_str_radix(run, 16).map_err(|_| bad())?,
            n: n.parse().map_err(|_| bad())?,
        })
    }
}

/// Which keys a watcher wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyFilter {
    /// Only keys of this type (`None`: every type).
    pub kind: Option<KeyKind>,
    /// Only names starting with this prefix.
    pub prefix: String,
}

impl KeyFilter {
    /// Every key.
    pub fn all() -> Self {
        Self::default()
    }
    /// Names starting with `prefix`, any type.
    pub fn prefix(prefix: &str) -> Self {
        Self {
            kind: None,
            prefix: prefix.to_owned(),
        }
    }
    /// Does `key` pass?
    pub fn matches(&self, key: &Key) -> bool {
        self.kind.is_none_or(|k| k == key.kind) && key.name.starts_with(&self.prefix)
    }
}

/// What a watcher receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key changed to `value` (published only after the change committed; durably, unless
    /// the node runs in relaxed durability). [`Watch::cursor`] is now this change's cursor.
    Changed(Change),
    /// The changes after the watcher's position are not all held any more (`missed`: how many
    /// changes it skips, of any key — the ones that left the ring and those still held after
    /// them, since it goes on after the newest; `None`: the cursor names a run this node
    /// cannot vouch for, or a position it never reached). Re-read the keys you watch; changes committed after this event
    /// follow, and [`Watch::cursor`] is where they start.
    Reset {
        /// Changes the watcher skips (of any key), when known.
        missed: Option<u64>,
    },
}

/// Why a watcher had to be reset, as the wire names it.
impl WatchEvent {
    /// `behind_retention` (changes left the ring) or `unknown_cursor` (another run's or node's
    /// cursor) for a reset; `None` for a change.
    pub fn reset_reason(&self) -> Option<&'static str> {
        match self {
            Self::Changed(_) => None,
            Self::Reset { missed: Some(_) } => Some("behind_retention"),
            Self::Reset { missed: None } => Some("unknown_cursor"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One held change.
#[derive(Debug)]
struct Held {
    change: Arc<Change>,
    bytes: usize,
    /// Bytes of every change published up to and including this one in the run.
    cum: u64,
    at: Instant,
}

#[derive(Debug)]
struct Ring {
    run: u64,
    /// Number of the oldest change held (`next` when empty).
    first: u64,
    /// Number the next change gets (changes are numbered from 1).
    next: u64,
    items: VecDeque<Held>,
    bytes: usize,
    /// Bytes of every change published in the run (see [`Held::cum`]).
    cum: u64,
    /// The cursor the previous run ended at, when it ended cleanly while recording: it names
    /// the same position as `(run, 0)`.
    previous: Option<Cursor>,
    /// Positions of the live watchers (for their lag).
    watchers: Vec<Weak<AtomicU64>>,
    /// Recording goes on until then even with no watcher (after open or a watcher left).
    record_until: Option<Instant>,
    closed: bool,
}

impl Ring {
    fn live_watchers(&mut self) -> usize {
        self.watchers.retain(|w| w.strong_count() > 0);
        self.watchers.len()
    }
    fn recording(&mut self, now: Instant) -> bool {
        self.live_watchers() > 0 || self.record_until.is_some_and(|t| now < t)
    }
}

#[derive(Debug)]
struct Shared {
    ring: Mutex<Ring>,
    ready: Notify,
    changes_max: usize,
    bytes_max: usize,
    resume: Duration,
}

/// How far behind one watcher is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Behind {
    /// Changes published after the watcher's position (of any key).
    pub changes: u64,
    /// Age of the oldest of them still held (zero when none).
    pub age: Duration,
    /// Bytes of those still held in the ring (shared: counted here for each watcher).
    pub bytes: usize,
}

/// A stream of committed changes matching a filter, from a position of the change sequence.
#[derive(Debug)]
pub struct Watch {
    shared: Arc<Shared>,
    filter: KeyFilter,
    run: u64,
    /// Number of the last change this watcher has passed (delivered or filtered out).
    pos: Arc<AtomicU64>,
    /// A reset to deliver first (the cursor asked for could not be honoured).
    pending: Option<WatchEvent>,
}

impl Watch {
    /// The next change matching the filter, a [`WatchEvent::Reset`] when the changes after
    /// this watcher's position are not all held, or `None` once the node shut down (or its
    /// last handle was dropped) and every held change was read.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        if let Some(reset) = self.pending.take() {
            return Some(reset);
        }
        loop {
            let notified = self.shared.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let found = {
                let ring = lock(&self.shared.ring);
                let pos = self.pos.load(Ordering::Relaxed);
                if pos.saturating_add(1) < ring.first {
                    // The next change this watcher needs left the ring: go on from the newest.
                    // `missed` is every change it skips: those that left and those still held
                    // after them (it resumes after the newest).
                    let missed = (ring.next - 1).saturating_sub(pos);
                    self.pos.store(ring.next - 1, Ordering::Relaxed);
                    return Some(WatchEvent::Reset {
                        missed: Some(missed),
                    });
                }
                let skip = usize::try_from(pos + 1 - ring.first).unwrap_or(usize::MAX);
                let mut n = pos;
                let mut found = None;
                for held in ring.items.iter().skip(skip) {
                    n += 1;
                    if self.filter.matches(&held.change.key) {
                        found = Some(Arc::clone(&held.change));
                        break;
                    }
                }
                self.pos.store(
                    if found.is_some() { n } else { ring.next - 1 },
                    Ordering::Relaxed,
                );
                if found.is_none() && ring.closed {
                    return None;
                }
                found
            };
            if let Some(change) = found {
                // Copied outside the lock: the writer never waits for a watcher's copy.
                return Some(WatchEvent::Changed(Arc::unwrap_or_clone(change)));
            }
            // A change published after the check wakes this future: `enable` registered it.
            notified.await;
        }
    }

    /// This watcher's position: the cursor of the last change it received (or passed over as
    /// not matching its filter). Resuming from it with [`crate::Node::watch_from`] delivers
    /// every later change exactly once, as long as they are held.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            run: self.run,
            n: self.pos.load(Ordering::Relaxed),
        }
    }

    /// How far behind the newest change this watcher is.
    pub fn behind(&self) -> Behind {
        let ring = lock(&self.shared.ring);
        behind(&ring, self.pos.load(Ordering::Relaxed), Instant::now())
    }

    /// Bytes of held changes this watcher has not read yet (they are shared with every other
    /// watcher: the ring, not the watcher, holds them).
    pub fn buffered_bytes(&self) -> usize {
        self.behind().bytes
    }

    /// A handle that reads how far behind this watcher is from elsewhere (a metrics scrape)
    /// while the watcher itself is busy in its stream. It does not keep the watcher alive.
    pub fn probe(&self) -> WatchProbe {
        WatchProbe {
            shared: Arc::clone(&self.shared),
            pos: Arc::downgrade(&self.pos),
        }
    }
}

/// Reads how far behind one [`Watch`] is without holding it (see [`Watch::probe`]).
#[derive(Clone, Debug)]
pub struct WatchProbe {
    shared: Arc<Shared>,
    pos: Weak<AtomicU64>,
}

impl WatchProbe {
    /// How far behind the newest change the watcher is ([`Watch::behind`]); `None` once the
    /// watcher was dropped.
    pub fn behind(&self) -> Option<Behind> {
        let pos = self.pos.upgrade()?.load(Ordering::Relaxed);
        let ring = lock(&self.shared.ring);
        Some(behind(&ring, pos, Instant::now()))
    }
}

fn behind(ring: &Ring, pos: u64, now: Instant) -> Behind {
    let changes = ring.next.saturating_sub(pos + 1);
    let skip = usize::try_from((pos + 1).saturating_sub(ring.first)).unwrap_or(usize::MAX);
    let (age, bytes) = match ring.items.get(skip) {
        // Bytes from this change on: the running total minus what came before it.
        Some(h) => (
            now.saturating_duration_since(h.at),
            usize::try_from(ring.cum - (h.cum - h.bytes as u64)).unwrap_or(usize::MAX),
        ),
        None => (Duration::ZERO, 0),
    };
    Behind {
        changes,
        age,
        bytes,
    }
}

impl Drop for Watch {
    /// Recording goes on for `limits.watch_resume_secs`, so this watcher can come back.
    fn drop(&mut self) {
        let mut ring = lock(&self.shared.ring);
        let until = Instant::now() + self.shared.resume;
        ring.record_until = Some(ring.record_until.map_or(until, |t| t.max(until)));
    }
}

/// Where the ring stands, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedStatus {
    /// This run's id (the `RUN` of its cursors).
    pub run: u64,
    /// Changes held now.
    pub held_changes: usize,
    /// Bytes of changes held now.
    pub held_bytes: usize,
    /// Whether changes are being recorded (someone watches, or did recently).
    pub recording: bool,
    /// How far behind each live watcher is.
    pub watchers: Vec<Behind>,
}

/// The writer's side: the numbered ring of recent changes.
#[derive(Debug)]
pub(crate) struct Feed {
    shared: Arc<Shared>,
}

impl Feed {
    /// A feed holding at most `changes_max` changes and `bytes_max` bytes (one change over
    /// `bytes_max` is still held alone), numbering changes under a fresh run id. `previous` is
    /// the cursor the previous run ended at cleanly (it then names this run's start, and
    /// recording starts at once for `resume`); `resume` is how long recording goes on with no
    /// watcher.
    pub(crate) fn new(
        changes_max: usize,
        bytes_max: usize,
        previous: Option<Cursor>,
        resume: Duration,
    ) -> Self {
        let run = u64::from_le_bytes(
            uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .unwrap_or([0x5a; 8]),
        );
        let record_until = previous.map(|_| Instant::now() + resume);
        Self {
            shared: Arc::new(Shared {
                ring: Mutex::new(Ring {
                    run,
                    first: 1,
                    next: 1,
                    items: VecDeque::new(),
                    bytes: 0,
                    cum: 0,
                    previous,
                    watchers: Vec::new(),
                    record_until,
                    closed: false,
                }),
                ready: Notify::new(),
                changes_max: changes_max.max(1),
                bytes_max,
                resume,
            }),
        }
    }

    /// A watcher of the changes after `from` (`None`: from the newest change) that match
    /// `filter`. A cursor this feed cannot honour (another run's, other than the previous run's
    /// clean end; a position not reached yet) gives a watcher whose first event is a reset.
    pub(crate) fn subscribe(&self, filter: KeyFilter, from: Option<Cursor>) -> Watch {
        let mut ring = lock(&self.shared.ring);
        let newest = ring.next - 1;
        let (pos, pending) = match from {
            None => (newest, None),
            Some(c) if c.run == ring.run && c.n <= newest => (c.n, None),
            Some(c) if Some(c) == ring.previous => (0, None),
            Some(_) => (newest, Some(WatchEvent::Reset { missed: None })),
        };
        let pos = Arc::new(AtomicU64::new(pos));
        ring.live_watchers();
        ring.watchers.push(Arc::downgrade(&pos));
        Watch {
            shared: Arc::clone(&self.shared),
            filter,
            run: ring.run,
            pos,
            pending,
        }
    }

    /// The cursor of the newest change (what a watcher subscribed now starts after).
    pub(crate) fn newest(&self) -> Cursor {
        let ring = lock(&self.shared.ring);
        Cursor {
            run: ring.run,
            n: ring.next - 1,
        }
    }

    /// Are changes recorded now? When not, the writer reads no values and calls
    /// [`Feed::skip`] instead of [`Feed::publish`].
    pub(crate) fn recording(&self) -> bool {
        lock(&self.shared.ring).recording(Instant::now())
    }

    /// A change committed while not recording: it takes a number but is not held, so every
    /// cursor before it is reset rather than resumed past it.
    pub(crate) fn skip(&self) {
        let mut ring = lock(&self.shared.ring);
        ring.next += 1;
        ring.first = ring.next;
        ring.items.clear();
        ring.bytes = 0;
        drop(ring);
        self.shared.ready.notify_waiters();
    }

    /// Holds `change` as the next of the sequence, dropping the oldest over the bounds, and
    /// wakes every watcher.
    pub(crate) fn publish(&self, change: Change) {
        let bytes = change.held_bytes();
        let mut ring = lock(&self.shared.ring);
        ring.cum += bytes as u64;
        let cum = ring.cum;
        ring.items.push_back(Held {
            change: Arc::new(change),
            bytes,
            cum,
            at: Instant::now(),
        });
        ring.bytes += bytes;
        ring.next += 1;
        while ring.items.len() > 1
            && (ring.items.len() > self.shared.changes_max || ring.bytes > self.shared.bytes_max)
        {
            if let Some(old) = ring.items.pop_front() {
                ring.bytes -= old.bytes;
                ring.first += 1;
            }
        }
        drop(ring);
        self.shared.ready.notify_waiters();
    }

    /// The cursor to keep on disk when the node closes cleanly: the newest change's, if
    /// changes are being recorded (a watcher may come back for it); `None` otherwise.
    pub(crate) fn end_cursor(&self) -> Option<Cursor> {
        let mut ring = lock(&self.shared.ring);
        if !ring.recording(Instant::now()) {
            return None;
        }
        Some(Cursor {
            run: ring.run,
            n: ring.next - 1,
        })
    }

    /// Where the ring and its watchers stand.
    pub(crate) fn status(&self) -> FeedStatus {
        let mut ring = lock(&self.shared.ring);
        let now = Instant::now();
        let recording = ring.recording(now);
        let positions: Vec<u64> = ring
            .watchers
            .iter()
            .filter_map(Weak::upgrade)
            .map(|p| p.load(Ordering::Relaxed))
            .collect();
        FeedStatus {
            run: ring.run,
            held_changes: ring.items.len(),
            held_bytes: ring.bytes,
            recording,
            watchers: positions
                .into_iter()
                .map(|p| behind(&ring, p, now))
                .collect(),
        }
    }
}

impl Drop for Feed {
    /// Every watcher's next read after the held changes is `None`.
    fn drop(&mut self) {
        lock(&self.shared.ring).closed = true;
        self.shared.ready.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, elements: usize, element_bytes: usize) -> Change {
        Change {
            key: Key::new(KeyKind::ORSet, name),
            value: Value::ORSet(
                (0..elements)
                    .map(|i| format!("{i:0width$}", width = element_bytes))
                    .collect(),
            ),
        }
    }

    fn counter(name: &str, n: u64) -> Change {
        Change {
            key: Key::new(KeyKind::GCounter, name),
            value: Value::GCounter(n),
        }
    }

    async fn next(w: &mut Watch) -> Option<WatchEvent> {
        tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .expect("a watch event")
    }

    fn feed(changes: usize, bytes: usize) -> Feed {
        Feed::new(changes, bytes, None, Duration::from_secs(600))
    }

    #[test]
    fn cursors_roundtrip_and_refuse_other_text() {
        let c = Cursor { run: 0xab, n: 42 };
        assert_eq!(c.to_string(), "00000000000000ab-42");
        assert_eq!("00000000000000ab-42".parse::<Cursor>(), Ok(c));
        for bad in [
            "",
            "ab-42",
            "00000000000000ab",
            "00000000000000ab-",
            "00000000000000ab-x",
            "00000000000000ab--1",
            "00000000000000ag-1",
            "00000000000000ab-99999999999999999999999",
        ] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad:?} accepted");
        }
    }

    #[tokio::test]
    async fn changes_arrive_in_order_and_only_matching_ones() {
        let feed = feed(16, 1 << 20);
        let mut all = feed.subscribe(KeyFilter::all(), None);
        let mut some = feed.subscribe(KeyFilter::prefix("a"), None);
        for (i, name) in ["a1", "b1", "a2"].into_iter().enumerate() {
            feed.publish(counter(name, i as u64));
        }
        for (i, name) in ["a1", "b1", "a2"].into_iter().enumerate() {
            assert_eq!(
                next(&mut all).await,
                Some(WatchEvent::Changed(counter(name, i as u64)))
            );
        }
        assert_eq!(
            next(&mut some).await,
            Some(WatchEvent::Changed(counter("a1", 0)))
        );
        assert_eq!(
            next(&mut some).await,
            Some(WatchEvent::Changed(counter("a2", 2)))
        );
        assert_eq!(all.cursor(), some.cursor());
        drop(feed);
        assert_eq!(next(&mut all).await, None);
        assert_eq!(next(&mut some).await, None);
    }

    #[tokio::test]
    async fn a_watcher_resumed_from_any_cursor_gets_every_later_change_exactly_once() {
        let feed = feed(1 << 12, 1 << 24);
        let mut w = feed.subscribe(KeyFilter::all(), None);
        let mut got = Vec::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..500u64 {
            feed.publish(counter(&format!("k{}", i % 7), i));
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // At random points the watcher goes away and comes back from its cursor.
            if rng % 5 == 0 {
                let at = w.cursor();
                drop(w);
                w = feed.subscribe(KeyFilter::all(), Some(at));
            }
            if rng % 3 == 0 {
                while w.behind().changes > 0 {
                    match next(&mut w).await {
                        Some(WatchEvent::Changed(c)) => got.push(c),
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }
        while w.behind().changes > 0 {
            if let Some(WatchEvent::Changed(c)) = next(&mut w).await {
                got.push(c);
            }
        }
        let want: Vec<Change> = (0..500u64)
            .map(|i| counter(&format!("k{}", i % 7), i))
            .collect();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn a_stalled_watcher_holds_nothing_and_is_reset_once_its_changes_left_the_ring() {
        let budget = 4 << 20;
        let feed = feed(1024, budget);
        let mut stalled = feed.subscribe(KeyFilter::all(), None);
        let mut reading = feed.subscribe(KeyFilter::all(), None);
        // 400 changes of a ~1 MiB set: the ring never holds more than its budget.
        for i in 0..400 {
            feed.publish(set(&format!("s{}", i % 3), 1024, 1000));
            assert!(feed.status().held_bytes <= budget);
            assert!(matches!(
                next(&mut reading).await,
                Some(WatchEvent::Changed(_))
            ));
        }
        assert_eq!(reading.buffered_bytes(), 0);
        assert_eq!(stalled.behind().changes, 400);
        let at = stalled.cursor();
        // It is told how many it missed, then follows new changes.
        assert_eq!(
            next(&mut stalled).await,
            Some(WatchEvent::Reset { missed: Some(400) })
        );
        feed.publish(counter("after", 1));
        assert_eq!(
            next(&mut stalled).await,
            Some(WatchEvent::Changed(counter("after", 1)))
        );
        // Resuming from a cursor behind the ring is a reset too, never a gap.
        let mut again = feed.subscribe(KeyFilter::all(), Some(at));
        assert!(matches!(
            next(&mut again).await,
            Some(WatchEvent::Reset { missed: Some(_) })
        ));
    }

    #[tokio::test]
    async fn cursors_of_other_runs_reset_except_the_clean_end_of_the_previous_one() {
        let old = feed(16, 1 << 20);
        let w = old.subscribe(KeyFilter::all(), None);
        old.publish(counter("a", 1));
        let mid = old.newest();
        old.publish(counter("a", 2));
        let end = old.end_cursor().expect("recording while watched");
        drop(w);
        let new = Feed::new(16, 1 << 20, Some(end), Duration::from_secs(600));
        assert!(new.recording(), "records from open after a clean end");
        new.publish(counter("a", 3));
        let mut resumed = new.subscribe(KeyFilter::all(), Some(end));
        assert_eq!(
            next(&mut resumed).await,
            Some(WatchEvent::Changed(counter("a", 3)))
        );
        let mut behind = new.subscribe(KeyFilter::all(), Some(mid));
        assert_eq!(
            next(&mut behind).await,
            Some(WatchEvent::Reset { missed: None })
        );
        // A position this run never reached is not resumed either.
        let ahead = Cursor {
            run: new.newest().run,
            n: 99,
        };
        let mut w = new.subscribe(KeyFilter::all(), Some(ahead));
        assert_eq!(next(&mut w).await, Some(WatchEvent::Reset { missed: None }));
    }

    #[tokio::test]
    async fn a_change_not_recorded_resets_the_cursors_before_it() {
        let feed = Feed::new(16, 1 << 20, None, Duration::ZERO);
        assert!(!feed.recording());
        let w = feed.subscribe(KeyFilter::all(), None);
        assert!(feed.recording());
        feed.publish(counter("a", 1));
        let at = w.cursor();
        drop(w);
        assert!(!feed.recording(), "no watcher, no resume window");
        feed.skip();
        let mut back = feed.subscribe(KeyFilter::all(), Some(at));
        assert!(matches!(
            next(&mut back).await,
            Some(WatchEvent::Reset { missed: Some(_) })
        ));
    }

    #[tokio::test]
    async fn a_probe_reads_the_watchers_lag_and_nothing_once_it_is_gone() {
        let feed = feed(16, 1 << 20);
        let mut w = feed.subscribe(KeyFilter::all(), None);
        let probe = w.probe();
        assert_eq!(probe.behind(), Some(Behind::default()));
        feed.publish(counter("a", 1));
        feed.publish(counter("a", 2));
        let behind = probe.behind().expect("live");
        assert_eq!(behind.changes, 2);
        assert_eq!(behind.bytes, 2 * counter("a", 1).held_bytes());
        let direct = w.behind();
        assert_eq!(
            (behind.changes, behind.bytes),
            (direct.changes, direct.bytes)
        );
        assert!(behind.age <= direct.age, "read later, older");
        next(&mut w).await;
        next(&mut w).await;
        assert_eq!(probe.behind().map(|b| b.changes), Some(0));
        drop(w);
        assert_eq!(probe.behind(), None);
        assert_eq!(feed.status().watchers.len(), 0, "a probe is no watcher");
    }

    #[tokio::test]
    async fn the_change_count_bound_holds_and_one_oversized_change_is_held() {
        let feed = self::feed(3, 100);
        let mut w = feed.subscribe(KeyFilter::all(), None);
        feed.publish(set("big", 10, 100));
        assert!(matches!(next(&mut w).await, Some(WatchEvent::Changed(c)) if c.key.name == "big"));
        let feed = self::feed(3, 1 << 20);
        let mut w = feed.subscribe(KeyFilter::all(), None);
        for i in 0..5 {
            feed.publish(counter("c", i));
        }
        assert_eq!(feed.status().held_changes, 3);
        assert_eq!(
            next(&mut w).await,
            Some(WatchEvent::Reset { missed: Some(5) })
        );
        feed.publish(counter("c", 5));
        assert_eq!(
            next(&mut w).await,
            Some(WatchEvent::Changed(counter("c", 5)))
        );
    }
}
