//! The properties the fuzz targets check, one function per decoder of untrusted bytes.
//!
//! Every decoder: `decode(b) == Ok(v)` implies `encode(v) == b` (one value, one encoding), and
//! no input panics. What decodes is then run through admission, and what admission accepts is
//! joined into a replica's state, checking the lattice laws the join promises (commutative,
//! idempotent, invariant I3 kept), and that redundancy removal reports a change exactly when the
//! state changed. A violated property panics, which the fuzzer reports as a crash.
#![forbid(unsafe_code)]

use serde::Serialize;
use serde::de::DeserializeOwned;
use tidemark::Limits;
use tidemark::admission::{validate_chunk, validate_delta};
use tidemark::codec;
use tidemark::crdts::{CausalContext, DedupMarks, Hlc, Key, KeyKind, Mutation, ReplicaId, Store};
use tidemark::model::{Delta, StateChunk};
use tidemark::ops::{Op, validate_ops};
use tidemark::proto::Message;

/// Decode limit for fuzz inputs (far above libFuzzer's default `-max_len`).
const LIMIT: usize = 1 << 20;

/// The replica the admission checks run as.
const ME: ReplicaId = ReplicaId(0x7777);

/// `decode(b)`, asserting `encode(decode(b)) == b` when it decodes.
pub fn canonical<T: Serialize + DeserializeOwned>(what: &'static str, b: &[u8]) -> Option<T> {
    let v: T = codec::decode(what, b, LIMIT).ok()?;
    let again = codec::encode(what, &v).expect("a decoded value encodes");
    assert_eq!(again, b, "{what}: decode(b) = v but encode(v) != b");
    Some(v)
}

/// A small valid state to join fuzzed deltas against: two replicas' writes on a few keys.
pub fn base_state() -> Store {
    let mut s = Store::new();
    let mut clock = Hlc::new(ReplicaId(1), 1_000);
    let writes = [
        (KeyKind::ORSet, Mutation::Add("\"a\"".into())),
        (KeyKind::ORSet, Mutation::Add("1".into())),
        (KeyKind::GCounter, Mutation::Inc(3)),
        (KeyKind::PNCounter, Mutation::Dec(2)),
        (KeyKind::Lww, Mutation::Set("{\"x\":1}".into())),
        (KeyKind::MvReg, Mutation::Set("true".into())),
    ];
    for (i, (kind, m)) in writes.into_iter().enumerate() {
        let r = ReplicaId(1 + (i as u128 % 2));
        let ts = clock.now(1_000).ok();
        let _ = s.mutate(r, &Key::new(kind, "k"), &m, ts);
    }
    s
}

/// Admits `d` at a replica holding `x` and checks the join laws on it.
pub fn admit_and_join(x: &Store, d: &Delta) {
    if validate_delta(d, &Limits::default(), ME, x.context()).is_err() {
        return;
    }
    let own = x.to_delta();
    let mut xd = x.clone();
    let out = xd.apply(d.state.clone());
    assert_eq!(
        out.inflation.is_some(),
        &xd != x,
        "redundancy removal misreports a change"
    );
    if let Some(i) = out.inflation {
        let mut via = x.clone();
        via.apply(i);
        assert_eq!(via, xd, "X ⊔ Δ(δ, X) != X ⊔ δ");
    }
    let mut dx = Store::new();
    dx.apply(d.state.clone());
    dx.apply(own);
    assert_eq!(dx, xd, "the join does not commute");
    let once = xd.clone();
    xd.apply(d.state.clone());
    assert_eq!(xd, once, "the join is not idempotent");
    assert!(xd.dots_within_context(), "invariant I3 broken");
    let mut m = x_marks();
    let before = m.clone();
    let new = m.join(&d.marks);
    assert_eq!(
        new.is_empty(),
        m == before,
        "marks join misreports a change"
    );
}

fn x_marks() -> DedupMarks {
    let mut m = DedupMarks::new();
    m.insert("_ops", "src", 1);
    m
}

/// Target `frame`: a whole message as it arrives on a connection.
pub fn frame(data: &[u8]) {
    match canonical::<Message>("frame", data) {
        Some(Message::Delta { delta, .. }) => admit_and_join(&base_state(), &delta),
        Some(Message::Chunk { chunk, .. }) => chunk_checks(&chunk),
        _ => {}
    }
}

/// Target `delta`: a delta (log record or interval payload).
pub fn delta(data: &[u8]) {
    if let Some(d) = canonical::<Delta>("delta", data) {
        admit_and_join(&base_state(), &d);
    }
}

fn chunk_checks(c: &StateChunk) {
    let x = base_state();
    let _ = validate_chunk(c, &Limits::default(), ME, x.context());
}

