//! A large set received in parts is joined part by part (`RangeJoin::join_set_part`), never
//! put back together: the result equals the reference join of the whole state at once
//! (`tidemark_crdts::Store`) and the merged receiver (`merge_chunks` + `apply_chunk`) — rows,
//! context, changed keys, the log's inflation, a third peer replaying the log record by
//! record — whatever the receiver held before (elements the sender removed, its own elements
//! and removals, a dot held under another element than the part's), the chunk sizes, an
//! aborted first try, a lossy and duplicating link; and the elements held at once stay about a
//! part's worth, whatever the set's size.

use super::tests::{Node, TestStore, WALL, config, run};
use super::transfer::merge_chunks;
use super::transfer_rx_tests::{RECEIVER, SENDER, chunks, mv, set};
use crate::admission::SET_PART_WINDOW;
use crate::limits::Limits;
use crate::model::{Delta, StateChunk};
use crate::proto::{ApplyOutcome, ReplicaConfig, StateStore, TransferId};
use crate::store::test_rng::Rng;
use tidemark_crdts::{Causal, DotMap, Entry, Key, KeyKind, Mutation, ReplicaId, Store};

fn big() -> Key {
    Key::new(KeyKind::ORSet, "big")
}

fn elem(i: u64) -> String {
    format!("\"e{i:06}\"")
}

fn add(s: &mut TestStore, names: &[u64]) {
    if names.is_empty() {
        return;
    }
    let ops: Vec<(Key, Mutation)> = names
        .iter()
        .map(|i| (big(), Mutation::Add(elem(*i))))
        .collect();
    s.apply_local(&ops, WALL).expect("store");
}

fn remove(s: &mut TestStore, names: &[u64]) {
    let present: std::collections::BTreeSet<String> = match s
        .entries()
        .into_iter()
        .find(|(k, _)| *k == big())
    {
        Some((_, Entry::ORSet(m))) => m.keys().cloned().collect(),
        _ => return,
    };
    let ops: Vec<(Key, Mutation)> = names
        .iter()
        .map(|i| elem(*i))
        .filter(|e| present.contains(e))
        .map(|e| (big(), Mutation::Remove(e)))
        .collect();
    if !ops.is_empty() {
        s.apply_local(&ops, WALL).expect("store");
    }
}

