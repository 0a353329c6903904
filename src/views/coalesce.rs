//! Coalescing a batch's view mutations into one mutation per view cell (the cost of views): the
//! counts of a cell are summed, its set elements reduced to each element's last action, and
//! of its `latest` writes only the one with the greatest event stamp is kept. Applied after
//! lateness was decided per event, and only when no event of the batch can turn out to be a
//! duplicate or be refused at commit (see [`super::Views::begin_batch`]), so the committed
//! value of every cell is the one the per-event mutations would give.

use super::keys;
use std::collections::{BTreeMap, HashMap};
use tidemark_crdts::{Key, KeyKind, Mutation};

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
}
