//! Session windows (`window = { session = .. }`, `src/views/session.rs`).
//!
//! The model test: four session views (`count`, `sum`, `distinct`, `latest`, grouped by
//! `user`) over 3 embedded nodes in a mesh, seeded random steps — batches of 1–5 events with
//! out-of-order and late times (some retried on the same node: duplicates) ingested on a
//! random node, partitions and heals of random pairs (random delivery order), restarts, feed
//! consumers on every node that crash at random before saving their cursor. After every step
//! every view is read on every node: a session reported final never changes value (or bounds)
//! afterwards and every node reporting it final reports the same. At the end all is healed,
//! every node ingests one event far ahead (in a group of its own) and seal rounds run until
//! every other session is final: every node then reports the same sessions, and every session
//! ever reported final equals the batch recount — sessionizing the events acknowledged as
//! applied, neither duplicate nor late (the late lane says which), per group by the gap
//! (`t2 − t1 < gap`), value per kind. Each consumer's sink ends equal to the final sessions.
//! Seeded: replay with `SEED=`; `SOAK=1` runs more rounds and steps.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tidemark::views::{Event, FinalCursor, ViewDef, ViewQuery, keys};
use tidemark::{Error, Node, NodeConfig};

use crate::common;

const VIEWS: [&str; 4] = ["clicks", "spend", "pages", "last"];
const USERS: [&str; 3] = ["u0", "u1", "u2"];
/// The group of the far events that close everything at the end.
const CLOSER: &str = "zz";

#[derive(Clone, Copy, Debug)]
struct Spec {
    gap: u64,
    lateness: u64,
    ooo: u64,
}

fn defs(s: Spec) -> Vec<ViewDef> {
    let w = json!({"session": format!("{}ms", s.gap), "lateness": format!("{}ms", s.lateness),
                   "out_of_orderness": format!("{}ms", s.ooo)});
    serde_json::from_value(json!([
        {"name": "clicks", "stream": "s", "kind": "count", "group_by": ["user"], "window": w},
        {"name": "spend", "stream": "s", "kind": "sum", "group_by": ["user"], "field": "amount",
         "window": w},
        {"name": "pages", "stream": "s", "kind": "distinct", "group_by": ["user"],
         "field": "page", "window": w},
        {"name": "last", "stream": "s", "kind": "latest", "group_by": ["user"], "field": "page",
         "window": w},
    ]))
    .expect("defs")
}

