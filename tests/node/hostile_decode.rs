//! Hostile bytes at the node's doors ("one strict admission check": ARCHITECTURE.md, "Admission").
//!
//! * Every decoder of untrusted bytes (frames, deltas, state chunks, causal contexts, dedup
//!   marks) is canonical: `codec::decode(b) == Ok(v)` implies `codec::encode(v) == b`, checked
//!   on valid encodings mutated at random (the same property the `fuzz/` targets check, here in
//!   the normal test suite); what decodes is admitted or rejected without panicking, and the
//!   deltas admitted join as a lattice (commutative, idempotent) into a replica's state.
//! * JSON ops: whatever parses validates or is refused without panicking, and re-serialising
//!   what parsed gives the same ops.
//! * Defect 7: a remote delta whose set element or register value is not the canonical JSON a
//!   local write stores is rejected at admission (`validate_delta`, used by every `StateStore`
//!   and counted by the replica like every other invalid delta).
//! * A dot twice in a state chunk (whose entries are decoded outside a causal context, so the
//!   decoder cannot see it) is rejected at admission; over-long varints in a frame are refused.
//!
//! Seeded: prints `seed = N`; replay with `SEED=N`; `SOAK=1` for ×20 cases.

use crate::common;

use common::{seed, soak};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseResult, TestRng, TestRunner};
use std::sync::atomic::{AtomicUsize, Ordering};
use tidemark::Limits;
use tidemark::admission::{validate_chunk, validate_delta};
use tidemark::codec::{self, CodecError, FORMAT_VERSION};
use tidemark::crdts::dotstore::{DotFun, DotMap};
use tidemark::crdts::{
    Causal, CausalContext, DedupMarks, Dot, Entry, Hlc, Key, KeyKind, Mutation, ReplicaId, Store,
};
use tidemark::model::Rejected;
use tidemark::model::{Delta, StateChunk};
use tidemark::ops::{Op, validate_ops};
use tidemark::proto::Message;

const LIMIT: usize = 1 << 20;
/// Cases of the mutated-bytes property (×20 under `SOAK=1`).
const CASES: u32 = 1_000;

fn check<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> TestCaseResult,
) where
    S::Value: std::fmt::Debug,
{
    let seed = seed(name);
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (seed.rotate_left(8 * (i as u32 % 8)) >> (i / 8)) as u8;
    }
    let config = Config {
        cases: if soak() { cases * 20 } else { cases },
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{name} failed (replay with SEED={seed}):\n{e}");
    }
}

fn rid(i: usize) -> ReplicaId {
    ReplicaId(((i as u128) + 1) << 96 | (i as u128))
}

const ME: usize = 7;

// ---------------------------------------------------------------------------------------------
// Valid inputs: the states and deltas of a few replicas after random local writes.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct W {
    replica: usize,
    kind: u8,
    name: u8,
    op: u8,
    v: u8,
}

fn w() -> impl Strategy<Value = W> {
    (0usize..3, 0u8..5, 0u8..3, 0u8..4, any::<u8>()).prop_map(|(replica, kind, name, op, v)| W {
        replica,
        kind,
        name,
        op,
        v,
    })
}

fn mutation(kind: KeyKind, op: u8, v: u8) -> Mutation {
    let elem = format!("\"e{}\"", v % 4);
    match (kind, op) {
        (KeyKind::GCounter, _) => Mutation::Inc(u64::from(v) + 1),
        (KeyKind::PNCounter, 0 | 1) => Mutation::Inc(u64::from(v) + 1),
        (KeyKind::PNCounter, _) => Mutation::Dec(u64::from(v) + 1),
        (KeyKind::ORSet, 0 | 1) => Mutation::Add(elem),
        (KeyKind::ORSet, 2) => Mutation::Remove(elem),
        (_, 3) => Mutation::Delete,
        _ => Mutation::Set(format!("{{\"v\":{v}}}")),
    }
}

