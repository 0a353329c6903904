//! The store-level causal map: `(type, name)` keys to typed values sharing one causal context
//! (`docs/design/principles.md`: "One causal map", "Typed keys", "What delete means"). This is
//! exactly a node's replicated state.
//!
//! Every local mutation, removals included, takes a fresh dot, so a replica's version vector
//! summarizes every operation it has seen. Counters are causal counters (at most one live dot per
//! replica carrying that replica's running total), so they join with the same rule as every
//! other value; registers and sets are observed-remove, so deletes leave no tombstone.
//!
//! The join is written once, against the [`Rows`] trait, so the in-memory [`MemStore`] and a
//! durable table-backed store run the same algorithm. A `Rows` backend keeps a dot → key index
//! so that a delta's removals find their keys in O(|δ|), never by scanning the state.

use crate::context::CausalContext;
use crate::dot::{Dot, ReplicaId};
use crate::dotstore::{Causal, DotFun, DotMap, DotSet, DotStore};
use crate::hlc::Timestamp;
use core::fmt;
use std::collections::BTreeMap;

/// A value kept as canonical JSON text (object keys sorted, no insignificant whitespace).
/// Canonical text makes equal JSON values equal bytes, so ordering and sorting are stable.
pub type Json = String;

/// The type part of a key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum KeyKind {
    /// Grow-only counter (value `u64`).
    GCounter,
    /// Up-down counter (value `i64`).
    PNCounter,
    /// Add-wins set of JSON scalars.
    ORSet,
    /// Last-writer-wins register ordered by HLC.
    Lww,
    /// Multi-value register.
    MvReg,
}

impl KeyKind {
    /// Every kind, in order.
    pub const ALL: [KeyKind; 5] = [
        KeyKind::GCounter,
        KeyKind::PNCounter,
        KeyKind::ORSet,
        KeyKind::Lww,
        KeyKind::MvReg,
    ];

