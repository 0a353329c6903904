//! Coalescing a batch's view mutations into one mutation per view cell (the cost of views): the
//! counts of a cell are summed, its set elements reduced to each element's last action, and
//! of its `latest` writes only the one with the greatest event stamp is kept. Applied after
//! lateness was decided per event, and only when no event of the batch can turn out to be a
//! duplicate or be refused at commit (see [`super::Views::begin_batch`]), so the committed
//! value of every cell is the one the per-event mutations would give.
//!
//! A batch is folded straight into one accumulator per cell ([`coalesce_cells`]): cells are
//! named by their index in the batch's cell list ([`super::fold::FoldedBatch::cells`]), so no
//! key is hashed, compared or copied per event; a cell's key is copied once, into its merged
//! op. [`coalesce`] is the same rule over ops keyed by their keys.

use super::keys;
use std::collections::{BTreeMap, HashMap};
use tidemark_crdts::{Key, KeyKind, Mutation, Timestamp};

/// A fast, per-process seeded hash map (the elements of one cell).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One event's on-time view op: its cell's index, the mutation and its event stamp (`latest`).
pub type CellOp = (u32, Mutation, Option<Timestamp>);

enum CellAcc<'a> {
    Counter {
        inc: u64,
        dec: u64,
    },
    /// Elements in first-seen order with their last action (an add?); where each is sits in
    /// the batch-wide map of [`coalesce_cells_ref`].
    Set(Vec<(&'a str, bool)>),
    /// The op with the greatest event stamp.
    Latest(&'a Mutation, Timestamp),
}

/// A merged mutation of [`coalesce_cells_ref`], borrowing the batch's element texts and
/// `latest` records (a copy is made only of what is kept, [`MergedRef::to_mutation`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergedRef<'a> {
    /// A counter increment.
    Inc(u64),
    /// A counter decrement.
    Dec(u64),
    /// An add of the element (its JSON text).
    Add(&'a str),
    /// A remove of the element (its JSON text).
    Remove(&'a str),
    /// The `latest` write kept.
    Latest(&'a Mutation),
}

impl MergedRef<'_> {
    /// The mutation, owned.
    pub fn to_mutation(&self) -> Mutation {
        match self {
            Self::Inc(n) => Mutation::Inc(*n),
            Self::Dec(n) => Mutation::Dec(*n),
            Self::Add(e) => Mutation::Add((*e).to_owned()),
            Self::Remove(e) => Mutation::Remove((*e).to_owned()),
            Self::Latest(m) => (*m).clone(),
        }
    }
}

/// One merged op of [`coalesce_cells_ref`]: the cell's index, the mutation and its stamp.
pub type MergedOp<'a> = (u32, MergedRef<'a>, Option<Timestamp>);

/// The ops of `per_event` (the events' on-time ops, event after event) with one mutation per cell and
/// set element, in first-seen cell order: the cell's index (in `cells`), the mutation and its
/// event stamp (of the `latest` op kept) — what [`coalesce`] gives for the same ops keyed by
/// their cells' keys. `None` when a cell's ops have mixed shapes (no view makes such ops; the
/// caller then uses [`coalesce`]).
pub fn coalesce_cells(cells: &[Key], per_event: &[CellOp]) -> Option<Vec<CellOp>> {
    Some(
        coalesce_cells_ref(cells, per_event)?
            .into_iter()
            .map(|(c, m, s)| (c, m.to_mutation(), s))
            .collect(),
    )
}

/// [`coalesce_cells`] with the merged mutations borrowing from `per_event`: no element text
/// or record is copied (adds the caller drops, such as those of elements already held, cost
/// nothing).
pub fn coalesce_cells_ref<'a>(cells: &[Key], per_event: &'a [CellOp]) -> Option<Vec<MergedOp<'a>>> {
    let mut acc: Vec<Option<CellAcc<'a>>> = Vec::new();
    acc.resize_with(cells.len(), || None);
    let mut order: Vec<usize> = Vec::new();
    // (cell, element) → its place in the cell's list, sized once for the batch.
    let set_ops = per_event
        .iter()
        .filter(|(_, m, _)| matches!(m, Mutation::Add(_) | Mutation::Remove(_)))
        .count();
    let mut at: FastMap<(u32, &'a str), usize> =
        FastMap::with_capacity_and_hasher(set_ops, foldhash::fast::RandomState::default());
    for (cell, m, stamp) in per_event {
        let c = *cell as usize;
        let key = cells.get(c)?;
        let slot = acc.get_mut(c)?;
        let a = match slot {
            Some(a) => a,
            None => {
                order.push(c);
                slot.insert(match (key.kind, m, stamp) {
                    (
                        KeyKind::GCounter | KeyKind::PNCounter,
                        Mutation::Inc(_) | Mutation::Dec(_),
                        _,
                    ) => CellAcc::Counter { inc: 0, dec: 0 },
                    (KeyKind::ORSet, Mutation::Add(_) | Mutation::Remove(_), _) => {
                        CellAcc::Set(Vec::new())
                    }
                    (KeyKind::Lww, Mutation::Set(_), Some(s)) => CellAcc::Latest(m, *s),
                    _ => return None,
                })
            }
        };
        match (a, m) {
            (CellAcc::Counter { inc, .. }, Mutation::Inc(n)) => *inc = inc.saturating_add(*n),
            (CellAcc::Counter { dec, .. }, Mutation::Dec(n)) => *dec = dec.saturating_add(*n),
            (CellAcc::Set(elems), Mutation::Add(e) | Mutation::Remove(e)) => {
                let add = matches!(m, Mutation::Add(_));
                match at.entry((*cell, e.as_str())) {
                    std::collections::hash_map::Entry::Occupied(o) => {
                        if let Some(x) = elems.get_mut(*o.get()) {
                            x.1 = add;
                        }
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(elems.len());
                        elems.push((e.as_str(), add));
                    }
                }
            }
            (CellAcc::Latest(best, best_stamp), Mutation::Set(_)) => {
                // Stamps are unique per event (source, seq), so no two are equal.
                let s = (*stamp)?;
                if s > *best_stamp {
                    *best = m;
                    *best_stamp = s;
                }
            }
            _ => return None,
        }
    }
    let mut out = Vec::with_capacity(order.len().max(at.len()));
    for c in order {
        let (Some(key), Some(Some(a))) = (cells.get(c), acc.get_mut(c).map(Option::take)) else {
            continue;
        };
        let cell = c as u32;
        match a {
            CellAcc::Counter { inc, dec } => {
                let m = if key.kind == KeyKind::GCounter {
                    (inc > 0).then_some(MergedRef::Inc(inc))
                } else {
                    match inc.cmp(&dec) {
                        std::cmp::Ordering::Greater => Some(MergedRef::Inc(inc - dec)),
                        std::cmp::Ordering::Less => Some(MergedRef::Dec(dec - inc)),
                        std::cmp::Ordering::Equal => None,
                    }
                };
                out.extend(m.map(|m| (cell, m, None)));
            }
            CellAcc::Set(elems) => {
                out.extend(elems.into_iter().map(|(e, add)| {
                    let m = if add {
                        MergedRef::Add(e)
                    } else {
                        MergedRef::Remove(e)
                    };
                    (cell, m, None)
                }));
            }
            CellAcc::Latest(m, s) => out.push((cell, MergedRef::Latest(m), Some(s))),
        }
    }
    Some(out)
}

/// An accumulator of [`coalesce`].
enum Acc {
    Counter {
        inc: u64,
        dec: u64,
    },
    /// Element → (first position, last action is an add).
    Set(Vec<(String, bool)>, BTreeMap<String, usize>),
    Latest(Mutation),
    Raw(Vec<Mutation>),
}

/// `ops` with one mutation per cell and set element, in first-seen key order.
pub fn coalesce(ops: Vec<(Key, Mutation)>) -> Vec<(Key, Mutation)> {
    let mut at: HashMap<Key, usize> = HashMap::new();
    let mut acc: Vec<(Key, Acc)> = Vec::new();
    for (key, m) in ops {
        let slot = match at.get(&key) {
            Some(&i) => &mut acc[i].1,
            None => {
                at.insert(key.clone(), acc.len());
                let fresh = match (&key.kind, &m) {
                    (
                        KeyKind::GCounter | KeyKind::PNCounter,
                        Mutation::Inc(_) | Mutation::Dec(_),
                    ) => Acc::Counter { inc: 0, dec: 0 },
                    (KeyKind::ORSet, Mutation::Add(_) | Mutation::Remove(_)) => {
                        Acc::Set(Vec::new(), BTreeMap::new())
                    }
                    (KeyKind::Lww, Mutation::Set(_)) if keys::event_stamp(&key, &m).is_some() => {
                        Acc::Latest(m.clone())
                    }
                    _ => Acc::Raw(Vec::new()),
                };
                acc.push((key.clone(), fresh));
                let last = acc.len() - 1;
                &mut acc[last].1
            }
        };
        match (slot, m) {
            (Acc::Counter { inc, .. }, Mutation::Inc(n)) => *inc = inc.saturating_add(n),
            (Acc::Counter { dec, .. }, Mutation::Dec(n)) => *dec = dec.saturating_add(n),
            (Acc::Set(elems, at), m @ (Mutation::Add(_) | Mutation::Remove(_))) => {
                let (e, add) = match m {
                    Mutation::Add(e) => (e, true),
                    Mutation::Remove(e) => (e, false),
                    _ => continue,
                };
                match at.get(&e) {
                    Some(&i) => elems[i].1 = add,
                    None => {
                        at.insert(e.clone(), elems.len());
                        elems.push((e, add));
                    }
                }
            }
            (Acc::Latest(best), m @ Mutation::Set(_)) => {
                let (new, old) = (keys::event_stamp(&key, &m), keys::event_stamp(&key, best));
                if new.is_some() && new > old {
                    *best = m;
                }
            }
            (Acc::Raw(v), m) => v.push(m),
            // A key seen with another mutation shape than its first: keep it as is.
            (slot, m) => {
                let mut raw = Vec::new();
                match std::mem::replace(slot, Acc::Raw(Vec::new())) {
                    Acc::Raw(v) => raw = v,
                    other => raw.extend(flush(&key, other)),
                }
                raw.push(m);
                *slot = Acc::Raw(raw);
            }
        }
    }
    let mut out = Vec::with_capacity(acc.len());
    for (key, a) in acc {
        out.extend(flush(&key, a).into_iter().map(|m| (key.clone(), m)));
    }
    out
}

fn flush(key: &Key, a: Acc) -> Vec<Mutation> {
    match a {
        Acc::Counter { inc, dec: _ } if key.kind == KeyKind::GCounter => (inc > 0)
            .then_some(Mutation::Inc(inc))
            .into_iter()
            .collect(),
        Acc::Counter { inc, dec } => match inc.cmp(&dec) {
            std::cmp::Ordering::Greater => vec![Mutation::Inc(inc - dec)],
            std::cmp::Ordering::Less => vec![Mutation::Dec(dec - inc)],
            std::cmp::Ordering::Equal => Vec::new(),
        },
        Acc::Set(elems, _) => elems
            .into_iter()
            .map(|(e, add)| {
                if add {
                    Mutation::Add(e)
                } else {
                    Mutation::Remove(e)
                }
            })
            .collect(),
        Acc::Latest(m) => vec![m],
        Acc::Raw(v) => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_get_one_mutation_each() {
        let c = Key::new(KeyKind::GCounter, "~view/c/d/1/[]");
        let p = Key::new(KeyKind::PNCounter, "~view/s/d/1/[]");
        let s = Key::new(KeyKind::ORSet, "~view/u/d/1/[]");
        let l = Key::new(KeyKind::Lww, "~view/l/d/1/[]");
        let rec = |t: u64, v: &str| Mutation::Set(keys::latest_record(t, "src", t, &v.into()));
        let out = coalesce(vec![
            (c.clone(), Mutation::Inc(1)),
            (p.clone(), Mutation::Inc(5)),
            (s.clone(), Mutation::Add("\"a\"".into())),
            (l.clone(), rec(20, "late")),
            (c.clone(), Mutation::Inc(2)),
            (p.clone(), Mutation::Dec(7)),
            (s.clone(), Mutation::Add("\"b\"".into())),
            (s.clone(), Mutation::Remove("\"a\"".into())),
            (l.clone(), rec(10, "early")),
        ]);
        assert_eq!(
            out,
            vec![
                (c, Mutation::Inc(3)),
                (p, Mutation::Dec(2)),
                (s.clone(), Mutation::Remove("\"a\"".into())),
                (s, Mutation::Add("\"b\"".into())),
                (l, rec(20, "late")),
            ]
        );
    }

    #[test]
    fn cells_fold_as_keys_coalesce() {
        let cells = vec![
            Key::new(KeyKind::GCounter, "~view/c/d/1/[]"),
            Key::new(KeyKind::PNCounter, "~view/s/d/1/[]"),
            Key::new(KeyKind::ORSet, "~view/u/d/1/[]"),
            Key::new(KeyKind::Lww, "~view/l/d/1/[]"),
            Key::new(KeyKind::PNCounter, "~view/s/d/2/[]"),
        ];
        let rec = |t: u64, v: &str| Mutation::Set(keys::latest_record(t, "src", t, &v.into()));
        let st = |t: u64| Some(keys::stamp(t, "src", t));
        let per_event: Vec<Vec<CellOp>> = vec![
            vec![
                (0, Mutation::Inc(1), None),
                (1, Mutation::Inc(5), None),
                (2, Mutation::Add("\"a\"".into()), None),
            ],
            vec![(3, rec(20, "late"), st(20)), (4, Mutation::Inc(2), None)],
            vec![],
            vec![
                (0, Mutation::Inc(2), None),
                (1, Mutation::Dec(7), None),
                (2, Mutation::Add("\"b\"".into()), None),
                (2, Mutation::Remove("\"a\"".into()), None),
                (3, rec(10, "early"), st(10)),
                (4, Mutation::Dec(2), None),
            ],
        ];
        let by_cells = coalesce_cells(&cells, &per_event.concat()).expect("one shape per cell");
        let keyed: Vec<(Key, Mutation)> = per_event
            .iter()
            .flatten()
            .map(|(c, m, _)| (cells[*c as usize].clone(), m.clone()))
            .collect();
        let by_keys = coalesce(keyed);
        let named: Vec<(Key, Mutation)> = by_cells
            .iter()
            .map(|(c, m, _)| (cells[*c as usize].clone(), m.clone()))
            .collect();
        assert_eq!(named, by_keys);
        // The `latest` op kept carries its stamp; no other op has one.
        let stamps: Vec<_> = by_cells.iter().map(|(_, _, s)| *s).collect();
        assert_eq!(stamps, vec![None, None, None, None, st(20)]);
        // Mixed shapes in one cell: left to the rule over keys.
        let mixed = vec![
            (0, Mutation::Inc(1), None),
            (0, Mutation::Add("x".into()), None),
        ];
        assert_eq!(coalesce_cells(&cells, &mixed), None);
    }
}