/// Replays the writes on 3 replicas (each joins what the previous write of any replica made
/// with probability 1/2, so contexts overlap); returns their states and every delta with marks.
fn world(ws: &[W]) -> (Vec<Store>, Vec<Delta>) {
    let mut stores = vec![Store::new(); 3];
    let mut clocks: Vec<Hlc> = (0..3).map(|r| Hlc::new(rid(r), 1_000)).collect();
    let mut deltas: Vec<Delta> = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        let kind = KeyKind::ALL[usize::from(w.kind) % 5];
        let key = Key::new(kind, format!("k{}", w.name));
        let ts = clocks[w.replica].now(1_000 + i as u64).ok();
        let Ok(state) =
            stores[w.replica].mutate(rid(w.replica), &key, &mutation(kind, w.op, w.v), ts)
        else {
            continue;
        };
        let mut marks = DedupMarks::new();
        if w.v % 3 == 0 {
            marks.insert("_ops", &format!("src{}", w.replica), u64::from(w.v) + 1);
        }
        let d = Delta { state, marks };
        if w.v % 2 == 0 {
            let next = (w.replica + 1) % 3;
            stores[next].apply(d.state.clone());
        }
        deltas.push(d);
    }
    (stores, deltas)
}

fn chunk_of(s: &Store, marks: DedupMarks, last: bool) -> StateChunk {
    StateChunk {
        after: None,
        upto: None,
        entries: s
            .entries()
            .iter()
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect(),
        ctx: s.context().clone(),
        dots: None,
        marks,
        last,
    }
}

/// Every kind of untrusted encoding the node decodes, from one world.
fn encodings(stores: &[Store], deltas: &[Delta]) -> Vec<(&'static str, Vec<u8>)> {
    let enc = |what: &'static str, v: &dyn erased::Enc| (what, v.enc());
    let mut out = Vec::new();
    let all = deltas.iter().cloned().fold(Delta::default(), |mut a, d| {
        a.join(d);
        a
    });
    for d in deltas.iter().take(3).chain([&all]) {
        out.push(enc("delta", d));
        out.push(enc(
            "frame",
            &Message::Delta {
                epoch: 1,
                log: rid(0),
                from: 3,
                end: 9,
                delta: d.clone(),
            },
        ));
    }
    for s in stores {
        let chunk = chunk_of(s, all.marks.clone(), true);
        out.push(enc("chunk", &chunk));
        out.push(enc("context", s.context()));
        out.push(enc(
            "frame",
            &Message::Have {
                replica: rid(1),
                ctx: s.context().clone(),
            },
        ));
    }
    out.push(enc("marks", &all.marks));
    out.push(enc(
        "frame",
        &Message::Ack {
            epoch: 2,
            log: rid(2),
            upto: 300,
        },
    ));
    out
}