    /// The name used in APIs: `gcounter`, `pncounter`, `orset`, `lww`, `mvreg`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::GCounter => "gcounter",
            KeyKind::PNCounter => "pncounter",
            KeyKind::ORSet => "orset",
            KeyKind::Lww => "lww",
            KeyKind::MvReg => "mvreg",
        }
    }

    /// Parses an API name.
    pub fn parse(s: &str) -> Option<KeyKind> {
        KeyKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Can keys of this kind be deleted? (Counters cannot: `docs/design/principles.md`, "What
    /// delete means".)
    pub fn deletable(self) -> bool {
        !matches!(self, KeyKind::GCounter | KeyKind::PNCounter)
    }
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key: its type and its name. `pncounter/visits` and `orset/visits` are different keys.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Key {
    /// The type.
    pub kind: KeyKind,
    /// The name (the node validates length and characters).
    pub name: String,
}

impl Key {
    /// Builds a key.
    pub fn new(kind: KeyKind, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
        }
    }
}

/// A key admits only entries of its own kind (the decoder of a [`StoreDelta`] rejects the rest):
/// the variant of every decoded entry matches its key's kind, as for every entry a replica builds.
impl crate::dotstore::AdmitsChild<Entry> for Key {
    fn admits(&self, child: &Entry) -> bool {
        child.kind() == self.kind
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// The replicated payload of one key. The variant always matches the key's kind.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Entry {
    /// Causal grow-only counter: per replica one live dot holding its running total.
    GCounter(DotFun<u64>),
    /// Causal up-down counter: per replica one live dot holding its `(increments, decrements)`.
    PNCounter(DotFun<(u64, u64)>),
    /// Add-wins set: element → dots of its live adds.
    ORSet(DotMap<Json, DotSet>),
    /// LWW register as a multi-value register of `(timestamp, value)`; the max timestamp is read.
    Lww(DotFun<(Timestamp, Json)>),
    /// Multi-value register.
    MvReg(DotFun<Json>),
}

impl Default for Entry {
    fn default() -> Self {
        Entry::GCounter(DotFun::default())
    }
}

impl Entry {
    /// The bottom entry of a kind.
    pub fn bottom(kind: KeyKind) -> Entry {
        match kind {
            KeyKind::GCounter => Entry::GCounter(DotFun::default()),
            KeyKind::PNCounter => Entry::PNCounter(DotFun::default()),
            KeyKind::ORSet => Entry::ORSet(DotMap::default()),
            KeyKind::Lww => Entry::Lww(DotFun::default()),
            KeyKind::MvReg => Entry::MvReg(DotFun::default()),
        }
    }

    /// The kind this entry belongs to.
    pub fn kind(&self) -> KeyKind {
        match self {
            Entry::GCounter(_) => KeyKind::GCounter,
            Entry::PNCounter(_) => KeyKind::PNCounter,
            Entry::ORSet(_) => KeyKind::ORSet,
            Entry::Lww(_) => KeyKind::Lww,
            Entry::MvReg(_) => KeyKind::MvReg,
        }
    }

    /// True when the entry is in canonical form (sorted, no empty children): decoders check it.
    pub fn is_canonical(&self) -> bool {
        match self {
            Entry::GCounter(f) => f.is_canonical(),
            Entry::PNCounter(f) => f.is_canonical(),
            Entry::ORSet(m) => m.is_canonical() && m.iter().all(|(_, s)| s.is_canonical()),
            Entry::Lww(f) => f.is_canonical(),
            Entry::MvReg(f) => f.is_canonical(),
        }
    }

    /// The value a reader sees.
    pub fn value(&self) -> Value {
        match self {
            Entry::GCounter(f) => {
                Value::GCounter(f.iter().fold(0u64, |acc, (_, n)| acc.saturating_add(*n)))
            }
            Entry::PNCounter(f) => {
                let (p, n) = f.iter().fold((0u64, 0u64), |(p, n), (_, (a, b))| {
                    (p.saturating_add(*a), n.saturating_add(*b))
                });
                let v = i128::from(p) - i128::from(n);
                Value::PNCounter(i64::try_from(v).unwrap_or(if v < 0 {
                    i64::MIN
                } else {
                    i64::MAX
                }))
            }
            Entry::ORSet(m) => Value::ORSet(m.keys().cloned().collect()),
            Entry::Lww(f) => Value::Lww(f.iter().map(|(_, tv)| tv).max().map(|(_, v)| v.clone())),
            Entry::MvReg(f) => {
                let mut v: Vec<Json> = f.iter().map(|(_, v)| v.clone()).collect();
                v.sort();
                v.dedup();
                Value::MvReg(v)
            }
        }
    }

    /// The entry holding only the dots whose replica `keep` accepts (an orset element left
    /// without dots is gone): the value the kept replicas' contributions alone make, for
    /// entries whose writers cover only their own dots ([`mutate_own_in_place`]).
    #[must_use]
    pub fn retain_replicas(&self, keep: impl Fn(ReplicaId) -> bool) -> Entry {
        match self {
            Entry::GCounter(f) => Entry::GCounter(DotFun::from_entries(
                f.iter()
                    .filter(|(d, _)| keep(d.replica))
                    .map(|(d, v)| (*d, *v))
                    .collect(),
            )),
            Entry::PNCounter(f) => Entry::PNCounter(DotFun::from_entries(
                f.iter()
                    .filter(|(d, _)| keep(d.replica))
                    .map(|(d, v)| (*d, *v))
                    .collect(),
            )),
            Entry::ORSet(m) => {
                let mut out = DotMap::default();
                for (e, dots) in m.iter() {
                    let kept: Vec<Dot> = dots.iter().copied().filter(|d| keep(d.replica)).collect();
                    if !kept.is_empty() {
                        out.set(e.clone(), DotSet::from_dots(kept));
                    }
                }
                Entry::ORSet(out)
            }
            Entry::Lww(f) => Entry::Lww(DotFun::from_entries(
                f.iter()
                    .filter(|(d, _)| keep(d.replica))
                    .map(|(d, v)| (*d, v.clone()))
                    .collect(),
            )),
            Entry::MvReg(f) => Entry::MvReg(DotFun::from_entries(
                f.iter()
                    .filter(|(d, _)| keep(d.replica))
                    .map(|(d, v)| (*d, v.clone()))
                    .collect(),
            )),
        }
    }

    /// The live dot of `replica` in a causal counter, with its payload.
    fn counter_dot<V: Clone + Ord + fmt::Debug>(
        f: &DotFun<V>,
        replica: ReplicaId,
    ) -> Option<(Dot, V)> {
        f.iter()
            .filter(|(d, _)| d.replica == replica)
            .max_by_key(|(d, _)| d.seq)
            .map(|(d, v)| (*d, v.clone()))
    }
}

macro_rules! entry_dispatch {
    ($self:expr, $inner:ident => $body:expr) => {
        match $self {
            Entry::GCounter($inner) => $body,
            Entry::PNCounter($inner) => $body,
            Entry::ORSet($inner) => $body,
            Entry::Lww($inner) => $body,
            Entry::MvReg($inner) => $body,
        }
    };
}

impl DotStore for Entry {
    fn is_bottom(&self) -> bool {
        entry_dispatch!(self, s => s.is_bottom())
    }
    fn for_each_dot(&self, f: &mut dyn FnMut(Dot)) {
        entry_dispatch!(self, s => s.for_each_dot(f))
    }
    fn join(&mut self, ctx: &CausalContext, other: Self, other_ctx: &CausalContext) {
        match (&mut *self, other) {
            (Entry::GCounter(a), Entry::GCounter(b)) => a.join(ctx, b, other_ctx),
            (Entry::PNCounter(a), Entry::PNCounter(b)) => a.join(ctx, b, other_ctx),
            (Entry::ORSet(a), Entry::ORSet(b)) => a.join(ctx, b, other_ctx),
            (Entry::Lww(a), Entry::Lww(b)) => a.join(ctx, b, other_ctx),
            (Entry::MvReg(a), Entry::MvReg(b)) => a.join(ctx, b, other_ctx),
            (_, other) => {
                // Kinds differ: only possible when one side is bottom (a key's kind is part of
                // the key). Otherwise (invalid input) keep the smaller kind on both sides alike
                // so the join stays commutative.
                if self.is_bottom() || (!other.is_bottom() && other.kind() < self.kind()) {
                    *self = other.unseen_by(ctx);
                }
            }
        }
    }
    fn remove_dots(&mut self, removed: &CausalContext) -> usize {
        entry_dispatch!(self, s => s.remove_dots(removed))
    }
    fn unseen_by(&self, ctx: &CausalContext) -> Self {
        match self {
            Entry::GCounter(s) => Entry::GCounter(s.unseen_by(ctx)),
            Entry::PNCounter(s) => Entry::PNCounter(s.unseen_by(ctx)),
            Entry::ORSet(s) => Entry::ORSet(s.unseen_by(ctx)),
            Entry::Lww(s) => Entry::Lww(s.unseen_by(ctx)),
            Entry::MvReg(s) => Entry::MvReg(s.unseen_by(ctx)),
        }
    }
    fn overriding(&self, mine: &Self) -> Self {
        match (self, mine) {
            (Entry::GCounter(a), Entry::GCounter(b)) => Entry::GCounter(a.overriding(b)),
            (Entry::PNCounter(a), Entry::PNCounter(b)) => Entry::PNCounter(a.overriding(b)),
            (Entry::ORSet(a), Entry::ORSet(b)) => Entry::ORSet(a.overriding(b)),
            (Entry::Lww(a), Entry::Lww(b)) => Entry::Lww(a.overriding(b)),
            (Entry::MvReg(a), Entry::MvReg(b)) => Entry::MvReg(a.overriding(b)),
            // Kinds differ: no dot is held at the same place.
            (a, _) => Entry::bottom(a.kind()),
        }
    }
    fn seen_elsewhere(&self, mine: &Self, ctx: &CausalContext, out: &mut CausalContext) {
        match (self, mine) {
            (Entry::GCounter(a), Entry::GCounter(b)) => a.seen_elsewhere(b, ctx, out),
            (Entry::PNCounter(a), Entry::PNCounter(b)) => a.seen_elsewhere(b, ctx, out),
            (Entry::ORSet(a), Entry::ORSet(b)) => a.seen_elsewhere(b, ctx, out),
            (Entry::Lww(a), Entry::Lww(b)) => a.seen_elsewhere(b, ctx, out),
            (Entry::MvReg(a), Entry::MvReg(b)) => a.seen_elsewhere(b, ctx, out),
            // Kinds differ: no dot is held at the same place.
            (a, _) => a.seen_elsewhere(&Entry::bottom(a.kind()), ctx, out),
        }
    }
}

/// What a reader sees for a key.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Value {
    /// Grow-only counter value.
    GCounter(u64),
    /// Up-down counter value.
    PNCounter(i64),
    /// Set elements, ascending by canonical JSON.
    ORSet(Vec<Json>),
    /// Register value (`None` when unset or deleted).
    Lww(Option<Json>),
    /// Concurrent values, ascending by canonical JSON.
    MvReg(Vec<Json>),
}

impl Value {
    /// The value of a key that was never written (or was deleted).
    pub fn empty(kind: KeyKind) -> Value {
        Entry::bottom(kind).value()
    }

    /// About the bytes of this value's JSON text (its elements' canonical JSON, one separator
    /// each; 20 for a number): what serving or buffering it costs, without building the text.
    pub fn text_bytes(&self) -> usize {
        match self {
            Value::GCounter(_) | Value::PNCounter(_) => 20,
            Value::Lww(None) => 4,
            Value::Lww(Some(v)) => v.len(),
            Value::ORSet(items) | Value::MvReg(items) => {
                2 + items.iter().map(|v| v.len() + 1).sum::<usize>()
            }
        }
    }
}

/// A mutation of one key.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Mutation {
    /// Add to a counter (must be positive).
    Inc(u64),
    /// Subtract from a pncounter (must be positive).
    Dec(u64),
    /// Add an element to an orset.
    Add(Json),
    /// Remove an element from an orset (observed-remove).
    Remove(Json),
    /// Write a register (lww or mvreg).
    Set(Json),
    /// Remove a whole orset, lww or mvreg key (observed-remove).
    Delete,
}

