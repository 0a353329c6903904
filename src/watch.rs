//! Committed changes delivered to watchers, each with a buffer bounded in changes and in bytes.
//!
//! The writer publishes a change once it committed; every watcher whose filter matches gets it
//! queued in its own buffer. A watcher that does not keep up never grows the node's memory
//! beyond its bounds (`limits.watch_buffer_max` changes, `limits.watch_buffer_bytes_max`
//! bytes): once over, its buffer is dropped, the changes it misses are counted, and its next
//! read says how many it missed ([`WatchEvent::Lagged`]) so it can re-read the state and go on.
//! A change is shared by every buffer holding it (one copy of a value, whatever the number of
//! watchers); a watcher's bytes are counted as if it held its own copy.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
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
    /// against a watcher's byte budget.
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
    /// the node runs in relaxed durability).
    Changed(Change),
    /// The watcher fell behind: its buffer went over `limits.watch_buffer_max` changes or
    /// `limits.watch_buffer_bytes_max` bytes and this many matching changes were dropped for
    /// it. Re-read the keys to resync; changes committed after this event follow.
    Lagged(u64),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One watcher's buffer.
#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<(Arc<Change>, usize)>,
    bytes: usize,
    /// Matching changes dropped since the watcher last read (0: none).
    missed: u64,
    /// The feed is gone: no change will come.
    closed: bool,
}

#[derive(Debug)]
struct Slot {
    filter: KeyFilter,
    queue: Mutex<Queue>,
    ready: Notify,
}

/// A stream of committed changes matching a filter, buffered up to the watch limits.
#[derive(Debug)]
pub struct Watch {
    slot: Arc<Slot>,
}

impl Watch {
    /// The next change (or the count of changes missed since the last read, when the buffer
    /// overflowed), or `None` once the node shut down (or its last handle was dropped).
    pub async fn next(&mut self) -> Option<WatchEvent> {
        loop {
            {
                let mut q = lock(&self.slot.queue);
                if q.missed > 0 {
                    let n = std::mem::take(&mut q.missed);
                    return Some(WatchEvent::Lagged(n));
                }
                if let Some((change, bytes)) = q.items.pop_front() {
                    q.bytes -= bytes;
                    drop(q);
                    return Some(WatchEvent::Changed(Arc::unwrap_or_clone(change)));
                }
                if q.closed {
                    return None;
                }
            }
            // A change published between the check and here left a permit: no wake-up is lost.
            self.slot.ready.notified().await;
        }
    }

    /// Bytes of changes buffered for this watcher now.
    pub fn buffered_bytes(&self) -> usize {
        lock(&self.slot.queue).bytes
    }
}

/// The writer's side: every live watcher's buffer.
#[derive(Debug)]
pub(crate) struct Feed {
    watchers: Mutex<Vec<Weak<Slot>>>,
    changes_max: usize,
    bytes_max: usize,
}

impl Feed {
    /// A feed whose watchers buffer at most `changes_max` changes and `bytes_max` bytes each
    /// (one change over `bytes_max` is still delivered to a watcher whose buffer is empty).
    pub(crate) fn new(changes_max: usize, bytes_max: usize) -> Self {
        Self {
            watchers: Mutex::new(Vec::new()),
            changes_max: changes_max.max(1),
            bytes_max,
        }
    }

    /// A new watcher of the changes published from now on that match `filter`.
    pub(crate) fn subscribe(&self, filter: KeyFilter) -> Watch {
        let slot = Arc::new(Slot {
            filter,
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
        });
        let mut watchers = lock(&self.watchers);
        watchers.retain(|w| w.strong_count() > 0);
        watchers.push(Arc::downgrade(&slot));
        Watch { slot }
    }

    /// Is anyone watching? (Nothing needs to be read for watchers when not.)
    pub(crate) fn has_watchers(&self) -> bool {
        lock(&self.watchers).iter().any(|w| w.strong_count() > 0)
    }