/// Target `chunk`: one state-transfer chunk.
pub fn chunk(data: &[u8]) {
    if let Some(c) = canonical::<StateChunk>("chunk", data) {
        chunk_checks(&c);
    }
}

/// Target `context`: a causal context (`Have` payloads, stored contexts).
pub fn context(data: &[u8]) {
    if let Some(c) = canonical::<CausalContext>("context", data) {
        let mut j = c.clone();
        assert!(!j.join(&c), "joining a context with itself grew it");
        assert_eq!(j, c);
    }
}

/// Target `marks`: dedup marks.
pub fn marks(data: &[u8]) {
    if let Some(m) = canonical::<DedupMarks>("marks", data) {
        assert!(m.iter().all(|(_, s)| !s.is_empty()), "an empty set decoded");
        let mut a = m.clone();
        assert!(
            a.join(&m).is_empty(),
            "joining marks with themselves reported a change"
        );
        let mut b = x_marks();
        let new = b.join(&m);
        assert_eq!(new.is_empty(), b == x_marks());
    }
}

/// Target `json_ops`: a JSON batch of ops as a client sends it.
pub fn json_ops(data: &[u8]) {
    let Ok(ops) = serde_json::from_slice::<Vec<Op>>(data) else {
        return;
    };
    let text = serde_json::to_vec(&ops).expect("parsed ops serialise");
    let again: Vec<Op> = serde_json::from_slice(&text).expect("reserialised ops parse");
    assert_eq!(again, ops, "ops do not survive a JSON roundtrip");
    if let Ok(writes) = validate_ops(&ops, &Limits::default()) {
        for w in &writes {
            for (_, m) in &w.ops {
                if let Mutation::Add(t) | Mutation::Remove(t) | Mutation::Set(t) = m {
                    let v: serde_json::Value =
                        serde_json::from_str(t).expect("validated values are JSON");
                    assert_eq!(&v.to_string(), t, "validated value is not canonical JSON");
                }
            }
        }
    }
}

/// The HTTP request parsers on untrusted bytes: the first byte picks the parser (a `/v1/ops`
/// body, an NDJSON event line, a query string). No input panics; an accepted ops body yields at
/// most one write per 30 bytes of body (each op names type, key and op); an error names where;
/// a watch or final-window cursor accepted prints back to text that parses to it.
/// Allocation is bounded by `.ci/fuzz.sh` (`-malloc_limit_mb` for this target).
pub fn http_requests(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => match tidemark::http::fuzzing::ops_body(rest) {
            Ok(n) => assert!(n <= rest.len() / 30 + 1, "{n} writes from {} bytes", rest.len()),
            Err((code, _)) => assert!(!code.is_empty()),
        },
        1 => {
            let _ = tidemark::http::fuzzing::event_line(rest);
        }
        _ => {
            if let Ok(q) = std::str::from_utf8(rest) {
                assert!(
                    tidemark::http::fuzzing::cursors_roundtrip(q),
                    "a cursor accepted does not print back to itself"
                );
                for r in tidemark::http::fuzzing::query(q) {
                    if let Err(at) = r {
                        assert!(
                            at.is_some_and(|a| a.starts_with("query")),
                            "a query error names no parameter"
                        );
                    }
                }
            }
        }
    }
}

/// The write-ahead log's decoders (`codec::wal`), over `data` as a log file: frames are read
/// as the store's scan reads them (the store id taken from the first frame, so valid frames
/// can be found), each payload that passes its checksum is decoded into redo operations, and
/// re-encoding those operations gives the payload back byte for byte. No input panics.
pub fn wal(data: &[u8]) {
    use codec::wal::{FRAME_HEADER, push_del, push_put, read_header, redo_ops, check_payload};
    let store_id = data
        .get(8..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    let mut seq = data
        .get(16..24)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    let mut pos = 0usize;
    while let Some(header) = data.get(pos..pos + FRAME_HEADER) {
        let available = (data.len() - pos - FRAME_HEADER) as u64;
        let Ok(h) = read_header(header, store_id, seq, available) else {
            break;
        };
        let start = pos + FRAME_HEADER;
        let Some(payload) = data.get(start..start + h.len) else {
            panic!("read_header accepted a length past the input");
        };
        if check_payload(&h, payload).is_err() {
            break;
        }
        if let Ok(ops) = redo_ops(payload) {
            let mut again = Vec::new();
            for op in ops {
                match op.value {
                    Some(v) => push_put(&mut again, op.table, op.key, v),
                    None => push_del(&mut again, op.table, op.key),
                }
            }
            assert_eq!(again, payload, "redo ops do not re-encode to their payload");
        }
        pos = start + h.len;
        let Some(next) = seq.checked_add(1) else {
            break;
        };
        seq = next;
    }
    // A payload on its own, whatever its frame.
    let _ = redo_ops(data);
}