impl Mutation {
    /// The API name of the operation.
    pub fn name(&self) -> &'static str {
        match self {
            Mutation::Inc(_) => "inc",
            Mutation::Dec(_) => "dec",
            Mutation::Add(_) => "add",
            Mutation::Remove(_) => "remove",
            Mutation::Set(_) => "set",
            Mutation::Delete => "delete",
        }
    }
}

/// Why a mutation was refused. Nothing was changed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum MutationError {
    /// The operation does not apply to the key's type (e.g. `add` on a counter).
    WrongOp {
        /// The key's type.
        kind: KeyKind,
        /// The operation's name.
        op: &'static str,
    },
    /// Counters cannot be deleted or reset.
    CounterNotDeletable(KeyKind),
    /// `inc`/`dec` by zero.
    ZeroAmount,
    /// A LWW write needs a timestamp.
    MissingTimestamp,
    /// The replica has no dot left to give the mutation (its seq `u64::MAX` was seen).
    DotsExhausted(crate::context::DotsExhausted),
    /// The hybrid logical clock cannot tick any more (it reads `(u64::MAX, u32::MAX)`).
    ClockExhausted,
}

impl fmt::Display for MutationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MutationError::WrongOp { kind, op } => {
                write!(f, "operation `{op}` does not apply to type `{kind}`")
            }
            MutationError::CounterNotDeletable(k) => write!(f, "a {k} cannot be deleted"),
            MutationError::ZeroAmount => write!(f, "`by` must be positive"),
            MutationError::MissingTimestamp => write!(f, "lww write without a timestamp"),
            MutationError::DotsExhausted(e) => e.fmt(f),
            MutationError::ClockExhausted => {
                write!(f, "the hybrid logical clock is at its ceiling")
            }
        }
    }
}

