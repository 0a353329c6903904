//! Validation and join algorithms shared by every [`crate::proto::StateStore`] backend.
//!
//! The store-level delta join itself lives in the lattice crate
//! ([`tidemark_crdts::store::join_delta`]); this module adds what a node needs around it:
//! validation of untrusted deltas and chunks, and the range-scoped join of state-transfer chunks.

use crate::config::Limits;
use crate::model::{Delta, StateChunk};
use tidemark_crdts::store::JoinOutcome;
use tidemark_crdts::{
    Causal, CausalContext, DotMap, DotStore, Entry, Key, ReplicaId, Rows, Timestamp,
};

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
    /// A chunk's range or entries are inconsistent.
    #[error("state chunk is malformed: {0}")]
    BadChunk(&'static str),
}

/// Checks a key name: 1..=`key_bytes_max` bytes of UTF-8 without control characters.
///
/// # Errors
/// [`Rejected::KeyName`] naming the problem.
pub fn check_key_name(name: &str, limits: &Limits) -> Result<(), Rejected> {
    let why = if name.is_empty() {
        Some("empty")
    } else if name.len() > limits.key_bytes_max {
        Some("too long")
    } else if name.chars().any(char::is_control) {
        Some("control character")
    } else {
        None
    };
    match why {
        Some(why) => Err(Rejected::KeyName {
            name: name.chars().take(64).collect(),
            why,
        }),
        None => Ok(()),
    }
}

fn check_entry(
    key: &Key,
    entry: &Entry,
    ctx: Option<&CausalContext>,
    limits: &Limits,
) -> Result<(), Rejected> {
    check_key_name(&key.name, limits)?;
    if entry.kind() != key.kind {
        return Err(Rejected::KindMismatch {
            key: key.to_string(),
            found: entry.kind().as_str(),
        });
    }
    if !entry.is_canonical() || entry.is_bottom() {
        return Err(Rejected::NotCanonical {
            key: key.to_string(),
        });
    }
    if let Some(ctx) = ctx {
        let mut inside = true;
        entry.for_each_dot(&mut |d| inside &= ctx.contains(&d));
        if !inside {
            return Err(Rejected::DotOutsideContext {
                key: key.to_string(),
            });
        }
    }
    let too_large = |len: usize, limit: usize| {
        (len > limit).then(|| Rejected::ValueTooLarge {
            key: key.to_string(),
            len,
            limit,
        })
    };
    let err = match entry {
        Entry::ORSet(m) => m
            .keys()
            .find_map(|e| too_large(e.len(), limits.element_bytes_max)),
        Entry::Lww(f) => f
            .iter()
            .find_map(|(_, (_, v))| too_large(v.len(), limits.value_bytes_max)),
        Entry::MvReg(f) => f
            .iter()
            .find_map(|(_, v)| too_large(v.len(), limits.value_bytes_max)),
        Entry::GCounter(_) | Entry::PNCounter(_) => None,
    };
    err.map_or(Ok(()), Err)
}

fn check_own_dots(
    ctx: &CausalContext,
    me: ReplicaId,
    local: &CausalContext,
) -> Result<(), Rejected> {
    let claimed = ctx.max_seq(me);
    let local_max = local.max_seq(me);
    if claimed > local_max {
        return Err(Rejected::ForgedOwnDot {
            claimed,
            local: local_max,
        });
    }
    Ok(())
}

/// Validates a remote delta against the local replica before anything is applied.
///
/// # Errors
/// The first [`Rejected`] reason found.
pub fn validate_delta(
    delta: &Delta,
    limits: &Limits,
    me: ReplicaId,
    local: &CausalContext,
) -> Result<(), Rejected> {
    for (key, entry) in delta.state.store.iter() {
        check_entry(key, entry, Some(&delta.state.ctx), limits)?;
    }
    check_own_dots(&delta.state.ctx, me, local)
}

