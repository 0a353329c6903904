//! The replicated data model shared by every layer: the delta that replicas exchange and log.

use tidemark_crdts::{CausalContext, DedupMarks, Dot, DotStore, Key, StoreDelta};

/// What replicas exchange, log and join: a store delta plus the ingest dedup marks it carries.
///
/// Guarantee: joining is idempotent, commutative and associative (both parts are lattices), so
/// deltas may be delivered in any order and any number of times.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Delta {
    /// The keyed entries and their shared causal context.
    pub state: StoreDelta,
    /// Dedup marks of the events whose effects the delta carries.
    pub marks: DedupMarks,
}

impl Delta {
    /// True when the delta carries nothing.
    pub fn is_empty(&self) -> bool {
        self.state.store.is_bottom() && self.state.ctx.is_empty() && self.marks.is_empty()
    }

    /// Joins `other` into `self` (used to coalesce log entries into one interval).
    pub fn join(&mut self, other: Delta) {
        self.state.join(other.state);
        self.marks.join(&other.marks);
    }

    /// The dots this delta's context holds.
    pub fn context(&self) -> &CausalContext {
        &self.state.ctx
    }
}

/// A chunk of a state transfer (docs/design/principles.md, "State transfer"), covering the key
/// range `(after, upto]` (`None` bounds are open).
///
/// Guarantee (pitfall "chunk removals outside the range", docs/design/principles.md): a chunk's
/// removals apply only to keys inside its range, and the transfer's context is joined as a whole
/// only by the final chunk, once every earlier chunk of the transfer was applied; so a lost chunk
/// can never delete live dots it did not carry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StateChunk {
    /// The exclusive lower bound of the range (`None`: from the first key).
    pub after: Option<Key>,
    /// The inclusive upper bound of the range (`None`: to the last key).
    pub upto: Option<Key>,
    /// Every entry the sender holds in the range.
    pub entries: Vec<(Key, tidemark_crdts::Entry)>,
    /// The sender's context when the transfer started (every chunk reflects at least it).
    pub ctx: CausalContext,
    /// Dedup marks: a page of the sender's marks (pages follow the last rows, so marks never
    /// precede the effects they mark in a transfer).
    pub marks: DedupMarks,
    /// True for the final chunk of a transfer.
    pub last: bool,
    /// `Some`: the chunk joins the keys of its range only within this slice of dot space — the
    /// sender split a row too large for one message across chunks, each carrying the row's
    /// dots in one slice. Dots of the range outside the slice are untouched,
    /// so a partial row never deletes dots it did not carry.
    pub dots: Option<DotSlice>,
}

/// A slice `(after, upto]` of dot space, ordered by `(replica, seq)` (`None` bounds are open).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DotSlice {
    /// Exclusive lower bound.
    pub after: Option<Dot>,
    /// Inclusive upper bound.
    pub upto: Option<Dot>,
}

impl DotSlice {
    /// Does the slice hold `dot`?
    pub fn contains(&self, dot: &Dot) -> bool {
        self.after.is_none_or(|a| *dot > a) && self.upto.is_none_or(|u| *dot <= u)
    }

    /// The dots of `ctx` inside the slice.
    pub fn clip(&self, ctx: &CausalContext) -> CausalContext {
        let mut out = CausalContext::new();
        for (replica, set) in ctx.entries() {
            let lo = match self.after {
                Some(a) if a.replica > *replica => continue,
                Some(a) if a.replica == *replica => a.seq.saturating_add(1),
                _ => 1,
            };
            let hi = match self.upto {
                Some(u) if u.replica < *replica => continue,
                Some(u) if u.replica == *replica => u.seq,
                _ => u64::MAX,
            };
            if lo > hi {
                continue;
            }
            for &(a, b) in set.ranges() {
                let (a, b) = (a.max(lo), b.min(hi));
                if a <= b {
                    out.insert_range(*replica, a, b);
                }
            }
        }
        out
    }

    /// True when the slice holds no dot at all.
    pub fn is_empty(&self) -> bool {
        match (self.after, self.upto) {
            (Some(a), Some(u)) => a >= u,
            _ => false,
        }
    }
}