impl std::error::Error for MutationError {}

/// Checks that `mutation` applies to keys of `kind`, without changing anything.
///
/// # Errors
/// The [`MutationError`] the mutation would produce.
pub fn check_mutation(kind: KeyKind, mutation: &Mutation) -> Result<(), MutationError> {
    use KeyKind as K;
    use Mutation as M;
    match (kind, mutation) {
        (K::GCounter | K::PNCounter, M::Inc(0)) | (K::PNCounter, M::Dec(0)) => {
            Err(MutationError::ZeroAmount)
        }
        (K::GCounter | K::PNCounter, M::Inc(_))
        | (K::PNCounter, M::Dec(_))
        | (K::ORSet, M::Add(_) | M::Remove(_))
        | (K::Lww | K::MvReg, M::Set(_))
        | (K::ORSet | K::Lww | K::MvReg, M::Delete) => Ok(()),
        (K::GCounter | K::PNCounter, M::Delete) => Err(MutationError::CounterNotDeletable(kind)),
        (kind, m) => Err(MutationError::WrongOp { kind, op: m.name() }),
    }
}

/// The delta-mutator of every type (`docs/design/principles.md`, "Types and delta-mutators"),
/// against the key's current entry.
///
/// `dot` is the fresh dot the mutation takes (every mutation takes one, removals too, so the
/// version vector covers it). Returns the delta `(store, context)` for this key: the context
/// holds `dot` plus every dot the mutation overwrites or removes.
///
/// # Errors
/// [`MutationError`] when the mutation does not apply to the kind.
pub fn delta_mutation(
    kind: KeyKind,
    current: Option<&Entry>,
    mutation: &Mutation,
    dot: Dot,
    ts: Option<Timestamp>,
) -> Result<(Entry, CausalContext), MutationError> {
    check_mutation(kind, mutation)?;
    let bottom = Entry::bottom(kind);
    let current = current.filter(|e| e.kind() == kind).unwrap_or(&bottom);
    let mut ctx = CausalContext::from_dot(dot);
    let store = match (current, mutation) {
        (Entry::GCounter(f), Mutation::Inc(by)) => {
            let base = Entry::counter_dot(f, dot.replica);
            let total = base.as_ref().map_or(0, |(_, v)| *v).saturating_add(*by);
            if let Some((old, _)) = base {
                ctx.insert(old);
            }
            Entry::GCounter(DotFun::single(dot, total))
        }
        (Entry::PNCounter(f), Mutation::Inc(by) | Mutation::Dec(by)) => {
            let base = Entry::counter_dot(f, dot.replica);
            let (p, n) = base.as_ref().map_or((0, 0), |(_, v)| *v);
            if let Some((old, _)) = base {
                ctx.insert(old);
            }
            let pair = if matches!(mutation, Mutation::Inc(_)) {
                (p.saturating_add(*by), n)
            } else {
                (p, n.saturating_add(*by))
            };
            Entry::PNCounter(DotFun::single(dot, pair))
        }
        (Entry::ORSet(m), Mutation::Add(e)) => {
            if let Some(old) = m.get(e) {
                old.for_each_dot(&mut |d| {
                    ctx.insert(d);
                });
            }
            let mut store = DotMap::default();
            store.set(e.clone(), DotSet::single(dot));
            Entry::ORSet(store)
        }
        (Entry::ORSet(m), Mutation::Remove(e)) => {
            if let Some(old) = m.get(e) {
                old.for_each_dot(&mut |d| {
                    ctx.insert(d);
                });
            }
            Entry::ORSet(DotMap::default())
        }
        (Entry::Lww(f), Mutation::Set(v)) => {
            let ts = ts.ok_or(MutationError::MissingTimestamp)?;
            f.for_each_dot(&mut |d| {
                ctx.insert(d);
            });
            Entry::Lww(DotFun::single(dot, (ts, v.clone())))
        }
        (Entry::MvReg(f), Mutation::Set(v)) => {
            f.for_each_dot(&mut |d| {
                ctx.insert(d);
            });
            Entry::MvReg(DotFun::single(dot, v.clone()))
        }
        (e, Mutation::Delete) => {
            e.for_each_dot(&mut |d| {
                ctx.insert(d);
            });
            Entry::bottom(kind)
        }
        (_, m) => {
            return Err(MutationError::WrongOp { kind, op: m.name() });
        }
    };
    Ok((store, ctx))
}