    /// Queues `change` for every watcher whose filter matches it.
    pub(crate) fn publish(&self, change: Change) {
        let change = Arc::new(change);
        let bytes = change.held_bytes();
        let mut watchers = lock(&self.watchers);
        watchers.retain(|w| w.strong_count() > 0);
        for slot in watchers.iter().filter_map(Weak::upgrade) {
            if !slot.filter.matches(&change.key) {
                continue;
            }
            {
                let mut q = lock(&slot.queue);
                if q.missed > 0 {
                    q.missed += 1;
                } else if !q.items.is_empty()
                    && (q.items.len() >= self.changes_max || q.bytes + bytes > self.bytes_max)
                {
                    // Over a bound: drop the buffer (its memory is freed now) and count.
                    q.missed = q.items.len() as u64 + 1;
                    q.items.clear();
                    q.bytes = 0;
                } else {
                    q.bytes += bytes;
                    q.items.push_back((Arc::clone(&change), bytes));
                }
            }
            slot.ready.notify_one();
        }
    }
}

impl Drop for Feed {
    /// Every watcher's next read after its buffer ends is `None`.
    fn drop(&mut self) {
        let watchers = std::mem::take(
            self.watchers
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for slot in watchers.iter().filter_map(Weak::upgrade) {
            lock(&slot.queue).closed = true;
            slot.ready.notify_one();
        }
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
        tokio::time::timeout(std::time::Duration::from_secs(5), w.next())
            .await
            .expect("a watch event")
    }

    #[tokio::test]
    async fn changes_arrive_in_order_and_only_matching_ones() {
        let feed = Feed::new(16, 1 << 20);
        let mut all = feed.subscribe(KeyFilter::all());
        let mut some = feed.subscribe(KeyFilter::prefix("a"));
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
        drop(feed);
        assert_eq!(next(&mut all).await, None);
        assert_eq!(next(&mut some).await, None);
    }

    #[tokio::test]
    async fn a_stalled_watcher_holds_at_most_its_byte_budget_and_is_told_what_it_missed() {
        let budget = 4 << 20;
        let feed = Feed::new(1024, budget);
        let mut stalled = feed.subscribe(KeyFilter::all());
        let mut reading = feed.subscribe(KeyFilter::all());
        // 400 changes of a ~1 MiB set: the stalled watcher never holds more than its budget.
        let mut peak = 0;
        for i in 0..400 {
            feed.publish(set(&format!("s{}", i % 3), 1024, 1000));
            peak = peak.max(stalled.buffered_bytes());
            assert!(matches!(
                next(&mut reading).await,
                Some(WatchEvent::Changed(_))
            ));
        }
        assert!(peak <= budget, "peak {peak} over the budget {budget}");
        assert_eq!(reading.buffered_bytes(), 0);
        // It is told how many it missed (every change not still buffered), then gets the rest.
        let mut seen = 0u64;
        let mut missed = 0u64;
        while stalled.buffered_bytes() > 0 || missed == 0 {
            match next(&mut stalled).await {
                Some(WatchEvent::Lagged(n)) => missed += n,
                Some(WatchEvent::Changed(_)) => seen += 1,
                None => break,
            }
        }
        assert_eq!(seen + missed, 400, "seen {seen}, missed {missed}");
        assert!(missed > 0);
        // After the lag it follows new changes again.
        feed.publish(counter("after", 1));
        assert_eq!(
            next(&mut stalled).await,
            Some(WatchEvent::Changed(counter("after", 1)))
        );
    }

    #[tokio::test]
    async fn the_change_count_bound_still_holds_and_one_oversized_change_is_delivered() {
        let feed = Feed::new(3, 100);
        let mut w = feed.subscribe(KeyFilter::all());
        // Bigger than the byte budget, into an empty buffer: delivered.
        feed.publish(set("big", 10, 100));
        assert!(matches!(next(&mut w).await, Some(WatchEvent::Changed(c)) if c.key.name == "big"));
        let feed = Feed::new(3, 1 << 20);
        let mut w = feed.subscribe(KeyFilter::all());
        for i in 0..5 {
            feed.publish(counter("c", i));
        }
        // The fourth overflows the buffer: it and every change until the next read are missed.
        assert_eq!(next(&mut w).await, Some(WatchEvent::Lagged(5)));
        feed.publish(counter("c", 5));
        assert_eq!(
            next(&mut w).await,
            Some(WatchEvent::Changed(counter("c", 5)))
        );
    }

    #[tokio::test]
    async fn dropped_watchers_are_forgotten() {
        let feed = Feed::new(8, 1 << 20);
        assert!(!feed.has_watchers());
        let w = feed.subscribe(KeyFilter::all());
        assert!(feed.has_watchers());
        drop(w);
        assert!(!feed.has_watchers());
        feed.publish(counter("x", 1));
        assert!(lock(&feed.watchers).is_empty());
    }
}