/// The elements of the large set in `s`.
fn elements(s: &TestStore) -> Vec<String> {
    match s.entries().into_iter().find(|(k, _)| *k == big()) {
        Some((_, Entry::ORSet(m))) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Stages `all` but the last chunk and applies the last one.
fn apply_streamed(r: &mut TestStore, id: TransferId, all: &[StateChunk], end: u64) -> ApplyOutcome {
    let n = all.len() - 1;
    for (i, c) in all[..n].iter().enumerate() {
        let index = u32::try_from(i).expect("index");
        r.stage_chunk(SENDER, id, index, c.clone())
            .expect("store")
            .expect("staged");
    }
    let index = u32::try_from(n).expect("index");
    r.apply_staged(SENDER, id, index, all[n].clone(), Some((id.0, end)), WALL)
        .expect("store")
        .expect("valid transfer")
}

/// The whole transfer as one state (the sender's snapshot: entries and context).
fn whole(all: &[StateChunk]) -> StateChunk {
    let mut held = all.to_vec();
    let last = held.pop().expect("a last chunk");
    merge_chunks(held, last).expect("valid parts")
}

/// One seeded case: a sender with a large set (and other keys) that moved on after the
/// receiver got an early state of it, a receiver with writes of its own to the set, a transfer
/// cut at a random target. Returns (elements the receiver held that no part carries and the
/// transfer removes, the set's parts).
fn case(seed: u64) -> (usize, usize) {
    let mut rng = Rng(seed);
    let mut s = TestStore::new(ReplicaId(1001), Limits::default());
    let n = 150 + rng.below(500);
    // The set in batches, with other keys' writes in between (dots of other keys inside the
    // set's slices).
    let mut next = 0;
    while next < n {
        let k = (1 + rng.below(80)).min(n - next);
        add(&mut s, &(next..next + k).collect::<Vec<_>>());
        next += k;
        set(&mut s, &format!("m{}", rng.below(6)), &format!("v{next}"));
    }
    let early = s.state();
    // The receiver: the early state (or nothing), then writes of its own.
    let knows = rng.below(5) != 0;
    let mut recv_ops: Vec<(bool, Vec<u64>)> = Vec::new();
    for _ in 0..rng.below(6) {
        let names: Vec<u64> = (0..1 + rng.below(40)).map(|_| rng.below(n + 200)).collect();
        recv_ops.push((rng.below(3) != 0, names));
    }
    let receiver = || {
        let mut r = TestStore::new(ReplicaId(1002), Limits::default());
        if knows {
            r.apply_remote(SENDER, early.clone(), None, WALL)
                .expect("store")
                .expect("valid");
        }
        for (is_add, names) in &recv_ops {
            let mut names = names.clone();
            names.sort_unstable();
            names.dedup();
            if *is_add {
                add(&mut r, &names);
            } else {
                remove(&mut r, &names);
            }
        }
        set(&mut r, "mine", "local");
        r
    };
    // The sender moves on: removals (elements the receiver holds), re-adds, new elements.
    for _ in 0..1 + rng.below(6) {
        let mut names: Vec<u64> = (0..1 + rng.below(60)).map(|_| rng.below(n + 100)).collect();
        names.sort_unstable();
        names.dedup();
        match rng.below(3) {
            0 => add(&mut s, &names),
            _ => remove(&mut s, &names),
        }
        if rng.below(2) == 0 {
            s.apply_local(&[(mv(&format!("m{}", rng.below(6))), Mutation::Delete)], WALL)
                .expect("store");
        }
    }
    let target = 400 + usize::try_from(rng.below(3000)).expect("small");
    let (all, end) = chunks(&mut s, RECEIVER, target);
    let parts = all.iter().filter(|c| c.dots.is_some()).count();
    let one = whole(&all);

    // The reference: the receiver's state joined with the whole transfer at once, in memory.
    let mut reference = Store::new();
    let prior = {
        let mut r = receiver();
        reference.apply(r.state().state);
        r
    };
    let mut store = DotMap::default();
    for (k, e) in one.entries.clone() {
        store.set(k, e);
    }
    reference.apply(Causal {
        store,
        ctx: one.ctx.clone(),
    });
    let sender_elems = elements(&s);
    let removed_held = elements(&prior)
        .iter()
        .filter(|e| !sender_elems.contains(e))
        .filter(|e| {
            !matches!(reference.entries().get(&big()), Some(Entry::ORSet(m)) if m.get(*e).is_some())
        })
        .count();

    // Streamed (after an aborted first try), and merged.
    let mut a = receiver();
    let start = a.log_bounds().1;
    let before = a.entries();
    let id: TransferId = (s.replica_id(), 1, 1);
    let cut = usize::try_from(rng.below(all.len() as u64)).expect("small");
    for (i, c) in all[..cut].iter().enumerate() {
        let index = u32::try_from(i).expect("index");
        a.stage_chunk(SENDER, id, index, c.clone())
            .expect("store")
            .expect("staged");
    }
    assert_eq!(a.entries(), before, "nothing staged is applied, seed {seed}");
    // The transfer starts over (a new transfer's first chunk drops the staging).
    let id: TransferId = (s.replica_id(), 1, 2);
    let got = apply_streamed(&mut a, id, &all, end);
    let mut b = receiver();
    let merged = b
        .apply_chunk(SENDER, one, Some((s.replica_id(), end)), WALL)
        .expect("store")
        .expect("valid transfer");

    let expect: Vec<(Key, Entry)> = reference
        .entries()
        .iter()
        .map(|(k, e)| (k.clone(), e.clone()))
        .collect();
    let enc = |v: &Vec<(Key, Entry)>| crate::codec::encode("rows", v).expect("encode");
    assert_eq!(a.entries(), expect, "rows, seed {seed}");
    assert_eq!(enc(&a.entries()), enc(&expect), "rows' bytes, seed {seed}");
    assert_eq!(a.ctx(), reference.context(), "context, seed {seed}");
    a.verify().expect("streamed invariants");
    b.verify().expect("merged invariants");
    assert_eq!(b.entries(), expect, "merged rows, seed {seed}");
    let sorted = |o: &ApplyOutcome| {
        let mut v = o.changed.to_vec();
        v.sort();
        v
    };
    assert_eq!(sorted(&got), sorted(&merged), "changed keys, seed {seed}");
    assert_eq!(got.inflated, merged.inflated);
    let log_a = a.log_interval(start, None, usize::MAX).expect("log").delta;
    let log_b = b.log_interval(start, None, usize::MAX).expect("log").delta;
    assert_eq!(log_a, log_b, "the same delta is forwarded, seed {seed}");
    // A third peer holding what the receiver held — and one that also holds the sender's early
    // state (dots the receiver may never have held: the transfer's removals of no known key) —
    // applies the run record by record (as `log_interval` may forward it) and ends with the
    // receiver's rows; after every record it holds each element of the set it held before the
    // run and holds after it (no record retires an element's old dot before its new one).
    let mut prior = prior;
    for with_early in [false, true] {
        let mut p = TestStore::new(ReplicaId(1003), Limits::default());
        p.apply_remote(SENDER, prior.state(), None, WALL)
            .expect("store")
            .expect("valid");
        if with_early {
            p.apply_remote(SENDER, early.clone(), None, WALL)
                .expect("store")
                .expect("valid");
        }
        let end_elems = elements(&a);
        let kept: Vec<String> = elements(&p)
            .into_iter()
            .filter(|e| end_elems.contains(e))
            .collect();
        let (mut from, log_end) = (start, a.log_bounds().1);
        while from < log_end {
            let interval = a.log_interval(from, None, 1).expect("log");
            if let Some(delta) = interval.delta {
                p.apply_remote(RECEIVER, delta, None, WALL)
                    .expect("store")
                    .expect("valid forwarded record");
            }
            let now = elements(&p);
            let lost: Vec<&String> = kept.iter().filter(|e| !now.contains(e)).collect();
            assert!(
                lost.is_empty(),
                "seed {seed}, early state {with_early}: after the record at {from}, the third \
                 peer lost {lost:?}, held before the run and after it"
            );
            from = interval.end;
        }
        assert_eq!(p.entries(), a.entries(), "third peer, seed {seed}, early {with_early}");
        p.verify().expect("third peer invariants");
    }
    (removed_held, parts)
}

/// Seeded property: a receiver with random prior state — elements of the large set, some of
/// them removed on the sender (no part carries them: the transfer's context removes them),
/// elements and removals of its own — receiving the set in parts cut at random chunk sizes
/// (after an aborted first try) ends byte for byte with the reference join of the whole state
/// at once, the same context, `verify` clean, and the merged receiver's changed keys and log.
#[test]
fn a_set_joined_part_by_part_equals_the_whole_join() {
    let seed0 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5E7_9A27_u64);
    println!("set parts: seed = {seed0} (replay with SEED={seed0})");
    let (mut removed, mut parted) = (0, 0);
    for i in 0..24 {
        let seed = seed0.wrapping_add(i);
        let (r, p) = case(seed);
        removed += r;
        parted += usize::from(p >= 2);
    }
    assert!(removed > 0, "some held elements were removed by the context alone");
    println!("{removed} held elements removed by the context alone; {parted} cases in parts");
    assert!(parted >= 12, "most cases sent the set in parts ({parted})");
}

/// Memory: a set many parts long (and a receiver holding thousands of its elements the sender
/// removed, all inside one part's slice) is joined holding at most a part's elements plus a
/// window of local ones at once, never the set; the chunk bytes held are one chunk's.
#[test]
fn a_set_many_parts_long_is_joined_holding_about_one_part() {
    let mut s = TestStore::new(ReplicaId(1001), Limits::default());
    let n: u64 = 12_000;
    add(&mut s, &(0..3_000).collect::<Vec<_>>());
    let early = s.state();
    remove(&mut s, &(0..3_000).collect::<Vec<_>>());
    add(&mut s, &(3_000..n).collect::<Vec<_>>());
    let mut r = TestStore::new(ReplicaId(1002), Limits::default());
    r.apply_remote(SENDER, early, None, WALL)
        .expect("store")
        .expect("valid");
    add(&mut r, &[1, 5_000, 20_000]);
    let prior_state: Delta = r.state();

    let (all, end) = chunks(&mut s, RECEIVER, 16 << 10);
    let part_elems: Vec<usize> = all
        .iter()
        .filter(|c| c.dots.is_some())
        .map(|c| {
            c.entries
                .iter()
                .map(|(_, e)| match e {
                    Entry::ORSet(m) => m.len(),
                    _ => 0,
                })
                .sum()
        })
        .collect();
    let max_part = part_elems.iter().copied().max().unwrap_or(0);
    assert!(part_elems.len() >= 8, "{} parts", part_elems.len());
    let chunk_max = all
        .iter()
        .map(|c| crate::codec::encode("transfer chunk", c).expect("encode").len())
        .max()
        .unwrap_or(0);

    let mut reference = Store::new();
    reference.apply(prior_state.state);
    let one = whole(&all);
    let mut store = DotMap::default();
    for (k, e) in one.entries {
        store.set(k, e);
    }
    reference.apply(Causal {
        store,
        ctx: one.ctx,
    });
    let id: TransferId = (s.replica_id(), 1, 1);
    apply_streamed(&mut r, id, &all, end);
    let expect: Vec<(Key, Entry)> = reference
        .entries()
        .iter()
        .map(|(k, e)| (k.clone(), e.clone()))
        .collect();
    assert_eq!(r.entries(), expect);
    assert_eq!(r.ctx(), reference.context());
    r.verify().expect("invariants");
    let got = elements(&r);
    assert!(!got.contains(&elem(10)), "an element the sender removed is gone");
    assert!(got.contains(&elem(5_000)) && got.contains(&elem(20_000)));

    let held = usize::try_from(r.stats().transfer_held_elems_peak).expect("peak");
    let bytes = usize::try_from(r.stats().transfer_held_bytes_peak).expect("peak");
    eprintln!(
        "set of {n} elements in {} parts (at most {max_part} elements each): held at most \
         {held} elements and {bytes} bytes (largest chunk {chunk_max})",
        part_elems.len()
    );
    assert!(held > 0);
    assert!(
        held <= max_part + max_part.max(SET_PART_WINDOW),
        "held {held} elements: more than a part ({max_part}) and a window"
    );
    assert!(held * 4 < got.len(), "held {held} of {} elements", got.len());
    assert!(bytes <= chunk_max, "held {bytes} bytes, more than one chunk ({chunk_max})");
}

/// Over the replication core, on a link that loses every fifth message from the sender and
/// delivers every fourth twice: the bootstrap of a large set (retransmitted and duplicated
/// chunks, parts included) is staged once per chunk, applied once, and ends with the
/// sender's rows, the receiver holding about a part's elements.
#[test]
fn a_large_set_over_a_lossy_duplicating_link_is_applied_once() {
    let cfg = ReplicaConfig {
        message_bytes_target: 2_000,
        ..config()
    };
    let mut a = Node::new(0, &[1], cfg.clone());
    let mut b = Node::new(1, &[0], cfg);
    add(&mut a.store, &(0..3_000).collect::<Vec<_>>());
    remove(&mut a.store, &(0..3_000).step_by(7).collect::<Vec<_>>());
    a.write(0, "after", "the set");
    a.up(0, 1);
    b.up(0, 0);
    let (mut t, mut n) = (0, 0u64);
    while t < 120_000 && b.replica.stats().transfers_received == 0 {
        t += 10;
        for tx in a.out() {
            n += 1;
            if n % 5 == 3 {
                continue;
            }
            if n % 4 == 1 {
                b.recv(t, a.id, tx.msg.clone());
            }
            b.recv(t, a.id, tx.msg);
        }
        for tx in b.out() {
            a.recv(t, b.id, tx.msg);
        }
        a.tick(t);
        b.tick(t);
    }
    run(&mut [&mut a, &mut b], t, t + 2_000);
    assert_eq!(b.replica.stats().transfers_received, 1);
    assert_eq!(a.store.entries(), b.store.entries());
    assert_eq!(a.store.ctx(), b.store.ctx());
    b.store.verify().expect("invariants");
    let held = b.store.stats().transfer_held_elems_peak;
    let total = elements(&b.store).len();
    eprintln!("{n} messages from the sender; held at most {held} of {total} elements");
    assert!(held > 0 && held * 5 < u64::try_from(total).expect("n"), "held {held}");
}

/// The set `big` holding `elems` (name, dots of replica 1001).
fn set_of(elems: &[(&str, &[u64])]) -> Entry {
    let mut map: DotMap<String, tidemark_crdts::DotSet> = DotMap::default();
    for (name, seqs) in elems {
        let dots = seqs
            .iter()
            .map(|s| tidemark_crdts::Dot::new(ReplicaId(1001), *s))
            .collect();
        map.set(format!("\"{name}\""), tidemark_crdts::DotSet::from_dots(dots));
    }
    Entry::ORSet(map)
}

/// Input no correct replica builds, joined as the whole join would: the receiver holds a dot
/// under element `x` that a part carries under `y` (the whole join removes it from `x` and, the
/// receiver having seen it, does not add it to `y`), and a dot under `w` that another key of
/// the transfer carries (removed from `w`: the transfer's context covers it and the set does
/// not carry it). Elements named in no part (`v`) lose their dots inside the context; a dot
/// outside it (`u`, 20) stays.
#[test]
fn a_dot_carried_under_another_element_or_key_is_joined_as_the_whole_join() {
    let a = ReplicaId(1001);
    let ctx = |hi: u64| tidemark_crdts::CausalContext::from_range(a, 1, hi);
    let mut r = TestStore::new(ReplicaId(1002), Limits::default());
    let mut held = DotMap::default();
    held.set(
        big(),
        set_of(&[("u", &[20]), ("v", &[2]), ("w", &[3]), ("x", &[5])]),
    );
    let mut prior = ctx(5);
    prior.insert(tidemark_crdts::Dot::new(a, 20));
    r.apply_remote(
        SENDER,
        Delta {
            state: Causal {
                store: held,
                ctx: prior,
            },
            marks: tidemark_crdts::DedupMarks::new(),
        },
        None,
        WALL,
    )
    .expect("store")
    .expect("valid");
    let tctx = ctx(10);
    let cut = tidemark_crdts::Dot::new(a, 6);
    let part = |entries: Vec<(Key, Entry)>, slice: crate::model::DotSlice| StateChunk {
        after: None,
        upto: Some(big()),
        entries,
        ctx: tctx.clone(),
        marks: tidemark_crdts::DedupMarks::new(),
        last: false,
        dots: Some(slice),
    };
    let reg = |seq: u64| {
        Entry::MvReg(tidemark_crdts::DotFun::single(
            tidemark_crdts::Dot::new(a, seq),
            "\"r\"".to_owned(),
        ))
    };
    let all = vec![
        part(
            vec![(big(), set_of(&[("y", &[5]), ("z", &[1, 6])]))],
            crate::model::DotSlice {
                after: None,
                upto: Some(cut),
            },
        ),
        part(
            vec![(big(), set_of(&[("z", &[7])]))],
            crate::model::DotSlice {
                after: Some(cut),
                upto: None,
            },
        ),
        StateChunk {
            after: Some(big()),
            upto: None,
            entries: vec![(mv("reg"), reg(3))],
            ctx: tctx.clone(),
            marks: tidemark_crdts::DedupMarks::new(),
            last: true,
            dots: None,
        },
    ];
    let mut reference = Store::new();
    reference.apply(r.state().state);
    let one = whole(&all);
    let mut store = DotMap::default();
    for (k, e) in one.entries {
        store.set(k, e);
    }
    reference.apply(Causal {
        store,
        ctx: one.ctx,
    });
    let id: TransferId = (ReplicaId(1001), 1, 1);
    let got = apply_streamed(&mut r, id, &all, 1);
    let expect: Vec<(Key, Entry)> = reference
        .entries()
        .iter()
        .map(|(k, e)| (k.clone(), e.clone()))
        .collect();
    assert_eq!(r.entries(), expect);
    assert_eq!(r.ctx(), reference.context());
    assert_eq!(
        elements(&r),
        vec!["\"u\"".to_owned(), "\"z\"".to_owned()],
        "x lost its dot to y's, y was not added, w lost a dot another key carries, v removed"
    );
    assert!(got.changed.to_vec().contains(&big()));
    r.verify().expect("invariants");
}

/// Parts of a set at a key already joined (after a chunk that carried it whole: no correct
/// sender sends them) carry nothing (an entry there is refused) and join nothing again: the
/// receiver ends as with the merged transfer, the set carried once.
#[test]
fn empty_parts_of_a_key_already_joined_join_nothing_again() {
    let a = ReplicaId(1001);
    let tctx = tidemark_crdts::CausalContext::from_range(a, 1, 4);
    let chunk = |entries, upto: Option<Key>, dots, last| StateChunk {
        after: None,
        upto,
        entries,
        ctx: tctx.clone(),
        marks: tidemark_crdts::DedupMarks::new(),
        last,
        dots,
    };
    let all = vec![
        chunk(
            vec![(big(), set_of(&[("p", &[1]), ("q", &[2])]))],
            Some(big()),
            None,
            false,
        ),
        chunk(
            Vec::new(),
            Some(big()),
            Some(crate::model::DotSlice {
                after: None,
                upto: None,
            }),
            false,
        ),
        chunk(Vec::new(), None, None, true),
    ];
    let receiver = || {
        let mut r = TestStore::new(ReplicaId(1002), Limits::default());
        add(&mut r, &[1, 2]);
        r
    };
    let mut merged = receiver();
    merged
        .apply_chunk(SENDER, whole(&all), Some((a, 1)), WALL)
        .expect("store")
        .expect("valid");
    let mut streamed = receiver();
    apply_streamed(&mut streamed, (a, 1, 1), &all, 1);
    assert_eq!(streamed.entries(), merged.entries());
    assert_eq!(streamed.ctx(), merged.ctx());
    assert_eq!(elements(&streamed).len(), 4, "p, q and the receiver's own two");
    streamed.verify().expect("invariants");
}

/// A third peer that holds an element's old dot the receiver never held (copied from the
/// sender before the element was re-added) keeps the element while it applies the receiver's
/// log record by record: the sender S (replica 1001) added `x` (S1), then `y` (S2), then re-added
/// `x` (S3, retiring S1); the set comes in two parts, (∅, S2] holding `y` and (S2, ∞) holding
/// `x`. S1 is a removal of no known key to the receiver, placed with the next dot of its replica
/// (S2, the set's earlier part): it is held back and logged with the set's last part, beside
/// `x`'s new dot — never in a record before it.
#[test]
fn a_removal_placed_on_the_set_waits_for_its_last_part() {
    let a = ReplicaId(1001);
    let mut s = TestStore::new(a, Limits::default());
    s.apply_local(&[(big(), Mutation::Add("\"x\"".to_owned()))], WALL)
        .expect("store");
    let early = s.state();
    s.apply_local(&[(big(), Mutation::Add("\"y\"".to_owned()))], WALL)
        .expect("store");
    s.apply_local(&[(big(), Mutation::Add("\"x\"".to_owned()))], WALL)
        .expect("store");
    assert_eq!(
        s.entries(),
        vec![(big(), set_of(&[("x", &[3]), ("y", &[2])]))],
        "x re-added at S3, y at S2"
    );
    let tctx = tidemark_crdts::CausalContext::from_range(a, 1, 3);
    let cut = tidemark_crdts::Dot::new(a, 2);
    let chunk = |entries: Vec<(Key, Entry)>, upto: Option<Key>, dots, last| StateChunk {
        after: None,
        upto,
        entries,
        ctx: tctx.clone(),
        marks: tidemark_crdts::DedupMarks::new(),
        last,
        dots,
    };
    let all = vec![
        chunk(
            vec![(big(), set_of(&[("y", &[2])]))],
            Some(big()),
            Some(crate::model::DotSlice {
                after: None,
                upto: Some(cut),
            }),
            false,
        ),
        chunk(
            vec![(big(), set_of(&[("x", &[3])]))],
            Some(big()),
            Some(crate::model::DotSlice {
                after: Some(cut),
                upto: None,
            }),
            false,
        ),
        chunk(Vec::new(), None, None, true),
    ];
    let mut r = TestStore::new(ReplicaId(1002), Limits::default());
    let start = r.log_bounds().1;
    apply_streamed(&mut r, (a, 1, 1), &all, 3);
    assert_eq!(r.entries(), s.entries());
    assert_eq!(r.ctx(), s.ctx());

    let mut p = TestStore::new(ReplicaId(1003), Limits::default());
    p.apply_remote(SENDER, early, None, WALL)
        .expect("store")
        .expect("valid");
    assert_eq!(elements(&p), vec!["\"x\"".to_owned()]);
    let (mut from, end) = (start, r.log_bounds().1);
    let mut records = 0;
    while from < end {
        let interval = r.log_interval(from, None, 1).expect("log");
        if let Some(delta) = interval.delta {
            records += 1;
            p.apply_remote(RECEIVER, delta, None, WALL)
                .expect("store")
                .expect("valid forwarded record");
        }
        assert!(
            elements(&p).contains(&"\"x\"".to_owned()),
            "after record {records} the third peer lost x: {:?}",
            p.entries()
        );
        from = interval.end;
    }
    assert!(records >= 2, "one record per part ({records})");
    assert_eq!(p.entries(), r.entries());
    p.verify().expect("third peer invariants");
}

/// A part whose slice ends at or before where it starts is refused: with slices (∅, 1001/1],
/// (1001/1, 5/1] (inverted) and (5/1, ∞), the third part holds 1001/1 again, and joining it
/// under a context clipped to its slice would drop the dot its first part carried. The
/// transfer is refused at that part and nothing is applied.
#[test]
fn an_inverted_slice_is_refused_and_applies_nothing() {
    let a = ReplicaId(1001);
    let low = ReplicaId(5);
    let d1 = tidemark_crdts::Dot::new(a, 1);
    let d5 = tidemark_crdts::Dot::new(low, 1);
    let mut tctx = tidemark_crdts::CausalContext::from_range(a, 1, 2);
    tctx.insert(d5);
    let part = |entries: Vec<(Key, Entry)>, after, upto| StateChunk {
        after: None,
        upto: Some(big()),
        entries,
        ctx: tctx.clone(),
        marks: tidemark_crdts::DedupMarks::new(),
        last: false,
        dots: Some(crate::model::DotSlice { after, upto }),
    };
    let all = vec![
        part(vec![(big(), set_of(&[("x", &[1])]))], None, Some(d1)),
        part(Vec::new(), Some(d1), Some(d5)),
        part(vec![(big(), set_of(&[("x", &[1]), ("z", &[2])]))], Some(d5), None),
        StateChunk {
            after: Some(big()),
            upto: None,
            entries: Vec::new(),
            ctx: tctx.clone(),
            marks: tidemark_crdts::DedupMarks::new(),
            last: true,
            dots: None,
        },
    ];
    let mut r = TestStore::new(ReplicaId(1002), Limits::default());
    add(&mut r, &[7]);
    let (before, ctx_before) = (r.entries(), r.ctx().clone());
    let id: TransferId = (a, 1, 1);
    let mut refused = None;
    for (i, c) in all[..3].iter().enumerate() {
        let index = u32::try_from(i).expect("index");
        if let Err(reason) = r.stage_chunk(SENDER, id, index, c.clone()).expect("store") {
            refused = Some((i, reason));
            break;
        }
    }
    let (at, reason) = refused.expect("the inverted part is refused");
    assert_eq!(at, 1, "refused at the inverted part: {reason}");
    assert!(reason.to_string().contains("ends at or before"), "{reason}");
    // Staged whole or applied at once, it is refused all the same.
    let applied = r
        .apply_staged(SENDER, id, 3, all[3].clone(), Some((a, 2)), WALL)
        .expect("store");
    assert!(applied.is_err(), "{applied:?}");
    let mut held = all.clone();
    let last = held.pop().expect("the last chunk");
    assert!(merge_chunks(held, last).is_err(), "the merged transfer is refused too");
    assert_eq!(r.entries(), before, "nothing applied");
    assert_eq!(*r.ctx(), ctx_before, "the context is unchanged");
    r.verify().expect("invariants");
}