/// Applies a local mutation to the key's current entry in place, with no delta built: the
/// write path of a replica's own operations.
///
/// `current` is the key's entry (`None`: no entry, as for a bottom one) and `dot` the fresh
/// dot the mutation takes. Guarantee: `current` ends exactly as joining the delta of
/// [`delta_mutation`] into a state whose context holds every dot of `current` and not `dot`
/// would leave it (a bottom result is `None`), and the dots that delta's context holds besides
/// `dot` — the ones the mutation overwrote or removed, all dots of `current` — are appended to
/// `removed`. The join would change no other key: every overwritten dot is `current`'s own.
///
/// # Errors
/// [`MutationError`] when the mutation does not apply to the kind, or `current` holds an
/// entry of another kind; `current` is then unchanged.
pub fn mutate_in_place(
    kind: KeyKind,
    current: &mut Option<Entry>,
    mutation: &Mutation,
    dot: Dot,
    ts: Option<Timestamp>,
    removed: &mut Vec<Dot>,
) -> Result<(), MutationError> {
    check_mutation(kind, mutation)?;
    if let Some(e) = current.as_ref()
        && e.kind() != kind
    {
        return Err(MutationError::WrongOp {
            kind: e.kind(),
            op: mutation.name(),
        });
    }
    if matches!(mutation, Mutation::Set(_)) && kind == KeyKind::Lww && ts.is_none() {
        return Err(MutationError::MissingTimestamp);
    }
    let entry = current.get_or_insert_with(|| Entry::bottom(kind));
    let result = match (entry, mutation) {
        (Entry::GCounter(f), Mutation::Inc(by)) => {
            let base = Entry::counter_dot(f, dot.replica);
            let total = base.as_ref().map_or(0, |(_, v)| *v).saturating_add(*by);
            if let Some((old, _)) = base {
                f.remove_dot(&old);
                removed.push(old);
            }
            f.insert(dot, total);
            debug_assert_eq!(
                f.iter().filter(|(d, _)| d.replica == dot.replica).count(),
                1,
                "one live counter dot per replica"
            );
            Ok(())
        }
        (Entry::PNCounter(f), Mutation::Inc(by) | Mutation::Dec(by)) => {
            let base = Entry::counter_dot(f, dot.replica);
            let (p, n) = base.as_ref().map_or((0, 0), |(_, v)| *v);
            if let Some((old, _)) = base {
                f.remove_dot(&old);
                removed.push(old);
            }
            let pair = if matches!(mutation, Mutation::Inc(_)) {
                (p.saturating_add(*by), n)
            } else {
                (p, n.saturating_add(*by))
            };
            f.insert(dot, pair);
            debug_assert_eq!(
                f.iter().filter(|(d, _)| d.replica == dot.replica).count(),
                1,
                "one live counter dot per replica"
            );
            Ok(())
        }
        (Entry::ORSet(m), Mutation::Add(e)) => {
            if let Some(old) = m.replace(e.clone(), DotSet::single(dot)) {
                removed.extend(old.iter().copied());
            }
            Ok(())
        }
        (Entry::ORSet(m), Mutation::Remove(e)) => {
            if let Some(old) = m.take(e) {
                removed.extend(old.iter().copied());
            }
            Ok(())
        }
        (Entry::Lww(f), Mutation::Set(v)) => {
            f.drain_dots(removed);
            if let Some(ts) = ts {
                f.insert(dot, (ts, v.clone()));
            }
            Ok(())
        }
        (Entry::MvReg(f), Mutation::Set(v)) => {
            f.drain_dots(removed);
            f.insert(dot, v.clone());
            Ok(())
        }
        (e, Mutation::Delete) => {
            e.for_each_dot(&mut |d| removed.push(d));
            *e = Entry::bottom(kind);
            Ok(())
        }
        // `check_mutation` admitted the pair, and the entry is of `kind`.
        (_, m) => Err(MutationError::WrongOp { kind, op: m.name() }),
    };
    if current.as_ref().is_some_and(Entry::is_bottom) {
        *current = None;
    }
    result
}

/// [`mutate_in_place`] for a writer whose `Add` and register `Set` cover only its own dots
/// (those of `dot.replica`): every other replica's dots of the element (an orset `Add`) or of
/// the register (an lww/mvreg `Set`) stay in the entry, and only the writer's own overwritten
/// dots are appended to `removed`. Every other mutation is exactly [`mutate_in_place`].
///
/// What it guarantees: each replica's contribution to the entry stays separable by the dots'
/// replica — no replica's write ever removes another's — so [`Entry::retain_replicas`] on the
/// result gives the value the kept replicas' writes alone make, whatever order they arrived
/// in. `current` ends exactly as joining the delta whose store is the written dot and whose
/// context is that dot plus the appended dots would leave it.
///
/// # Errors
/// As [`mutate_in_place`]; `current` is then unchanged.
pub fn mutate_own_in_place(
    kind: KeyKind,
    current: &mut Option<Entry>,
    mutation: &Mutation,
    dot: Dot,
    ts: Option<Timestamp>,
    removed: &mut Vec<Dot>,
) -> Result<(), MutationError> {
    let me = dot.replica;
    // The other replicas' dots the plain mutation would overwrite.
    let others: Option<Entry> = match (current.as_ref(), mutation) {
        (Some(Entry::ORSet(m)), Mutation::Add(e)) => m.get(e).map(|s| {
            let mut one = DotMap::default();
            one.set(e.clone(), s.clone());
            Entry::ORSet(one).retain_replicas(|r| r != me)
        }),
        (Some(e @ (Entry::Lww(_) | Entry::MvReg(_))), Mutation::Set(_)) => {
            Some(e.retain_replicas(|r| r != me))
        }
        _ => None,
    };
    let start = removed.len();
    mutate_in_place(kind, current, mutation, dot, ts, removed)?;
    let Some(others) = others.filter(|o| !o.is_bottom()) else {
        return Ok(());
    };
    let mut i = start;
    while i < removed.len() {
        if removed[i].replica == me {
            i += 1;
        } else {
            removed.swap_remove(i);
        }
    }
    let entry = current.get_or_insert_with(|| Entry::bottom(kind));
    match (entry, others) {
        (Entry::ORSet(m), Entry::ORSet(o)) => {
            for (e, theirs) in o.iter() {
                let mut dots: Vec<Dot> = theirs.iter().copied().collect();
                if let Some(mine) = m.get(e) {
                    dots.extend(mine.iter().copied());
                }
                m.replace(e.clone(), DotSet::from_dots(dots));
            }
        }
        (Entry::Lww(f), Entry::Lww(o)) => {
            for (d, v) in o.iter() {
                f.insert(*d, v.clone());
            }
        }
        (Entry::MvReg(f), Entry::MvReg(o)) => {
            for (d, v) in o.iter() {
                f.insert(*d, v.clone());
            }
        }
        _ => {}
    }
    Ok(())
}