/// Object-safe encoding, so one list can hold every type.
mod erased {
    pub trait Enc {
        fn enc(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Enc for T {
        fn enc(&self) -> Vec<u8> {
            tidemark::codec::encode("test", self).expect("valid values encode")
        }
    }
}

#[derive(Clone, Debug)]
enum ByteEdit {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Set(i, b)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        1 => any::<usize>().prop_map(ByteEdit::Remove),
    ]
}

fn edit(mut b: Vec<u8>, edits: &[ByteEdit]) -> Vec<u8> {
    for e in edits {
        match *e {
            // Byte 0 is the version: keep it so the mutation reaches the decoder.
            ByteEdit::Set(i, v) if b.len() > 1 => {
                let n = b.len() - 1;
                b[1 + i % n] = v;
            }
            ByteEdit::Insert(i, v) if !b.is_empty() => b.insert(1 + i % b.len(), v),
            ByteEdit::Remove(i) if b.len() > 1 => {
                let n = b.len() - 1;
                b.remove(1 + i % n);
            }
            _ => {}
        }
    }
    b
}

/// `decode(b) == Ok(v)` implies `encode(v) == b`, for type `T`.
static DECODED: AtomicUsize = AtomicUsize::new(0);

fn canonical<T: serde::Serialize + serde::de::DeserializeOwned>(b: &[u8]) -> Option<T> {
    let v: T = codec::decode("test", b, LIMIT).ok()?;
    DECODED.fetch_add(1, Ordering::Relaxed);
    let again = codec::encode("test", &v).expect("a decoded value encodes");
    assert_eq!(again, b, "decode(b) = v but encode(v) != b");
    Some(v)
}

/// Admits a decoded delta at replica `me` and joins it, checking the lattice laws.
fn admit_and_join(x: &Store, d: &Delta, e: &Delta) -> TestCaseResult {
    let me = rid(ME);
    let limits = Limits::default();
    let ok_d = validate_delta(d, &limits, me, x.context()).is_ok();
    let ok_e = validate_delta(e, &limits, me, x.context()).is_ok();
    if !(ok_d && ok_e) {
        return Ok(());
    }
    let (mut de, mut ed) = (x.clone(), x.clone());
    de.apply(d.state.clone());
    de.apply(e.state.clone());
    ed.apply(e.state.clone());
    ed.apply(d.state.clone());
    prop_assert_eq!(&de, &ed, "admitted deltas do not commute");
    let once = de.clone();
    de.apply(d.state.clone());
    prop_assert_eq!(
        &de,
        &once,
        "joining an admitted delta twice changed the state"
    );
    prop_assert!(de.dots_within_context());
    let mut m1 = d.marks.clone();
    let n1 = m1.join(&e.marks);
    prop_assert_eq!(
        n1.is_empty(),
        m1 == d.marks,
        "marks join misreports a change"
    );
    let mut m2 = e.marks.clone();
    m2.join(&d.marks);
    prop_assert_eq!(m1, m2, "marks join does not commute");
    Ok(())
}

#[test]
fn every_untrusted_decoder_is_canonical_and_what_it_admits_joins_as_a_lattice() {
    check(
        "every_untrusted_decoder_is_canonical_and_what_it_admits_joins_as_a_lattice",
        CASES,
        (
            proptest::collection::vec(w(), 1..24),
            proptest::collection::vec(proptest::collection::vec(byte_edit(), 1..4), 8),
        ),
        |(ws, edit_sets)| {
            let (stores, deltas) = world(&ws);
            let encs = encodings(&stores, &deltas);
            let x = &stores[0];
            let mut decoded_deltas: Vec<Delta> = deltas.iter().take(2).cloned().collect();
            for (i, edits) in edit_sets.iter().enumerate() {
                let (what, bytes) = &encs[i * 7 % encs.len()];
                // The unmutated encoding decodes to a value that encodes back to it.
                let mutated = edit(bytes.clone(), edits);
                match *what {
                    "frame" => {
                        prop_assert!(canonical::<Message>(bytes).is_some());
                        match canonical::<Message>(&mutated) {
                            Some(Message::Delta { delta, .. }) => decoded_deltas.push(delta),
                            Some(Message::Chunk { chunk, .. }) => {
                                let _ = validate_chunk(
                                    &chunk,
                                    &Limits::default(),
                                    rid(ME),
                                    x.context(),
                                );
                            }
                            _ => {}
                        }
                    }
                    "delta" => {
                        prop_assert!(canonical::<Delta>(bytes).is_some());
                        if let Some(d) = canonical::<Delta>(&mutated) {
                            decoded_deltas.push(d);
                        }
                    }
                    "chunk" => {
                        prop_assert!(canonical::<StateChunk>(bytes).is_some());
                        if let Some(c) = canonical::<StateChunk>(&mutated) {
                            let _ = validate_chunk(&c, &Limits::default(), rid(ME), x.context());
                        }
                    }
                    "context" => {
                        prop_assert!(canonical::<CausalContext>(bytes).is_some());
                        let _ = canonical::<CausalContext>(&mutated);
                    }
                    "marks" => {
                        prop_assert!(canonical::<DedupMarks>(bytes).is_some());
                        if let Some(m) = canonical::<DedupMarks>(&mutated) {
                            prop_assert!(m.iter().all(|(_, s)| !s.is_empty()));
                        }
                    }
                    other => unreachable!("{other}"),
                }
            }
            for (i, d) in decoded_deltas.iter().enumerate() {
                let e = &decoded_deltas[(i + 1) % decoded_deltas.len()];
                admit_and_join(x, d, e)?;
            }
            Ok(())
        },
    );
    // Every case decodes its 8 unmutated encodings; the rest are mutated ones that decoded.
    let cases = (if soak() { CASES * 20 } else { CASES }) as usize;
    let mutated = DECODED.load(Ordering::Relaxed).saturating_sub(8 * cases);
    eprintln!("{mutated} mutated encodings decoded (and were canonical) in {cases} cases");
    assert!(
        mutated > cases / 4,
        "too few mutated encodings decode: {mutated}"
    );
}

#[test]
fn json_ops_that_parse_validate_or_fail_cleanly_and_reserialise_to_themselves() {
    let base = serde_json::to_vec(&vec![
        Op::add("s", "x"),
        Op::remove("s", 1.5),
        Op::set_lww("l", serde_json::json!({"b": [1, 2], "a": null})),
        Op::set_mvreg("m", true),
        Op::inc_gcounter("g", 3).with_id("src", 9),
        Op::dec_pncounter("p", 2),
    ])
    .expect("ops serialise");
    check(
        "json_ops_that_parse_validate_or_fail_cleanly_and_reserialise_to_themselves",
        500,
        proptest::collection::vec(byte_edit(), 1..4),
        |edits| {
            // `edit` keeps byte 0 (`[`) so most mutations stay inside the array.
            let bytes = edit(base.clone(), &edits);
            if let Ok(ops) = serde_json::from_slice::<Vec<Op>>(&bytes) {
                let again: Vec<Op> = serde_json::from_slice(
                    &serde_json::to_vec(&ops).expect("parsed ops serialise"),
                )
                .expect("reserialised ops parse");
                prop_assert_eq!(&again, &ops);
                if let Ok(writes) = validate_ops(&ops, &Limits::default()) {
                    for (_, m) in writes.iter().flat_map(|w| w.ops.iter()) {
                        if let Mutation::Add(t) | Mutation::Remove(t) | Mutation::Set(t) = m {
                            let v: serde_json::Value =
                                serde_json::from_str(t).expect("validated values are JSON");
                            prop_assert_eq!(&v.to_string(), t, "validated value not canonical");
                        }
                    }
                }
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Defect 7: values that are not the JSON a local write stores.
// ---------------------------------------------------------------------------------------------

/// A valid delta from replica 0 writing `m` to `key`.
fn written(kind: KeyKind, m: Mutation) -> Delta {
    let mut s = Store::new();
    let mut clock = Hlc::new(rid(0), 1_000);
    let ts = clock.now(5_000).ok();
    let state = s
        .mutate(rid(0), &Key::new(kind, "k"), &m, ts)
        .expect("mutation applies");
    Delta {
        state,
        marks: DedupMarks::new(),
    }
}

/// The bytes of `d` with the first occurrence of `from` replaced by `to` (same length).
fn patched(d: &Delta, from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut b = codec::encode("delta", d).expect("encodes");
    let at = b
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern present");
    b[at..at + to.len()].copy_from_slice(to);
    b
}

fn admission(d: &Delta) -> Result<(), Rejected> {
    validate_delta(d, &Limits::default(), rid(ME), &CausalContext::new())
}

#[test]
fn a_remote_value_that_is_not_canonical_json_is_rejected_at_admission() {
    // A set element: one quote changed inside the element (the reproduction). The
    // bytes still decode (the element is any string to the codec); admission refuses them.
    let add = written(KeyKind::ORSet, Mutation::Add("\"alice\"".into()));
    assert_eq!(admission(&add), Ok(()));
    let bad: Delta = codec::decode("delta", &patched(&add, b"\"alice\"", b"\"alice'"), LIMIT)
        .expect("still decodes");
    assert!(
        matches!(admission(&bad), Err(Rejected::NotJson { .. })),
        "{:?}",
        admission(&bad)
    );
    // A set element that is JSON but not a scalar (a local add refuses it).
    let obj = written(KeyKind::ORSet, Mutation::Add("[1]".into()));
    assert!(matches!(admission(&obj), Err(Rejected::NotJson { .. })));
    // Register values: not JSON; JSON but not in canonical form (key order, whitespace).
    for kind in [KeyKind::Lww, KeyKind::MvReg] {
        let ok = written(kind, Mutation::Set("{\"a\":1,\"b\":2}".into()));
        assert_eq!(admission(&ok), Ok(()));
        for text in [
            "{\"a\":1,\"b\":",
            "{\"b\":2,\"a\":1}",
            "{\"a\": 1,\"b\":2}",
            "'x'",
        ] {
            let d = written(kind, Mutation::Set(text.into()));
            assert!(
                matches!(admission(&d), Err(Rejected::NotJson { .. })),
                "{kind} {text:?}: {:?}",
                admission(&d)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A dot twice where the decoder cannot see it; over-long varints in a frame.
// ---------------------------------------------------------------------------------------------

#[test]
fn a_dot_twice_in_a_chunk_or_delta_is_rejected_at_admission() {
    let d = Dot::new(rid(0), 1);
    let mv = |v: &str| Entry::MvReg(DotFun::single(d, v.to_owned()));
    let chunk = StateChunk {
        after: None,
        upto: None,
        entries: vec![
            (Key::new(KeyKind::MvReg, "a"), mv("1")),
            (Key::new(KeyKind::MvReg, "b"), mv("2")),
        ],
        ctx: CausalContext::from_dot(d),
        dots: None,
        marks: DedupMarks::new(),
        last: true,
    };
    // The chunk's entries are not inside a causal pair: the codec lets them through...
    let bytes = codec::encode("chunk", &chunk).expect("encodes");
    let decoded: StateChunk = codec::decode("chunk", &bytes, LIMIT).expect("decodes");
    // ...admission does not.
    assert!(matches!(
        validate_chunk(&decoded, &Limits::default(), rid(ME), &CausalContext::new()),
        Err(Rejected::DuplicateDot { .. })
    ));
    // A delta built in memory with the same fault (the decoder would refuse its bytes).
    let mut store = DotMap::default();
    store.set(Key::new(KeyKind::MvReg, "a"), mv("1"));
    store.set(Key::new(KeyKind::MvReg, "b"), mv("2"));
    let delta = Delta {
        state: Causal::new(store, CausalContext::from_dot(d)),
        marks: DedupMarks::new(),
    };
    assert!(
        codec::decode::<Delta>(
            "delta",
            &codec::encode("delta", &delta).expect("encodes"),
            LIMIT
        )
        .is_err()
    );
    assert!(matches!(
        admission(&delta),
        Err(Rejected::DuplicateDot { .. })
    ));
}

#[test]
fn a_frame_with_an_over_long_varint_is_refused() {
    let ack = Message::Ack {
        epoch: 5,
        log: rid(2),
        upto: 7,
    };
    let bytes = codec::encode("frame", &ack).expect("encodes");
    // version, variant index 2 (Ack), epoch 5, ...
    assert_eq!(&bytes[..3], &[FORMAT_VERSION, 2, 5]);
    assert_eq!(
        codec::decode::<Message>("frame", &bytes, LIMIT),
        Ok(ack.clone())
    );
    // The same epoch written as a 3-byte varint: bincode reads it as 5.
    let mut long = bytes[..2].to_vec();
    long.extend([0xfb, 5, 0]);
    long.extend(&bytes[3..]);
    assert!(matches!(
        codec::decode::<Message>("frame", &long, LIMIT),
        Err(CodecError::NotCanonical { .. })
    ));
    // The variant index written long, too.
    let mut long = vec![FORMAT_VERSION, 0xfb, 2, 0];
    long.extend(&bytes[2..]);
    assert!(matches!(
        codec::decode::<Message>("frame", &long, LIMIT),
        Err(CodecError::NotCanonical { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// The fuzz targets' seed corpus (fuzz/corpus/<target>/): valid encodings, kept valid here.
// ---------------------------------------------------------------------------------------------

/// The seed inputs of each fuzz target, built deterministically from a fixed history.
fn fuzz_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let ws: Vec<W> = (0..24u8)
        .map(|i| W {
            replica: usize::from(i % 3),
            kind: i % 5,
            name: i % 3,
            op: (i / 5) % 4,
            v: i.wrapping_mul(37),
        })
        .collect();
    let (stores, deltas) = world(&ws);
    let mut out: Vec<(&'static str, Vec<u8>)> = encodings(&stores, &deltas)
        .into_iter()
        .map(|(what, b)| match what {
            "delta" => ("delta", b),
            "frame" => ("frame", b),
            "chunk" => ("chunk", b),
            "context" => ("context", b),
            "marks" => ("marks", b),
            other => unreachable!("{other}"),
        })
        .collect();
    let chunk = chunk_of(&stores[1], DedupMarks::new(), false);
    out.push((
        "frame",
        codec::encode(
            "frame",
            &Message::Chunk {
                epoch: 1,
                log: rid(1),
                transfer: 4,
                index: 0,
                end: 12,
                chunk,
            },
        )
        .expect("encodes"),
    ));
    let ops = vec![
        Op::add("online", "alice"),
        Op::remove("online", 7),
        Op::set_lww("title", serde_json::json!({"b": [1, 2.5], "a": null})),
        Op::set_mvreg("flag", true),
        Op::inc_gcounter("visits", 3).with_id("web", 9),
        Op::dec_pncounter("stock", 2),
        Op::delete(KeyKind::ORSet, "online"),
    ];
    out.push(("json_ops", serde_json::to_vec(&ops).expect("ops serialise")));
    out
}

/// With `TIDEMARK_WRITE_CORPUS=1` this writes the seeds to `fuzz/corpus/<target>/seed-N`;
/// otherwise it checks that every committed seed still decodes canonically (so a format change
/// that orphans the corpus fails here, not silently in the fuzzer).
#[test]
fn the_fuzz_seed_corpus_decodes_canonically() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    if std::env::var("TIDEMARK_WRITE_CORPUS").is_ok_and(|v| v == "1") {
        let mut n: std::collections::BTreeMap<&str, usize> = Default::default();
        for (target, bytes) in fuzz_seeds() {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).expect("corpus dir");
            let i = n.entry(target).or_default();
            std::fs::write(dir.join(format!("seed-{i}")), bytes).expect("write seed");
            *i += 1;
        }
    }
    let mut checked = 0;
    for target in ["frame", "delta", "chunk", "context", "marks", "json_ops"] {
        let Ok(dir) = std::fs::read_dir(root.join(target)) else {
            panic!("no seed corpus for fuzz target {target} (TIDEMARK_WRITE_CORPUS=1 writes it)");
        };
        for f in dir {
            let path = f.expect("corpus entry").path();
            if !path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
            {
                continue;
            }
            let b = std::fs::read(&path).expect("read seed");
            let ok = match target {
                "frame" => canonical::<Message>(&b).is_some(),
                "delta" => canonical::<Delta>(&b).is_some(),
                "chunk" => canonical::<StateChunk>(&b).is_some(),
                "context" => canonical::<CausalContext>(&b).is_some(),
                "marks" => canonical::<DedupMarks>(&b).is_some(),
                _ => serde_json::from_slice::<Vec<Op>>(&b).is_ok(),
            };
            assert!(ok, "seed {} no longer decodes", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 6, "only {checked} seeds");
}