/// Why a remote delta or chunk was rejected. Nothing of it was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// A key name is empty, too long or holds control characters.
    #[error("invalid key name {name:?}: {why}")]
    KeyName {
        /// The name (truncated for display).
        name: String,
        /// What is wrong.
        why: &'static str,
    },
    /// An entry's variant does not match its key's type.
    #[error("entry for {key} holds a {found} payload")]
    KindMismatch {
        /// The key.
        key: String,
        /// The payload's kind.
        found: &'static str,
    },
    /// An entry is not canonical (unsorted dots, empty children).
    #[error("entry for {key} is not canonical")]
    NotCanonical {
        /// The key.
        key: String,
    },
    /// A dot of the store is outside the delta's context (invariant I3).
    #[error("entry for {key} holds a dot outside the delta's context")]
    DotOutsideContext {
        /// The key.
        key: String,
    },
    /// A value or element is over its size limit.
    #[error("value of {key} is {len} bytes, over the limit of {limit}")]
    ValueTooLarge {
        /// The key.
        key: String,
        /// The size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The delta claims dots of this replica that it never issued (it would poison `next_dot`).
    #[error("delta claims own dot {claimed} above the local counter {local}")]
    ForgedOwnDot {
        /// The highest own seq claimed.
        claimed: u64,
        /// The local counter.
        local: u64,
    },
    /// A set element or register value is not the canonical JSON text a local write stores
    /// (not JSON at all, or a set element that is not a string, number or boolean).
    #[error("value of {key} is not canonical JSON")]
    NotJson {
        /// The key.
        key: String,
    },
    /// A dot appears twice in the delta or chunk (under two keys, or twice in one entry):
    /// correct replicas give every write its own dot.
    #[error("dot {dot:?} appears twice (under {key})")]
    DuplicateDot {
        /// The dot.
        dot: tidemark_crdts::Dot,
        /// The key of its second appearance.
        key: String,
    },
    /// A chunk's range or entries are inconsistent.
    #[error("state chunk is malformed: {0}")]
    BadChunk(&'static str),
    /// Dedup marks are malformed (a stream or source name outside 1..=`key_bytes_max` bytes
    /// or holding control characters, or a source with no seqs).
    #[error("dedup marks are malformed: {0}")]
    BadMarks(&'static str),
    /// The receiver's data directory has no room to stage a state transfer: staging the
    /// chunk would leave less free space than twice what is staged (the final join writes
    /// the rows and their log records) plus a spare. The staging is dropped; nothing applied.
    #[error(
        "no room to stage the state transfer: {free_mib} MiB free in the data directory, \
         {need_mib} MiB needed"
    )]
    NoRoom {
        /// Free space of the data directory's filesystem, MiB.
        free_mib: u64,
        /// What staging the chunk and joining the transfer need, MiB.
        need_mib: u64,
    },
}

/// Encoded bytes of one context or dedup range at most (replica index, two varint u64s) plus
/// a share of the replica table.
pub(crate) const RANGE_BYTES: usize = 40;

/// Bytes a dedup mark adds besides its stream and source names.
pub(crate) const MARK_OVERHEAD_BYTES: usize = 48;

/// Bytes a dedup entry costs in a message (estimate).
pub(crate) fn marks_bytes(stream: &str, source: &str, seqs: &tidemark_crdts::IntervalSet) -> usize {
    stream.len() + source.len() + MARK_OVERHEAD_BYTES + seqs.ranges().len() * RANGE_BYTES
}

/// The reserved key namespace: every key name starting with `~` is the node's own (internal
/// keys: client ops naming one are refused, key listings and the console leave them out
/// unless asked). The prefixes in use are [`RESERVED_PREFIXES`].
pub const RESERVED_PREFIX: &str = "~";

/// Prefix of view cell keys (written only by views).
pub const VIEW_PREFIX: &str = "~view/";
/// Prefix of watermark announcement keys.
pub const WM_PREFIX: &str = "~wm/";

/// Prefix of decommission records: `~gone/{replica id}`, one per member removed for good.
pub const GONE_PREFIX: &str = "~gone/";

/// The one list of the internal key prefixes in use, all under [`RESERVED_PREFIX`]: what
/// messages and listings name.
pub const RESERVED_PREFIXES: [&str; 3] = [VIEW_PREFIX, WM_PREFIX, GONE_PREFIX];

/// True for key names in the reserved namespace (under [`RESERVED_PREFIX`]): only the node
/// writes them (client ops naming them are refused).
pub fn is_reserved(name: &str) -> bool {
    name.starts_with(RESERVED_PREFIX)
}