/// A delta (or whole state) of the store: keyed entries plus one shared context.
pub type StoreDelta = Causal<DotMap<Key, Entry>>;

/// Row access for the store join: a backend holding one entry per key plus a dot → key index.
///
/// Implemented by [`MemStore`] and by the node's redb tables, so both run one join algorithm.
pub trait Rows {
    /// The backend's error (e.g. an I/O error); `Infallible` in memory.
    type Error;
    /// The entry under `key`.
    ///
    /// # Errors
    /// Backend failures.
    fn get(&mut self, key: &Key) -> Result<Option<Entry>, Self::Error>;
    /// The part of the entry under `key` that a join with `theirs` (the delta's entry for
    /// `key`, if any) under a delta context whose intersection with the state's context is
    /// `seen` can change: at least every element (of an orset) that `theirs` names or that
    /// holds a dot of `seen`. Any superset is correct too; the default is the whole entry.
    ///
    /// Exact because the join of a [`DotMap`] is per element: an element `theirs` does not
    /// name and holding no dot of `seen` is left as it is. A backend storing a set as rows per
    /// element thus reads O(|δ|) rows however large the set.
    ///
    /// # Errors
    /// Backend failures.
    fn get_part(
        &mut self,
        key: &Key,
        theirs: Option<&Entry>,
        seen: &CausalContext,
    ) -> Result<Option<Entry>, Self::Error> {
        let _ = (theirs, seen);
        self.get(key)
    }
    /// Replaces the entry under `key` (`None` deletes it). `old` is what `get` (or
    /// `get_part`) returned, so the backend can update its rows and dot index by the
    /// difference: for a part, the elements of `old` missing from `new` are removed, those of
    /// `new` written, and every element outside `old` is left as it is.
    ///
    /// # Errors
    /// Backend failures.
    fn put(
        &mut self,
        key: &Key,
        old: Option<&Entry>,
        new: Option<&Entry>,
    ) -> Result<(), Self::Error>;
    /// The keys whose entries hold at least one of `dots` (through the dot index).
    ///
    /// # Errors
    /// Backend failures.
    fn keys_holding(&mut self, dots: &CausalContext) -> Result<Vec<Key>, Self::Error>;
}

/// What [`join_delta`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JoinOutcome {
    /// The part of the delta that inflated the state (redundancy removal,
    /// `docs/design/principles.md` "BP and RR"):
    /// joining it alone gives the same state as joining the whole delta. `None` if nothing changed.
    pub inflation: Option<StoreDelta>,
    /// The keys whose entries changed.
    pub changed: Vec<Key>,
    /// Per key, the dots of the state's entry the join removed there (for a key the delta
    /// carries: what its new entry retired; otherwise a removal alone). Every one of them is
    /// in the inflation's context. A split log record carries a key's retired dots with the
    /// key's entry, and a key's removal alone in one record (docs/design/write-path.md, "Log
    /// records").
    pub retired: Vec<(Key, CausalContext)>,
}