async fn open(dir: &std::path::Path, s: Spec) -> Node {
    let started = Instant::now();
    loop {
        let mut cfg = NodeConfig::new(dir);
        cfg.views = defs(s);
        match Node::open(cfg).await {
            Ok(n) => return n,
            // A just-shut-down database may still be held for a moment.
            Err(e) if format!("{e:?}").contains("AlreadyOpen") => {
                assert!(started.elapsed() < Duration::from_secs(5), "{e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("open: {e}"),
        }
    }
}

#[derive(Clone, Debug)]
struct Ev {
    source: String,
    seq: u64,
    time: u64,
    user: &'static str,
    amount: i64,
    page: &'static str,
}

impl Ev {
    fn event(&self) -> Event {
        Event::new(
            &self.source,
            self.seq,
            json!({"user": self.user, "amount": self.amount, "page": self.page}),
        )
        .at(self.time)
    }
}

/// `(view, user, session start)`.
type Sess = (String, String, u64);

/// The batch recount: `counted[view]` are the events applied and not late for the view.
/// Sessions per user over the occupied times (a `sum` time whose amounts net to 0 holds no
/// event of the sum view's sessions: API.md), split where consecutive times are `gap` apart
/// or more; value → `(end, value)`.
fn recount(
    gap: u64,
    counted: &BTreeMap<&str, Vec<Ev>>,
) -> BTreeMap<Sess, (u64, serde_json::Value)> {
    let mut out = BTreeMap::new();
    for (view, events) in counted {
        let mut by_user: BTreeMap<&str, BTreeMap<u64, Vec<&Ev>>> = BTreeMap::new();
        for e in events {
            by_user
                .entry(e.user)
                .or_default()
                .entry(e.time)
                .or_default()
                .push(e);
        }
        for (user, times) in by_user {
            let occupied: Vec<(u64, &Vec<&Ev>)> = times
                .iter()
                .filter(|(_, evs)| {
                    *view != "spend" || evs.iter().map(|e| e.amount).sum::<i64>() != 0
                })
                .map(|(t, evs)| (*t, evs))
                .collect();
            let mut sessions: Vec<Vec<(u64, &Vec<&Ev>)>> = Vec::new();
            for (t, evs) in occupied {
                match sessions.last_mut() {
                    Some(s) if t - s.last().map_or(0, |x| x.0) < gap => s.push((t, evs)),
                    _ => sessions.push(vec![(t, evs)]),
                }
            }
            for s in sessions {
                let (first, last) = (s[0].0, s[s.len() - 1].0);
                let evs: Vec<&Ev> = s.iter().flat_map(|(_, e)| e.iter().copied()).collect();
                let value = match *view {
                    "clicks" => json!(evs.len()),
                    "spend" => json!(evs.iter().map(|e| e.amount).sum::<i64>()),
                    "pages" => json!(
                        evs.iter()
                            .map(|e| e.page)
                            .collect::<BTreeSet<_>>()
                            .into_iter()
                            .collect::<Vec<_>>()
                    ),
                    _ => {
                        let best = evs
                            .iter()
                            .max_by_key(|e| keys::stamp(e.time, &e.source, e.seq))
                            .map(|e| e.page);
                        json!(best)
                    }
                };
                out.insert(
                    ((*view).to_owned(), user.to_owned(), first),
                    (last + gap, value),
                );
            }
        }
    }
    out
}

/// Every session of every view on `node`: → `(end, value, final)`.
async fn sessions(node: &Node) -> BTreeMap<Sess, (u64, serde_json::Value, bool)> {
    let mut out = BTreeMap::new();
    for v in VIEWS {
        let page = node.view(v, &ViewQuery::default()).await.expect("view");
        assert!(page.next.is_none(), "one page holds every session");
        for r in page.rows {
            let user = r.group["user"].as_str().unwrap_or_default().to_owned();
            let (start, end) = (r.window_start.expect("start"), r.window_end.expect("end"));
            assert!(start < end, "{v} {user}: [{start}, {end})");
            out.insert((v.to_owned(), user, start), (end, r.value, r.is_final));
        }
    }
    out
}

/// A consumer of the `clicks` final feed on one node, with its sink table.
#[derive(Default)]
struct Sink {
    table: BTreeMap<(String, u64), (u64, u64, serde_json::Value)>,
    cursor: Option<String>,
    /// Sessions delivered after a saved cursor (each at most once).
    committed: BTreeSet<(String, u64)>,
}

impl Sink {
    async fn pull(&mut self, node: &Node, crash: bool, ctx: &str) {
        let after: Option<FinalCursor> = self.cursor.as_deref().map(|c| c.parse().expect("cursor"));
        let page = node
            .final_windows("clicks", after.as_ref(), 3)
            .await
            .expect("final page");
        assert!(!page.reset, "{ctx}: nothing is removed by retention here");
        for w in &page.windows {
            let key = (
                w.group["user"].as_str().unwrap_or_default().to_owned(),
                w.window_start,
            );
            assert!(
                !self.committed.contains(&key),
                "{ctx}: {key:?} delivered twice after a saved cursor"
            );
            if !crash {
                self.committed.insert(key.clone());
            }
            match self.table.get(&key) {
                Some((v, end, old)) if *v >= w.version => {
                    assert_eq!(
                        (end, old),
                        (&w.window_end, &w.value),
                        "{ctx}: {key:?} replayed with another value"
                    );
                }
                _ => {
                    self.table
                        .insert(key, (w.version, w.window_end, w.value.clone()));
                }
            }
        }
        if !crash && let Some(next) = page.next {
            self.cursor = Some(next);
        }
    }
}

async fn converge(nodes: &[Node]) {
    let started = Instant::now();
    loop {
        let ctxs: Vec<_> = nodes.iter().map(|n| n.context().expect("ctx")).collect();
        if ctxs.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no convergence"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `(source, seq)` → the views an event was late for.
type LateFor = BTreeMap<(String, u64), BTreeSet<String>>;

/// The late-lane records of `node` after `after`: `(source, seq)` → views late for; and the
/// lane's last id.
fn late_since(node: &Node, after: Option<u64>) -> (LateFor, Option<u64>) {
    let mut out = BTreeMap::new();
    let mut cur = after;
    loop {
        let page = node.late_events("s", cur, 0).expect("late lane");
        assert_eq!(page.dropped, 0);
        for e in &page.events {
            cur = Some(e.id);
            let ev = &e.record["event"];
            let key = (
                ev["source"].as_str().unwrap_or_default().to_owned(),
                ev["seq"].as_u64().unwrap_or_default(),
            );
            let views: BTreeSet<String> = e.record["views"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            out.insert(key, views);
        }
        if page.next.is_none() {
            return (out, cur);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_equal_the_batch_recount_and_finals_never_change() {
    let seed = common::seed("views_session");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rounds = if common::soak() { 8 } else { 3 };
    for round in 0..rounds {
        let spec = Spec {
            gap: [4_000, 10_000, 25_000][rng.random_range(0..3)],
            lateness: [0, 3_000, 8_000][rng.random_range(0..3)],
            ooo: [0, 2_000][rng.random_range(0..2)],
        };
        let ctx = format!("seed {seed} round {round} {spec:?}");
        let root = tempfile::tempdir().expect("tempdir");
        let dirs: Vec<_> = (0..3).map(|i| root.path().join(format!("n{i}"))).collect();
        let mut nodes = Vec::new();
        for d in &dirs {
            nodes.push(open(d, spec).await);
        }
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
        let mut lanes: [Option<u64>; 3] = [None; 3];
        let mut marked: [BTreeSet<(String, u64)>; 3] = Default::default();
        let mut sent: [Vec<Ev>; 3] = Default::default();
        let mut counted: BTreeMap<&str, Vec<Ev>> = VIEWS.iter().map(|v| (*v, Vec::new())).collect();
        let mut seqs = [0u64; 3];
        let mut clock = 1_000_000u64;
        let mut finals: BTreeMap<Sess, (u64, serde_json::Value)> = BTreeMap::new();
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        let mut roaming = Sink::default();
        let (mut late_total, mut applied_total) = (0usize, 0usize);
        let mut merges = 0usize;
        // What the test knows of each node's watermark (at most it).
        let mut nwm = [0u64; 3];
        let mut prev: Vec<BTreeMap<Sess, (u64, serde_json::Value, bool)>> =
            vec![BTreeMap::new(); 3];
        let steps = if common::soak() { 200 } else { 90 };
        for step in 0..steps {
            let at = format!("{ctx} step {step}");
            match rng.random_range(0..14) {
                0 | 1 => {
                    let (i, j) = (rng.random_range(0..3), rng.random_range(0..3));
                    if i != j {
                        if rng.random_bool(0.5) {
                            nodes[i].disconnect(&nodes[j]).expect("disconnect");
                        } else {
                            nodes[i].connect(&nodes[j]).expect("connect");
                        }
                    }
                }
                2 => {
                    let i = rng.random_range(0..3);
                    nodes[i].shutdown().await.expect("shutdown");
                    nodes[i] = open(&dirs[i], spec).await;
                    for j in 0..3 {
                        if j != i {
                            nodes[i].connect(&nodes[j]).expect("connect");
                        }
                    }
                }
                _ => {
                    let i = rng.random_range(0..3);
                    // Mostly within the gap, sometimes past it (sessions end).
                    clock += if rng.random_bool(0.7) {
                        rng.random_range(0..spec.gap / 2)
                    } else {
                        rng.random_range(spec.gap..3 * spec.gap)
                    };
                    let mut batch: Vec<Ev> = Vec::new();
                    for _ in 0..rng.random_range(1..6) {
                        if !sent[i].is_empty() && rng.random_bool(0.1) {
                            batch.push(sent[i][rng.random_range(0..sent[i].len())].clone());
                            continue;
                        }
                        seqs[i] += 1;
                        // Mostly near the clock, some behind (out of order), some far behind
                        // (late), a few at the same millisecond as another.
                        let back = match rng.random_range(0..10) {
                            0 => rng.random_range(0..4 * spec.gap),
                            1 => 0,
                            // Around the gap and the lateness: events that bridge sessions.
                            2 | 3 => rng.random_range(spec.gap / 2..spec.gap + spec.lateness + 1),
                            // Just on time on this node: at the edge of its watermark and
                            // the lateness (where a session just final would be bridged).
                            4 | 5 => clock.saturating_sub(
                                (nwm[i] + rng.random_range(0..300))
                                    .saturating_sub(spec.lateness + 1),
                            ),
                            _ => rng.random_range(0..spec.gap / 2),
                        };
                        let e = Ev {
                            source: format!("n{i}"),
                            seq: seqs[i],
                            time: clock.saturating_sub(back),
                            user: USERS[rng.random_range(0..USERS.len())],
                            amount: rng.random_range(-2i64..5),
                            page: ["a", "b", "c"][rng.random_range(0..3)],
                        };
                        if rng.random_bool(0.08) {
                            // Its amount taken back at the same time: a sum cell netting to 0
                            // (no event of the sum view's sessions: it bridges nothing).
                            seqs[i] += 1;
                            let back = Ev {
                                seq: seqs[i],
                                amount: -e.amount,
                                ..e.clone()
                            };
                            sent[i].push(back.clone());
                            batch.push(back);
                        }
                        sent[i].push(e.clone());
                        batch.push(e);
                    }
                    for e in &batch {
                        nwm[i] = nwm[i].max(e.time.saturating_sub(spec.ooo));
                    }
                    let mut dups = 0;
                    let mut fresh = Vec::new();
                    for e in &batch {
                        if marked[i].insert((e.source.clone(), e.seq)) {
                            fresh.push(e.clone());
                        } else {
                            dups += 1;
                        }
                    }
                    let out = nodes[i]
                        .ingest("s", batch.iter().map(Ev::event).collect())
                        .await
                        .expect("ingest");
                    assert_eq!(out.duplicates, dups, "{at}: duplicates");
                    assert_eq!(out.applied, fresh.len(), "{at}: applied");
                    let (late, tail) = late_since(&nodes[i], lanes[i]);
                    lanes[i] = tail;
                    assert_eq!(out.late, late.len(), "{at}: late events vs the late lane");
                    late_total += late.len();
                    applied_total += fresh.len();
                    for e in fresh {
                        let late_for = late.get(&(e.source.clone(), e.seq));
                        for v in VIEWS {
                            if late_for.is_none_or(|l| !l.contains(v)) {
                                counted.get_mut(v).expect("view").push(e.clone());
                            }
                        }
                    }
                }
            }
            // Finals never change and agree across nodes; merges of sessions are counted.
            for (n, node) in nodes.iter().enumerate() {
                let now = sessions(node).await;
                for (s, (end, _, _)) in &now {
                    let merged = prev[n]
                        .range((s.0.clone(), s.1.clone(), s.2)..(s.0.clone(), s.1.clone(), *end))
                        .count();
                    if merged >= 2 {
                        merges += 1;
                    }
                }
                prev[n] = now.clone();
                for (s, (end, v, fin)) in now {
                    if fin {
                        let prev = finals.entry(s.clone()).or_insert_with(|| (end, v.clone()));
                        assert_eq!(prev, &(end, v), "{at} node {n}: final {s:?} changed");
                    }
                }
            }
            for (n, sink) in sinks.iter_mut().enumerate() {
                let crash = rng.random_bool(0.2);
                sink.pull(&nodes[n], crash, &format!("{at} sink {n}")).await;
            }
            // A consumer that reads from a random node each step, with its cursor.
            let n = rng.random_range(0..3);
            roaming
                .pull(&nodes[n], false, &format!("{at} roaming on {n}"))
                .await;
        }
        // Heal, move every watermark far past everything, let it all become final.
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
        let far = clock + 10 * (spec.gap + spec.lateness + spec.ooo) + 60_000;
        for (i, node) in nodes.iter().enumerate() {
            seqs[i] += 1;
            let e = Event::new(
                &format!("n{i}"),
                seqs[i],
                json!({"user": CLOSER, "amount": 1, "page": "z"}),
            )
            .at(far + i as u64);
            let out = node.ingest("s", vec![e]).await.expect("ingest");
            assert_eq!((out.applied, out.late), (1, 0), "{ctx}: far event");
        }
        converge(&nodes).await;
        let want = recount(spec.gap, &counted);
        let started = Instant::now();
        let last = loop {
            for n in &nodes {
                n.maintain_views().await.expect("maintain");
            }
            let mut all = Vec::new();
            for node in &nodes {
                all.push(sessions(node).await);
            }
            let done = all.iter().all(|s| {
                s.iter()
                    .filter(|(k, _)| k.1 != CLOSER)
                    .all(|(_, (_, _, fin))| *fin)
            });
            if done {
                break all;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{ctx}: sessions never all final: {:?}",
                all[0].iter().filter(|(_, v)| !v.2).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // Every node reports the same sessions.
        let plain = |s: &BTreeMap<Sess, (u64, serde_json::Value, bool)>| {
            s.iter()
                .filter(|(k, _)| k.1 != CLOSER)
                .map(|(k, (e, v, _))| (k.clone(), (*e, v.clone())))
                .collect::<BTreeMap<_, _>>()
        };
        for n in 1..3 {
            assert_eq!(plain(&last[0]), plain(&last[n]), "{ctx}: node 0 ≠ node {n}");
        }
        // They are the batch recount, and so is every session ever reported final.
        assert_eq!(plain(&last[0]), want, "{ctx}: sessions ≠ batch recount");
        for (s, v) in &finals {
            assert_eq!(want.get(s), Some(v), "{ctx}: final {s:?} ≠ batch recount");
        }
        // Each feed consumer ends with exactly the final `clicks` sessions.
        let clicks: BTreeMap<(String, u64), (u64, serde_json::Value)> = want
            .iter()
            .filter(|(k, _)| k.0 == "clicks")
            .map(|(k, v)| ((k.1.clone(), k.2), v.clone()))
            .collect();
        for (n, sink) in sinks.iter_mut().enumerate() {
            for _ in 0..200 {
                sink.pull(&nodes[n], false, &format!("{ctx} drain {n}"))
                    .await;
            }
            let table: BTreeMap<_, _> = sink
                .table
                .iter()
                .map(|(k, (_, e, v))| (k.clone(), (*e, v.clone())))
                .collect();
            assert_eq!(table, clicks, "{ctx}: sink {n} ≠ final sessions");
        }
        // A consumer switching nodes resumes with its cursor: same sessions, none skipped —
        // one that switched at every step, and a fresh one.
        let mut moved = roaming;
        for n in [0, 1, 2, 0, 1, 2] {
            for _ in 0..60 {
                moved.pull(&nodes[n], false, &format!("{ctx} moving")).await;
            }
        }
        let table: BTreeMap<_, _> = moved
            .table
            .iter()
            .map(|(k, (_, e, v))| (k.clone(), (*e, v.clone())))
            .collect();
        assert_eq!(table, clicks, "{ctx}: a consumer across nodes");
        eprintln!(
            "{ctx}: {applied_total} applied, {late_total} late, {merges} merges seen, {} sessions, \
             {} reported final while running",
            want.len(),
            finals.len()
        );
        for n in &nodes {
            n.shutdown().await.expect("shutdown");
        }
    }
}

/// One node, a tiny gap: a late event bridges two sessions; the final feed emits the merged
/// session once; retention removes whole sessions once final and past `end + retention`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_event_bridges_and_retention_removes_whole_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = NodeConfig::new(dir.path());
    cfg.views = serde_json::from_value(json!([
        {"name": "c", "stream": "s", "kind": "count", "group_by": ["user"],
         "window": {"session": "1s", "lateness": "5s", "retention": "30s"}},
    ]))
    .expect("defs");
    let node = Node::open(cfg).await.expect("open");
    let ev = |seq: u64, t: u64| Event::new("p", seq, json!({"user": "u"})).at(t);
    let base = 1_000_000;
    let out = node
        .ingest(
            "s",
            vec![ev(1, base), ev(2, base + 500), ev(3, base + 2_000)],
        )
        .await
        .expect("ingest");
    assert_eq!((out.applied, out.late), (3, 0));
    let rows = |p: tidemark::views::ViewPage| {
        p.rows
            .into_iter()
            .map(|r| (r.window_start, r.window_end, r.value, r.is_final))
            .collect::<Vec<_>>()
    };
    let q = ViewQuery::default();
    assert_eq!(
        rows(node.view("c", &q).await.expect("view")),
        vec![
            (Some(base), Some(base + 1_500), json!(2), false),
            (Some(base + 2_000), Some(base + 3_000), json!(1), false),
        ]
    );
    // Within lateness, 1,200 is closer than 1 s to 500 and to 2,000: one session.
    let out = node
        .ingest("s", vec![ev(4, base + 1_200)])
        .await
        .expect("ingest");
    assert_eq!((out.applied, out.late), (1, 0));
    assert_eq!(
        rows(node.view("c", &q).await.expect("view")),
        vec![(Some(base), Some(base + 3_000), json!(4), false)]
    );
    // A group given in full reads that group's cells only; paging by `next`.
    let mut one = ViewQuery::default();
    one.group.insert("user".into(), json!("u"));
    one.limit = 1;
    let page = node.view("c", &one).await.expect("view");
    assert_eq!(page.rows.len(), 1);
    // Far ahead: the merged session becomes final, once, in the feed.
    node.ingest("s", vec![ev(5, base + 20_000)])
        .await
        .expect("ingest");
    let started = Instant::now();
    let page = loop {
        node.maintain_views().await.expect("maintain");
        let p = node.final_windows("c", None, 10).await.expect("feed");
        if !p.windows.is_empty() {
            break p;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never final: {p:?} {:?}",
            node.view("c", &q).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(page.windows.len(), 1);
    let w = &page.windows[0];
    assert_eq!(
        (w.window_start, w.window_end, &w.value, w.version),
        (base, base + 3_000, &json!(4), 1)
    );
    let cursor: FinalCursor = w.cursor.parse().expect("cursor");
    let again = node
        .final_windows("c", Some(&cursor), 10)
        .await
        .expect("feed");
    assert!(again.windows.is_empty(), "delivered once: {again:?}");
    // An event for the final session is late now.
    let out = node
        .ingest("s", vec![ev(6, base + 2_500)])
        .await
        .expect("ingest");
    assert_eq!(out.late, 1);
    // Past end + retention: the session is removed whole; the open one stays.
    node.ingest("s", vec![ev(7, base + 40_000)])
        .await
        .expect("ingest");
    let started = Instant::now();
    loop {
        node.maintain_views().await.expect("maintain");
        let r = rows(node.view("c", &q).await.expect("view"));
        if r.iter().all(|x| x.0 != Some(base)) {
            assert!(r.iter().any(|x| x.0 == Some(base + 40_000)), "{r:?}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never removed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A consumer behind the removed session is told so.
    let behind = node
        .final_windows("c", Some(&cursor), 10)
        .await
        .expect("feed");
    assert!(behind.reset || behind.windows.iter().all(|w| w.window_start > base));
    node.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_config_errors_name_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            json!({"session": "30m", "tumbling": "1m"}),
            "\"v\", field `window.tumbling`",
        ),
        (
            json!({"session": "30m", "hopping": {"size": "2m", "every": "1m"}}),
            "\"v\", field `window.hopping`",
        ),
        (json!({"session": "30"}), "\"v\", field `window.session`"),
        (json!({"session": "soon"}), "\"v\", field `window.session`"),
        (json!({"session": "0m"}), "\"v\", field `window.session`"),
        (
            json!({"session": "30m", "lateness": "5x"}),
            "\"v\", field `window.lateness`",
        ),
    ];
    for (window, expected) in cases {
        let mut cfg = NodeConfig::new(dir.path());
        cfg.views = vec![
            serde_json::from_value(
                json!({"name": "v", "stream": "s", "kind": "count", "window": window}),
            )
            .expect("shape"),
        ];
        let err = Node::open(cfg).await.expect_err("invalid view");
        assert!(
            matches!(err, Error::Config(_)) && err.to_string().contains(expected),
            "{err} should name {expected}"
        );
    }
    // The TOML shape of `tidemark serve --config`.
    #[derive(serde::Deserialize)]
    struct File {
        views: Vec<ViewDef>,
    }
    let f: File = toml::from_str(
        r#"
        [[views]]
        name = "visits"
        stream = "clicks"
        kind = "count"
        group_by = ["user"]
        window = { session = "30m", lateness = "5m", retention = "7d" }
        "#,
    )
    .expect("toml");
    assert_eq!(
        f.views[0]
            .window
            .as_ref()
            .and_then(|w| w.session.as_deref()),
        Some("30m")
    );
    let mut cfg = NodeConfig::new(dir.path());
    cfg.views = f.views;
    Node::open(cfg)
        .await
        .expect("opens")
        .shutdown()
        .await
        .expect("shutdown");
}

use crate::http_support;

/// Over HTTP: session rows page by `next`, the final feed (NDJSON) resumes by cursor, and a
/// cursor of another kind of window is refused.
#[test]
fn session_views_over_http_page_and_resume() {
    let s = http_support::Served::start_with(|n, _| {
        n.views = serde_json::from_value(json!([
            {"name": "visits", "stream": "v", "kind": "distinct", "group_by": ["user"],
             "field": "page", "window": {"session": "10s"}},
            {"name": "clicks", "stream": "v", "kind": "count", "group_by": ["user"],
             "window": {"tumbling": "1m"}},
        ]))
        .expect("defs");
    });
    // Users a and b, each two sessions; then far ahead so all four are final.
    let mut lines = String::new();
    for (seq, (user, t, page)) in [
        ("a", 0, "/x"),
        ("a", 5_000, "/y"),
        ("b", 1_000, "/x"),
        ("a", 30_000, "/z"),
        ("b", 40_000, "/y"),
        ("c", 600_000, "/end"),
    ]
    .into_iter()
    .enumerate()
    {
        lines.push_str(&format!(
            "{{\"source\":\"s\",\"seq\":{seq},\"time\":{t},\"user\":\"{user}\",\"page\":\"{page}\"}}\n"
        ));
    }
    let r = ureq::post(&s.url("/v1/streams/v/events"))
        .header("Content-Type", "application/x-ndjson")
        .send(lines.as_bytes())
        .expect("ingest");
    assert_eq!(r.status(), 200);
    // Paging one session at a time.
    let mut rows = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = s.url("/v1/views/visits?limit=1");
        if let Some(a) = &after {
            url.push_str(&format!(
                "&after={}",
                a.bytes().map(|b| format!("%{b:02X}")).collect::<String>()
            ));
        }
        let a = http_support::get(&url);
        assert_eq!(a.status, 200, "{}", a.text);
        rows.extend(a.json["rows"].as_array().cloned().unwrap_or_default());
        match a.json["next"].as_str() {
            Some(n) => after = Some(n.to_owned()),
            None => break,
        }
    }
    let got: Vec<(String, u64, u64, serde_json::Value, bool)> = rows
        .iter()
        .map(|r| {
            (
                r["group"]["user"].as_str().unwrap_or_default().to_owned(),
                r["window_start"].as_u64().unwrap_or_default(),
                r["window_end"].as_u64().unwrap_or_default(),
                r["value"].clone(),
                r["final"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("a".into(), 0, 15_000, json!(["/x", "/y"]), true),
            ("a".into(), 30_000, 40_000, json!(["/z"]), true),
            ("b".into(), 1_000, 11_000, json!(["/x"]), true),
            ("b".into(), 40_000, 50_000, json!(["/y"]), true),
            ("c".into(), 600_000, 610_000, json!(["/end"]), false),
        ]
    );
    let feed = |after: Option<&str>| -> Vec<serde_json::Value> {
        let mut url = s.url("/v1/views/visits/final?follow=false");
        if let Some(a) = after {
            url.push_str(&format!("&after={a}"));
        }
        let resp = ureq::get(&url)
            .header("Accept", "application/x-ndjson")
            .call()
            .expect("final feed");
        let text = resp.into_body().read_to_string().expect("body");
        text.lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect()
    };
    let all = feed(None);
    let starts: Vec<(String, u64)> = all
        .iter()
        .map(|w| {
            assert_eq!((&w["event"], &w["version"]), (&json!("final"), &json!(1)));
            (
                w["group"]["user"].as_str().unwrap_or_default().to_owned(),
                w["window_start"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        starts,
        vec![
            ("a".into(), 0),
            ("a".into(), 30_000),
            ("b".into(), 1_000),
            ("b".into(), 40_000)
        ]
    );
    let cursor = all[1]["cursor"].as_str().expect("cursor");
    assert_eq!(
        feed(Some(cursor)),
        all[2..].to_vec(),
        "resumes after the second"
    );
    // A tumbling view's cursor on the session view, and the other way round.
    let tumbling = http_support::get(&s.url("/v1/views/clicks/final?follow=false"));
    assert_eq!(tumbling.status, 200);
    let clicks = feed_cursor(&s, "clicks");
    for (view, c) in [("visits", clicks.as_str()), ("clicks", cursor)] {
        let a = http_support::get(&s.url(&format!("/v1/views/{view}/final?after={c}")));
        assert_eq!((a.status, a.code()), (400, "invalid_cursor"), "{view}");
    }
}

/// The cursor of the first final window of `view`'s feed.
fn feed_cursor(s: &http_support::Served, view: &str) -> String {
    let resp = ureq::get(&s.url(&format!("/v1/views/{view}/final?follow=false")))
        .header("Accept", "application/x-ndjson")
        .call()
        .expect("final feed");
    let text = resp.into_body().read_to_string().expect("body");
    let first: serde_json::Value =
        serde_json::from_str(text.lines().next().expect("a window")).expect("json");
    first["cursor"].as_str().expect("cursor").to_owned()
}

/// The bounds: a session holds at most `SESSION_CELLS_MAX` event times (the next starts a new
/// one), and a page that scanned `SESSION_SCAN_MAX` cells ends after the session being read,
/// with `next` — paging (and the final feed) still reaches every session exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_groups_page_by_the_scan_budget_and_cap_sessions() {
    use tidemark::views::session::{SESSION_CELLS_MAX, SESSION_SCAN_MAX};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = NodeConfig::new(dir.path());
    cfg.views = serde_json::from_value(json!([
        {"name": "c", "stream": "s", "kind": "count", "group_by": ["user"],
         "window": {"session": "1s", "lateness": "60s"}},
    ]))
    .expect("defs");
    let node = Node::open(cfg).await.expect("open");
    let base = 1_000_000u64;
    // 12 users × 6,000 consecutive milliseconds (over the scan budget in all), and one user
    // with more consecutive milliseconds than a session holds.
    let per = SESSION_SCAN_MAX / 11;
    let capped = SESSION_CELLS_MAX + 500;
    let mut groups: Vec<(String, usize)> = (0..12).map(|u| (format!("u{u:02}"), per)).collect();
    groups.push(("cap".into(), capped));
    let mut seq = 0u64;
    for (user, n) in &groups {
        let mut at = 0;
        while at < *n {
            let batch: Vec<Event> = (at..(at + 1000).min(*n))
                .map(|j| {
                    seq += 1;
                    Event::new("p", seq, json!({"user": user})).at(base + j as u64)
                })
                .collect();
            at += batch.len();
            let out = node.ingest("s", batch).await.expect("ingest");
            assert_eq!(out.late, 0);
        }
    }
    // Far ahead: everything before is final.
    seq += 1;
    let far = Event::new("p", seq, json!({"user": "zz"})).at(base + 100_000);
    node.ingest("s", vec![far]).await.expect("ingest");
    node.maintain_views().await.expect("maintain");
    let mut pages = 0;
    let mut rows = Vec::new();
    let mut q = ViewQuery::default();
    loop {
        let page = node.view("c", &q).await.expect("view");
        pages += 1;
        rows.extend(page.rows);
        match page.next {
            Some(n) => q.after = Some(n),
            None => break,
        }
    }
    assert!(pages >= 2, "the scan budget splits the pages");
    let got: Vec<(String, u64, u64, serde_json::Value)> = rows
        .iter()
        .map(|r| {
            (
                r.group["user"].as_str().unwrap_or_default().to_owned(),
                r.window_start.unwrap_or_default(),
                r.window_end.unwrap_or_default(),
                r.value.clone(),
            )
        })
        .collect();
    let mut want: Vec<(String, u64, u64, serde_json::Value)> = vec![
        (
            "cap".into(),
            base,
            base + SESSION_CELLS_MAX as u64 - 1 + 1_000,
            json!(SESSION_CELLS_MAX),
        ),
        (
            "cap".into(),
            base + SESSION_CELLS_MAX as u64,
            base + capped as u64 - 1 + 1_000,
            json!(capped - SESSION_CELLS_MAX),
        ),
    ];
    for u in 0..12 {
        want.push((
            format!("u{u:02}"),
            base,
            base + per as u64 - 1 + 1_000,
            json!(per),
        ));
    }
    want.push(("zz".into(), base + 100_000, base + 101_000, json!(1)));
    assert_eq!(got, want);
    // The final feed: every session but the open one, once, across its budget-cut pages.
    let mut after: Option<FinalCursor> = None;
    let mut delivered = Vec::new();
    for _ in 0..50 {
        let page = node
            .final_windows("c", after.as_ref(), 1000)
            .await
            .expect("feed");
        delivered.extend(page.windows.iter().map(|w| {
            (
                w.group["user"].as_str().unwrap_or_default().to_owned(),
                w.window_start,
            )
        }));
        after = page.next.as_deref().map(|n| n.parse().expect("cursor"));
    }
    let mut want_final: Vec<(String, u64)> = want[..want.len() - 1]
        .iter()
        .map(|w| (w.0.clone(), w.1))
        .collect();
    want_final.sort();
    delivered.sort();
    assert_eq!(delivered, want_final);
    node.shutdown().await.expect("shutdown");
}