/// The internal prefixes in use as a message names them: `` `~view/`, `~wm/`, `~gone/` ``.
pub fn reserved_prefixes_text() -> String {
    RESERVED_PREFIXES
        .iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The keys a join changed, packed into one buffer (a kind byte, the name's length as a
/// base-128 varint, the name): a state transfer may change millions of keys, and a `Vec<Key>` costs about 60
/// bytes a key where this costs the name plus 2 (plus 3 for names of 128 bytes or more).
///
/// Guarantee: [`ChangedKeys::iter`] yields the keys pushed, in push order, each once per push.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ChangedKeys {
    buf: Vec<u8>,
    len: usize,
}

impl ChangedKeys {
    /// No key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `key`.
    pub fn push(&mut self, key: &Key) {
        let kind = tidemark_crdts::KeyKind::ALL
            .iter()
            .position(|k| *k == key.kind)
            .unwrap_or_default();
        self.buf.push(u8::try_from(kind).unwrap_or_default());
        let name = key.name.as_bytes();
        // The name's length, 7 bits a byte, low bits first (one byte below 128).
        let mut len = name.len();
        while len >= 0x80 {
            self.buf.push((len & 0x7f) as u8 | 0x80);
            len >>= 7;
        }
        self.buf.push(len as u8);
        self.buf.extend_from_slice(name);
        self.len += 1;
    }

    /// How many keys were pushed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no key was pushed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the packed keys take.
    pub fn packed_bytes(&self) -> usize {
        self.buf.len()
    }

    /// The keys, in push order.
    pub fn iter(&self) -> ChangedIter<'_> {
        ChangedIter { rest: &self.buf }
    }

    /// The keys as a vector (tests, small outcomes).
    pub fn to_vec(&self) -> Vec<Key> {
        self.iter().collect()
    }
}

impl std::fmt::Debug for ChangedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<Vec<Key>> for ChangedKeys {
    fn from(keys: Vec<Key>) -> Self {
        keys.iter().collect()
    }
}

impl<'a> FromIterator<&'a Key> for ChangedKeys {
    fn from_iter<I: IntoIterator<Item = &'a Key>>(iter: I) -> Self {
        let mut out = Self::new();
        for k in iter {
            out.push(k);
        }
        out
    }
}

/// The keys of a [`ChangedKeys`], decoded one at a time.
#[derive(Debug)]
pub struct ChangedIter<'a> {
    rest: &'a [u8],
}

impl Iterator for ChangedIter<'_> {
    type Item = Key;

    fn next(&mut self) -> Option<Key> {
        // Only `push` writes the buffer, so every record is whole and its name UTF-8.
        let (&kind, mut rest) = self.rest.split_first()?;
        let (mut len, mut shift) = (0usize, 0u32);
        loop {
            let (&b, tail) = rest.split_first()?;
            rest = tail;
            len |= usize::from(b & 0x7f).checked_shl(shift)?;
            if b < 0x80 {
                break;
            }
            shift += 7;
        }
        let name = rest.get(..len)?;
        self.rest = &rest[len..];
        let kind = *tidemark_crdts::KeyKind::ALL.get(usize::from(kind))?;
        Some(Key::new(kind, String::from_utf8_lossy(name)))
    }
}

#[cfg(test)]
mod changed_keys_tests {
    use super::ChangedKeys;
    use tidemark_crdts::{Key, KeyKind};

    #[test]
    fn changed_keys_give_back_what_was_pushed_in_order() {
        let long = "n".repeat(300);
        let names = ["", "a", "ünï", "x/y:z", long.as_str()];
        let keys: Vec<Key> = KeyKind::ALL
            .iter()
            .flat_map(|&k| names.iter().map(move |n| Key::new(k, *n)))
            .collect();
        let mut packed = ChangedKeys::new();
        for k in keys.iter().chain(&keys) {
            packed.push(k);
        }
        let twice: Vec<Key> = keys.iter().chain(&keys).cloned().collect();
        assert_eq!(packed.to_vec(), twice);
        assert_eq!(packed.len(), twice.len());
        assert_eq!(ChangedKeys::from(keys.clone()).to_vec(), keys);
        assert!(ChangedKeys::new().is_empty());
        // Far below a Vec<Key>'s ~60 bytes a key for short names.
        let mut many = ChangedKeys::new();
        for i in 0..1000 {
            many.push(&Key::new(KeyKind::GCounter, format!("c{i:07}")));
        }
        assert_eq!(many.packed_bytes(), 1000 * (1 + 1 + 8));
    }
}