/// Joins `delta` into the rows and context, in O(|δ|) row accesses (never a scan).
///
/// Returns the inflating part and the changed keys. The context is joined last, after every
/// row was written, so a backend that fails midway leaves the context untouched.
///
/// # Errors
/// Backend failures (the caller must then discard its transaction).
pub fn join_delta<R: Rows>(
    rows: &mut R,
    ctx: &mut CausalContext,
    delta: StoreDelta,
) -> Result<JoinOutcome, R::Error> {
    let Causal {
        store: delta_store,
        ctx: mut delta_ctx,
    } = delta;
    // Every dot of the delta, in the one pass that also notices a dot held twice (under two
    // keys, or twice in one entry): conflicting input no correct replica builds (the decoder
    // refuses it). The cross-key rule applies inside the delta too: such a dot is dropped from
    // every entry and stays in the context only, i.e. it acts as a removal. Without this,
    // which copy survives depends on the state the delta meets, and joining the same delta
    // twice is not idempotent.
    let mut delta_dots = CausalContext::new();
    let mut repeated = CausalContext::new();
    delta_store.for_each_dot(&mut |d| {
        if !delta_dots.insert(d) {
            repeated.insert(d);
        }
    });
    let delta_store = if repeated.is_empty() {
        delta_store
    } else {
        delta_ctx.join(&delta_dots);
        let store = drop_dots(delta_store, &repeated);
        delta_dots = store.dots();
        store
    };
    // A delta's dots are in its context (I3). Enforce it for input that breaks it, so the
    // state keeps I3 and never holds a dot its context lacks (which `next_dot` could reissue).
    // A no-op for every delta this crate builds.
    delta_ctx.join(&delta_dots);
    // Dots we have seen that the delta's context holds but its store does not: each of them
    // that is live here is removed by the delta. So is (conflicting input only) a live dot the
    // delta holds under another key: those are added below, from `seen_elsewhere`.
    let seen_by_both = delta_ctx.intersection(ctx);
    let mut candidates = seen_by_both.diff(&delta_dots);
    let mut infl_store: DotMap<Key, Entry> = DotMap::default();
    let mut infl_ctx = delta_ctx.diff(ctx);
    let mut changed = Vec::new();
    let mut retired: Vec<(Key, CausalContext)> = Vec::new();
    let mut touched: Vec<Key> = Vec::new();
    let child_entries: Vec<(Key, Entry)> = delta_store
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let none = CausalContext::new();
    for (key, theirs) in child_entries {
        let old = rows.get_part(&key, Some(&theirs), &seen_by_both)?;
        let mut unseen = theirs.unseen_by(ctx);
        let mut new = old.clone().unwrap_or_else(|| Entry::bottom(key.kind));
        if !seen_by_both.is_empty() {
            // Seen dots of the delta: they may override a value, or be live under another key.
            let overriding = theirs.overriding(&new);
            if !overriding.is_bottom() {
                infl_ctx.join(&overriding.dots());
                unseen.join(&none, overriding, &none);
            }
            theirs.seen_elsewhere(&new, ctx, &mut candidates);
            let before = new.dots();
            new.join(ctx, theirs, &delta_ctx);
            let removed = before.diff(&new.dots());
            if !removed.is_empty() {
                infl_ctx.join(&removed);
                retired.push((key.clone(), removed));
            }
        } else {
            new.join(ctx, theirs, &delta_ctx);
        }
        let new_opt = (!new.is_bottom()).then_some(&new);
        if new_opt != old.as_ref() {
            rows.put(&key, old.as_ref(), new_opt)?;
            changed.push(key.clone());
        }
        if !unseen.is_bottom() {
            infl_store.set(key.clone(), unseen);
        }
        touched.push(key);
    }
    if !candidates.is_empty() {
        touched.sort();
        for key in rows.keys_holding(&candidates)? {
            if touched.binary_search(&key).is_ok() {
                continue;
            }
            let Some(old) = rows.get_part(&key, None, &candidates)? else {
                continue;
            };
            let mut new = old.clone();
            let before = new.dots();
            if new.remove_dots(&candidates) > 0 {
                let removed = before.diff(&new.dots());
                infl_ctx.join(&removed);
                retired.push((key.clone(), removed));
                let new_opt = (!new.is_bottom()).then_some(&new);
                rows.put(&key, Some(&old), new_opt)?;
                changed.push(key);
            }
        }
    }
    ctx.join(&delta_ctx);
    let inflation = (!infl_store.is_bottom() || !infl_ctx.is_empty()).then_some(Causal {
        store: infl_store,
        ctx: infl_ctx,
    });
    Ok(JoinOutcome {
        inflation,
        changed,
        retired,
    })
}

/// `store` without the dots of `removed` (entries left empty are dropped).
fn drop_dots(store: DotMap<Key, Entry>, removed: &CausalContext) -> DotMap<Key, Entry> {
    let mut out: DotMap<Key, Entry> = DotMap::default();
    for (key, entry) in store.iter() {
        let mut entry = entry.clone();
        entry.remove_dots(removed);
        if !entry.is_bottom() {
            out.set(key.clone(), entry);
        }
    }
    out
}

/// An in-memory [`Rows`] backend: entries by key plus the dot → key index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemStore {
    entries: BTreeMap<Key, Entry>,
    index: BTreeMap<Dot, Key>,
}

impl MemStore {
    /// The entries, ascending by key.
    pub fn entries(&self) -> &BTreeMap<Key, Entry> {
        &self.entries
    }
}