/// Validates a state-transfer chunk before anything is applied.
///
/// # Errors
/// The first [`Rejected`] reason found.
pub fn validate_chunk(
    chunk: &StateChunk,
    limits: &Limits,
    me: ReplicaId,
    local: &CausalContext,
) -> Result<(), Rejected> {
    if let (Some(a), Some(u)) = (&chunk.after, &chunk.upto) {
        if a >= u {
            return Err(Rejected::BadChunk("empty or inverted key range"));
        }
    }
    let mut prev: Option<&Key> = chunk.after.as_ref();
    for (key, entry) in &chunk.entries {
        if prev.is_some_and(|p| p >= key) {
            return Err(Rejected::BadChunk(
                "entries not strictly ascending within the range",
            ));
        }
        if chunk.upto.as_ref().is_some_and(|u| key > u) {
            return Err(Rejected::BadChunk("entry beyond the chunk's range"));
        }
        // A transfer is read together with its context: every dot is inside it.
        check_entry(key, entry, Some(&chunk.ctx), limits)?;
        let mut own = CausalContext::new();
        entry.for_each_dot(&mut |d| {
            own.insert(d);
        });
        check_own_dots(&own, me, local)?;
        prev = Some(key);
    }
    check_own_dots(&chunk.ctx, me, local)
}

/// The largest LWW timestamp a delta or chunk carries (for the receive rule of the HLC).
pub fn max_timestamp<'a>(entries: impl Iterator<Item = &'a Entry>) -> Option<Timestamp> {
    entries
        .filter_map(|e| match e {
            Entry::Lww(f) => f.iter().map(|(_, (t, _))| *t).max(),
            _ => None,
        })
        .max()
}

/// Row backends that can list their keys in a range (needed by state transfer).
pub trait KeyRange: Rows {
    /// Keys `k` with `after < k <= upto` (open bounds when `None`), ascending.
    ///
    /// # Errors
    /// Backend failures.
    fn keys_in_range(
        &mut self,
        after: Option<&Key>,
        upto: Option<&Key>,
    ) -> Result<Vec<Key>, Self::Error>;
}

/// Joins one state-transfer chunk into the rows and context (range-scoped, pitfall #4).
///
/// For every key in the chunk's range, local or carried, the entry is causally joined with the
/// chunk's entry under the transfer's context; removals therefore touch only keys in the range.
/// The local context gains the dots carried and, for the final chunk, the transfer's context.
///
/// # Errors
/// Backend failures (the caller discards its transaction).
pub fn join_chunk<R: KeyRange>(
    rows: &mut R,
    ctx: &mut CausalContext,
    chunk: StateChunk,
) -> Result<JoinOutcome, R::Error> {
    let local_keys = rows.keys_in_range(chunk.after.as_ref(), chunk.upto.as_ref())?;
    let mut carried: std::collections::BTreeMap<Key, Entry> = chunk.entries.into_iter().collect();
    let mut keys: Vec<Key> = local_keys;
    keys.extend(carried.keys().cloned());
    keys.sort();
    keys.dedup();
    let mut infl_store: DotMap<Key, Entry> = DotMap::default();
    let mut infl_ctx = CausalContext::new();
    let mut gained = CausalContext::new();
    let mut changed = Vec::new();
    for key in keys {
        let theirs = carried
            .remove(&key)
            .unwrap_or_else(|| Entry::bottom(key.kind));
        let old = rows.get(&key)?;
        let mut new = old.clone().unwrap_or_else(|| Entry::bottom(key.kind));
        let before = new.dots();
        let unseen = theirs.unseen_by(ctx);
        new.join(ctx, theirs, &chunk.ctx);
        infl_ctx.join(&before.diff(&new.dots()));
        let new_opt = (!new.is_bottom()).then_some(&new);
        if new_opt != old.as_ref() {
            rows.put(&key, old.as_ref(), new_opt)?;
            changed.push(key.clone());
        }
        if !unseen.is_bottom() {
            gained.join(&unseen.dots());
            infl_store.set(key, unseen);
        }
    }
    infl_ctx.join(&gained);
    ctx.join(&gained);
    if chunk.last {
        infl_ctx.join(&chunk.ctx.diff(ctx));
        ctx.join(&chunk.ctx);
    }
    let inflation = (!infl_store.is_bottom() || !infl_ctx.is_empty()).then_some(Causal {
        store: infl_store,
        ctx: infl_ctx,
    });
    Ok(JoinOutcome { inflation, changed })
}