impl Rows for MemStore {
    type Error = core::convert::Infallible;
    fn get(&mut self, key: &Key) -> Result<Option<Entry>, Self::Error> {
        Ok(self.entries.get(key).cloned())
    }
    fn put(
        &mut self,
        key: &Key,
        old: Option<&Entry>,
        new: Option<&Entry>,
    ) -> Result<(), Self::Error> {
        if let Some(old) = old {
            old.for_each_dot(&mut |d| {
                self.index.remove(&d);
            });
        }
        match new {
            Some(e) => {
                e.for_each_dot(&mut |d| {
                    self.index.insert(d, key.clone());
                });
                self.entries.insert(key.clone(), e.clone());
            }
            None => {
                self.entries.remove(key);
            }
        }
        Ok(())
    }
    fn keys_holding(&mut self, dots: &CausalContext) -> Result<Vec<Key>, Self::Error> {
        let mut keys = Vec::new();
        for (r, set) in dots.entries() {
            for &(lo, hi) in set.ranges() {
                for (_, k) in self.index.range(Dot::new(*r, lo)..=Dot::new(*r, hi)) {
                    keys.push(k.clone());
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// A whole replicated store in memory: the reference implementation of a node's state, used
/// by tests, simulations and embedded callers that want no disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Store {
    rows: MemStore,
    ctx: CausalContext,
}

fn infallible<T>(r: Result<T, core::convert::Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => match e {},
    }
}

impl Store {
    /// The empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shared causal context.
    pub fn context(&self) -> &CausalContext {
        &self.ctx
    }

    /// The entries, ascending by key.
    pub fn entries(&self) -> &BTreeMap<Key, Entry> {
        self.rows.entries()
    }

    /// The value of `key` (the empty value of its kind when absent).
    pub fn get(&self, key: &Key) -> Value {
        self.rows
            .entries()
            .get(key)
            .map_or_else(|| Value::empty(key.kind), Entry::value)
    }

    /// Applies a local mutation at `replica` with the next dot; returns the delta.
    ///
    /// # Errors
    /// [`MutationError`] when the mutation does not apply, or
    /// [`MutationError::DotsExhausted`] when `replica` has no dot left; nothing changes then.
    pub fn mutate(
        &mut self,
        replica: ReplicaId,
        key: &Key,
        mutation: &Mutation,
        ts: Option<Timestamp>,
    ) -> Result<StoreDelta, MutationError> {
        let dot = self
            .ctx
            .next_dot(replica)
            .map_err(MutationError::DotsExhausted)?;
        let (entry, ctx) =
            delta_mutation(key.kind, self.rows.entries().get(key), mutation, dot, ts)?;
        let mut store = DotMap::default();
        // A bottom entry (a removal) is dropped here; the join finds its key by the dot index.
        store.set(key.clone(), entry);
        let delta = Causal { store, ctx };
        self.apply(delta.clone());
        Ok(delta)
    }

    /// Joins a delta (or a whole state); returns what inflated the store.
    pub fn apply(&mut self, delta: StoreDelta) -> JoinOutcome {
        infallible(join_delta(&mut self.rows, &mut self.ctx, delta))
    }

    /// The whole state as one delta.
    pub fn to_delta(&self) -> StoreDelta {
        let mut store = DotMap::default();
        for (k, e) in self.rows.entries() {
            store.set(k.clone(), e.clone());
        }
        Causal {
            store,
            ctx: self.ctx.clone(),
        }
    }

    /// Invariant I3: every live dot is in the context.
    pub fn dots_within_context(&self) -> bool {
        self.rows.entries().values().all(|e| {
            let mut ok = true;
            e.for_each_dot(&mut |d| ok &= self.ctx.contains(&d));
            ok
        })
    }
}

/// Ingest dedup marks (`docs/design/principles.md`, "Idempotent ingest"): per `(stream, source)`
/// the set of event `seq`s applied.
///
/// A set of intervals per source is itself a lattice (join = union), so marks replicate with
/// the state and a retry to any node that has them is a no-op.
///
/// Guarantee: no source holds an empty set (mutators drop them and the decoder rejects them), so
/// two equal sets of marks are `==` and encode to the same bytes.
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DedupMarks(BTreeMap<(String, String), crate::IntervalSet>);

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for DedupMarks {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(rename = "DedupMarks")]
        struct Raw(crate::strict_map::StrictMap<(String, String), crate::IntervalSet>);
        let entries = Raw::deserialize(d)?.0.0;
        if entries.iter().any(|(_, s)| s.is_empty()) {
            return Err(serde::de::Error::custom(
                "dedup marks hold an empty set for a source",
            ));
        }
        Ok(DedupMarks(entries.into_iter().collect()))
    }
}

impl DedupMarks {
    /// No marks.
    pub fn new() -> Self {
        Self::default()
    }
    /// Has `seq` of `(stream, source)` been applied?
    pub fn contains(&self, stream: &str, source: &str, seq: u64) -> bool {
        self.0
            .get(&(stream.to_owned(), source.to_owned()))
            .is_some_and(|s| s.contains(seq))
    }
    /// Marks `seq` of `(stream, source)`; returns true if it was new.
    pub fn insert(&mut self, stream: &str, source: &str, seq: u64) -> bool {
        self.0
            .entry((stream.to_owned(), source.to_owned()))
            .or_default()
            .insert(seq)
    }
    /// The marks of one source.
    pub fn get(&self, stream: &str, source: &str) -> Option<&crate::IntervalSet> {
        self.0.get(&(stream.to_owned(), source.to_owned()))
    }
    /// Every `((stream, source), seqs)` entry.
    pub fn iter(&self) -> impl Iterator<Item = (&(String, String), &crate::IntervalSet)> {
        self.0.iter()
    }
    /// Sets one source's marks (for backends loading rows).
    pub fn set(&mut self, stream: String, source: String, seqs: crate::IntervalSet) {
        if seqs.is_empty() {
            self.0.remove(&(stream, source));
        } else {
            self.0.insert((stream, source), seqs);
        }
    }
    /// True when there is no mark.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// `self := self ∪ other`; returns the part of `other` that was new (redundancy removal).
    ///
    /// Guarantee: the result is empty exactly when `self` did not change (no empty set is ever
    /// inserted, even for an `other` built with one).
    pub fn join(&mut self, other: &DedupMarks) -> DedupMarks {
        let mut new = DedupMarks::new();
        for (k, theirs) in &other.0 {
            let fresh = match self.0.get(k) {
                Some(mine) => theirs.difference(mine),
                None => theirs.clone(),
            };
            if !fresh.is_empty() {
                self.0.entry(k.clone()).or_default().union_with(&fresh);
                new.0.insert(k.clone(), fresh);
            }
        }
        new
    }
}
