//! Model test of view finality through membership changes (`src/views/seal.rs`): a seeded
//! random run of a small cluster of embedded nodes where every membership change is a nemesis
//! action, with a ledger of every window ever reported final.
//!
//! Views: `clicks` (count) and `users` (distinct `user`), tumbling 1 m windows grouped by
//! `page` (`a`, `b`); `clicks` has no lateness, `users` 20 s.
//!
//! Start: 2–3 seed nodes (default config) in a mesh. Then N random steps (150, ×10 under
//! `SOAK=1`), each one of:
//! - **ingest** a batch of 1–5 fresh events into a random node (event times mostly advancing,
//!   some slightly behind, some far in the past; one source per node incarnation, so
//!   `(source, seq)` is unique);
//! - **retry** an earlier batch into ANOTHER node (one event per call, so every answer —
//!   applied or duplicate — is attributed exactly);
//! - **partition / heal** a pair of nodes (disconnect / connect);
//! - **restart** a node (shutdown, reopen the same directory, reconnect its links);
//! - **join** a NEW node with `joining = true` (at most 6 nodes): it may ingest before it
//!   connects — every such event must be late with reason `not_synced` — then connects to 1–2
//!   nodes;
//! - **restore** a NEW node from a snapshot of a live node (`Node::restore` into a new
//!   directory, open; it may ingest a batch first), connect to 1–2 nodes (a copy of a joining
//!   node joins too, so before it syncs its events are late, `not_synced`);
//! - **idle** (sleep 20–80 ms; the background maintenance keeps sealing);
//! - **seal round** (`maintain_views()` on every node).
//!
//! Which events count: every ingest answer is checked (fresh events are never duplicates),
//! and the node's late lane is read right after each ingest, so for every event a node
//! answered applied the test knows exactly the views it was late for there.
//!
//! After every step every view is read on every live node, and the ledger asserts:
//! (a) a value reported final never changes, on any node; (b) a window a node reported final
//! reads final again on that node on every later read (across restarts too: nodes are
//! remembered by replica id); (c) every node that reports a window final reports the same
//! value; and every value read, final or not, is one the recount below reaches with a subset
//! of the applications so far. At the end everything is healed, each node ingests one event
//! far ahead (so every earlier window can close), the nodes converge and seal rounds run until
//! no new window turns final; then every window ever reported final must equal the batch
//! recount — count, sorted distinct set — over the events answered applied and not reported
//! late for that view by the node that took them (an event retried into a second node
//! before the dedup marks met is applied there too, and counts twice:
//! docs/design/principles.md, "Idempotent ingest").
//! The seeds that found a defect (each fixed) are replayed on every run (`FOUND`): a node
//! restarted before its first event forgot the peers it had met; a node restored from a
//! snapshot of a joining node that had not synced, or of a founder that had met its peers but
//! announced nothing, opened as a founder and sealed alone (now such a copy joins:
//! `tests/views/views_membership.rs` has the deterministic cases); a restored copy restarted
//! before it synced forgot that it waits. A seed of a defect still open (a copy that syncs on an
//! announcement derived from its own stale state) is replayed by hand (`FOUND_OPEN_ISOLATED`,
//! `--ignored`).
//! Seeded: replay with `SEED=`. `ISOLATED_RESTORE=1` leaves every restored node unconnected
//! until a heal step links it (a restored node serving before it rejoins); `VERBOSE=1` lists
//! every cell final or open at the end.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tidemark::views::{Event, LateEvent, ViewDef, ViewQuery};
use tidemark::{Node, NodeConfig};

use crate::common;

use common::soak;

const MIN: u64 = 60_000;
const STREAM: &str = "s";
const VIEWS: [&str; 2] = ["clicks", "users"];
const PAGES: [&str; 2] = ["a", "b"];
const MAX_NODES: usize = 6;

fn defs() -> Vec<ViewDef> {
    serde_json::from_value(json!([
        {"name": "clicks", "stream": STREAM, "kind": "count", "group_by": ["page"],
         "window": {"tumbling": "1m"}},
        {"name": "users", "stream": STREAM, "kind": "distinct", "group_by": ["page"],
         "field": "user", "window": {"tumbling": "1m", "lateness": "20000ms"}},
    ]))
    .expect("defs")
}

async fn open(dir: &Path, joining: bool) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs();
    cfg.joining = joining;
    Node::open(cfg).await.expect("open")
}

/// Reopens `dir` after a shutdown. `shutdown()` returning does not always mean the database
/// is released yet (seen under SOAK: `AlreadyOpen` right after it); that is retried for up to
/// 5 s, counted in `held` and printed — it is not what this test is about.
async fn reopen(dir: &Path, joining: bool, held: &mut usize) -> Node {
    let started = Instant::now();
    let mut counted = false;
    loop {
        let mut cfg = NodeConfig::new(dir);
        cfg.views = defs();
        cfg.joining = joining;
        match Node::open(cfg).await {
            Ok(n) => return n,
            Err(e) if format!("{e:?}").contains("AlreadyOpen") => {
                if !counted {
                    counted = true;
                    *held += 1;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "{} still held 5 s after shutdown: {e}",
                    dir.display()
                );
                eprintln!("reopen {}: still held after shutdown ({e})", dir.display());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("open {}: {e}", dir.display()),
        }
    }
}

#[derive(Clone, Debug)]
struct Ev {
    source: String,
    seq: u64,
    time: u64,
    page: &'static str,
    user: String,
}

impl Ev {
    fn event(&self) -> Event {
        Event::new(
            &self.source,
            self.seq,
            json!({"page": self.page, "user": self.user}),
        )
        .at(self.time)
    }

    fn start(&self) -> u64 {
        self.time - self.time % MIN
    }
}

/// `(view, window start, page)`.
type Cell = (String, u64, String);

/// One event a node answered applied (not a duplicate), with the views it was late for there.
#[derive(Clone, Debug)]
struct Applied {
    /// The node incarnation that took it (`n3#1`).
    node: String,
    replica: String,
    step: usize,
    ev: Ev,
    late: BTreeSet<String>,
    reason: Option<String>,
}

/// A live node and what the model knows of it.
struct Slot {
    node: Node,
    name: String,
    dir: PathBuf,
    joining: bool,
    inc: u32,
    seq: u64,
    replica: String,
    /// The last late-lane id read on this node.
    lane_after: Option<u64>,
}

impl Slot {
    fn who(&self) -> String {
        format!("{}#{}", self.name, self.inc)
    }

    fn source(&self) -> String {
        format!("{}i{}", self.name, self.inc)
    }
}

/// Every late-lane record of `node` after `after`, and the lane's last id.
fn lane_since(node: &Node, after: Option<u64>) -> (Vec<LateEvent>, Option<u64>) {
    let mut out = Vec::new();
    let mut cur = after;
    loop {
        let page = node.late_events(STREAM, cur, 0).expect("late lane");
        assert_eq!(page.dropped, 0, "the late lane dropped records: {page:?}");
        if let Some(last) = page.events.last() {
            cur = Some(last.id);
        }
        out.extend(page.events);
        if page.next.is_none() {
            return (out, cur);
        }
    }
}

/// Every row of both views on `node`: cell → (value, final).
async fn rows(node: &Node) -> BTreeMap<Cell, (serde_json::Value, bool)> {
    let mut out = BTreeMap::new();
    for v in VIEWS {
        let page = node.view(v, &ViewQuery::default()).await.expect("view");
        assert!(page.next.is_none(), "one page holds every row");
        for r in page.rows {
            let p = r
                .group
                .get("page")
                .and_then(|p| p.as_str())
                .unwrap_or_default()
                .to_owned();
            let cell = (v.to_owned(), r.window_start.expect("windowed"), p);
            out.insert(cell, (r.value, r.is_final));
        }
    }
    out
}

/// The batch recount over the applications not late for the view.
fn recount(apps: &[Applied]) -> BTreeMap<Cell, serde_json::Value> {
    let mut count: BTreeMap<Cell, u64> = BTreeMap::new();
    let mut users: BTreeMap<Cell, BTreeSet<String>> = BTreeMap::new();
    for a in apps {
        let cell = |v: &str| (v.to_owned(), a.ev.start(), a.ev.page.to_owned());
        if !a.late.contains("clicks") {
            *count.entry(cell("clicks")).or_default() += 1;
        }
        if !a.late.contains("users") {
            users
                .entry(cell("users"))
                .or_default()
                .insert(a.ev.user.clone());
        }
    }
    let mut out = BTreeMap::new();
    for (c, n) in count {
        out.insert(c, json!(n));
    }
    for (c, s) in users {
        out.insert(c, json!(s.into_iter().collect::<Vec<_>>()));
    }
    out
}

/// Is `seen` a value the recount reaches with a subset of the applications of its cell
/// (`full`)? A count at most the full count, a distinct set within the full set.
fn reachable(seen: &serde_json::Value, full: Option<&serde_json::Value>) -> bool {
    if seen == &json!(0) || seen == &json!([]) {
        return true;
    }
    let Some(full) = full else { return false };
    match (seen, full) {
        (serde_json::Value::Number(s), serde_json::Value::Number(f)) => {
            s.as_u64().zip(f.as_u64()).is_some_and(|(s, f)| s <= f)
        }
        (serde_json::Value::Array(s), serde_json::Value::Array(f)) => {
            s.iter().all(|x| f.contains(x))
        }
        _ => false,
    }
}

/// The first report of a final value.
#[derive(Clone, Debug)]
struct FirstFinal {
    value: serde_json::Value,
    node: String,
    step: usize,
}

struct World {
    seed: u64,
    root: PathBuf,
    slots: Vec<Slot>,
    /// Links between slots (`i < j`).
    links: BTreeSet<(usize, usize)>,
    clock: u64,
    apps: Vec<Applied>,
    /// Fresh batches so far, with the slot that took them.
    batches: Vec<(usize, Vec<Ev>)>,
    finals: BTreeMap<Cell, FirstFinal>,
    /// Replica → the cells it reported final.
    reported: BTreeMap<String, BTreeSet<Cell>>,
    next_dir: usize,
}

fn link(i: usize, j: usize) -> (usize, usize) {
    (i.min(j), i.max(j))
}

impl World {
    async fn new_slot(&mut self, dir: PathBuf, joining: bool) -> usize {
        let node = open(&dir, joining).await;
        let (_, tail) = lane_since(&node, None);
        let name = format!("n{}", self.next_dir - 1);
        self.slots.push(Slot {
            replica: node.replica_id().to_string(),
            node,
            name,
            dir,
            joining,
            inc: 0,
            seq: 0,
            lane_after: tail,
        });
        self.slots.len() - 1
    }

    fn fresh_dir(&mut self) -> PathBuf {
        let d = self.root.join(format!("n{}", self.next_dir));
        self.next_dir += 1;
        d
    }

    fn connect(&mut self, i: usize, j: usize) {
        self.slots[i]
            .node
            .connect(&self.slots[j].node)
            .expect("connect");
        self.links.insert(link(i, j));
    }

    fn disconnect(&mut self, i: usize, j: usize) {
        self.slots[i]
            .node
            .disconnect(&self.slots[j].node)
            .expect("disconnect");
        self.links.remove(&link(i, j));
    }

    /// A fresh batch of 1–5 events of slot `i`'s source.
    fn fresh_batch(&mut self, rng: &mut ChaCha8Rng, i: usize) -> Vec<Ev> {
        self.clock += rng.random_range(0..12_000);
        let n = rng.random_range(1..=5);
        (0..n)
            .map(|_| {
                let back = match rng.random_range(0..10) {
                    0..=6 => rng.random_range(0..3_000),
                    7 | 8 => rng.random_range(15_000..80_000),
                    _ => rng.random_range(3 * MIN..10 * MIN),
                };
                let slot = &mut self.slots[i];
                slot.seq += 1;
                Ev {
                    source: slot.source(),
                    seq: slot.seq,
                    time: self.clock.saturating_sub(back),
                    page: PAGES[rng.random_range(0..PAGES.len())],
                    user: format!("u{}", rng.random_range(0..5)),
                }
            })
            .collect()
    }

    /// The late-lane records slot `i` wrote since the last read, by `(source, seq)`.
    fn new_late(
        &mut self,
        i: usize,
        ctx: &str,
    ) -> BTreeMap<(String, u64), (BTreeSet<String>, String)> {
        let slot = &mut self.slots[i];
        let (recs, tail) = lane_since(&slot.node, slot.lane_after);
        slot.lane_after = tail;
        let mut out = BTreeMap::new();
        for r in recs {
            let rec = &r.record;
            // A contribution record (a seal left another node's contribution out) names the
            // contributing node and no event: not a late event of this slot.
            if rec.get("contribution").is_some() {
                assert_eq!(rec["reason"].as_str(), Some("outside_seal"), "{ctx}: {rec}");
                continue;
            }
            assert_eq!(
                rec["node"].as_str(),
                Some(slot.replica.as_str()),
                "{ctx}: a new late record of another node: {rec}"
            );
            let source = rec["event"]["source"].as_str().expect("source").to_owned();
            let seq = rec["event"]["seq"].as_u64().expect("seq");
            let views: BTreeSet<String> = rec["views"]
                .as_array()
                .expect("views")
                .iter()
                .map(|v| v.as_str().expect("view name").to_owned())
                .collect();
            let reason = rec["reason"].as_str().expect("reason").to_owned();
            let prev = out.insert((source, seq), (views, reason));
            assert!(
                prev.is_none(),
                "{ctx}: two late records of one event: {rec}"
            );
        }
        out
    }

    /// Ingests a fresh batch into slot `i` (one call): every event is applied (unique ids);
    /// the late ones are exactly the new records of its late lane.
    async fn ingest_fresh(&mut self, i: usize, batch: Vec<Ev>, step: usize, ctx: &str) -> usize {
        let out = self.slots[i]
            .node
            .ingest(STREAM, batch.iter().map(Ev::event).collect())
            .await
            .expect("ingest");
        assert_eq!(
            (out.applied, out.duplicates),
            (batch.len(), 0),
            "{ctx}: fresh events are applied: {out:?}"
        );
        let mut late = self.new_late(i, ctx);
        assert_eq!(
            late.len(),
            out.late,
            "{ctx}: late lane records ≠ late answer {out:?}: {late:?}"
        );
        for e in &batch {
            let (views, reason) = match late.remove(&(e.source.clone(), e.seq)) {
                Some((v, r)) => (v, Some(r)),
                None => (BTreeSet::new(), None),
            };
            self.apps.push(Applied {
                node: self.slots[i].who(),
                replica: self.slots[i].replica.clone(),
                step,
                ev: e.clone(),
                late: views,
                reason,
            });
        }
        assert!(
            late.is_empty(),
            "{ctx}: late records of other events: {late:?}"
        );
        out.late
    }

    /// Retries `batch` into slot `i`, one event per call; returns (applied, late).
    async fn ingest_retry(
        &mut self,
        i: usize,
        batch: &[Ev],
        step: usize,
        ctx: &str,
    ) -> (usize, usize) {
        let (mut applied, mut late_n) = (0, 0);
        for e in batch {
            let out = self.slots[i]
                .node
                .ingest(STREAM, vec![e.event()])
                .await
                .expect("retry");
            assert_eq!(out.applied + out.duplicates, 1, "{ctx}: {out:?}");
            let mut late = self.new_late(i, ctx);
            assert_eq!(late.len(), out.late, "{ctx}: {out:?} {late:?}");
            if out.applied == 1 {
                applied += 1;
                late_n += out.late;
                let (views, reason) = match late.remove(&(e.source.clone(), e.seq)) {
                    Some((v, r)) => (v, Some(r)),
                    None => (BTreeSet::new(), None),
                };
                assert!(late.is_empty(), "{ctx}: {late:?}");
                self.apps.push(Applied {
                    node: self.slots[i].who(),
                    replica: self.slots[i].replica.clone(),
                    step,
                    ev: e.clone(),
                    late: views,
                    reason,
                });
            } else {
                assert_eq!(out.late, 0, "{ctx}: a duplicate counted late: {out:?}");
            }
        }
        (applied, late_n)
    }

    /// Reads every view on every live node and checks the ledger (a), (b), (c), and that
    /// every value read (final or not) is one the recount reaches with a subset of the
    /// applications so far.
    async fn check(&mut self, step: usize, ctx: &str) {
        let full = recount(&self.apps);
        for s in &self.slots {
            let got = rows(&s.node).await;
            let mine = self.reported.entry(s.replica.clone()).or_default();
            for (cell, (v, fin)) in &got {
                assert!(
                    reachable(v, full.get(cell)),
                    "seed {} {ctx}: {} reads {cell:?} = {v} (final {fin}), beyond the recount \
                     of every application so far {:?}",
                    self.seed,
                    s.who(),
                    full.get(cell)
                );
                if !*fin {
                    continue;
                }
                let first = self
                    .finals
                    .entry(cell.clone())
                    .or_insert_with(|| FirstFinal {
                        value: v.clone(),
                        node: s.who(),
                        step,
                    });
                assert_eq!(
                    &first.value,
                    v,
                    "seed {} {ctx}: {} reports {cell:?} final = {v}, but {} reported it final = {} \
                     at step {}",
                    self.seed,
                    s.who(),
                    first.node,
                    first.value,
                    first.step
                );
                mine.insert(cell.clone());
            }
            for cell in mine.iter() {
                assert!(
                    got.get(cell).is_some_and(|(_, f)| *f),
                    "seed {} {ctx}: {} reported {cell:?} final before, now reads {:?}",
                    self.seed,
                    s.who(),
                    got.get(cell)
                );
            }
        }
    }

    async fn seal_round(&self) {
        for s in &self.slots {
            s.node.maintain_views().await.expect("maintain");
        }
    }

    async fn converge(&self) {
        let started = Instant::now();
        loop {
            let ctxs: Vec<_> = self
                .slots
                .iter()
                .map(|s| s.node.context().expect("ctx"))
                .collect();
            if ctxs.windows(2).all(|w| w[0] == w[1]) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "seed {}: no convergence within 60 s",
                self.seed
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// 1–2 random live slots other than `i`.
    fn peers(&self, rng: &mut ChaCha8Rng, i: usize) -> Vec<usize> {
        let others: Vec<usize> = (0..self.slots.len()).filter(|&j| j != i).collect();
        let mut out = Vec::new();
        for _ in 0..rng.random_range(1..=2) {
            let j = others[rng.random_range(0..others.len())];
            if !out.contains(&j) {
                out.push(j);
            }
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finals_survive_membership_changes_and_equal_the_recount() {
    let isolated = std::env::var("ISOLATED_RESTORE").is_ok_and(|v| v == "1");
    run_model(common::seed("views_finality_model"), isolated).await;
}

/// Seeds of the model that once failed, each replayed on every run with the defect it found
/// (fixed): `(seed, isolated restores, defect)`. The model runs in real time (maintenance
/// ticks, idle steps), so a seed's run is not exactly reproducible; each failed reproducibly
/// (or in some runs, as noted) when found.
const FOUND: [(u64, bool, &str); 4] = [
    (
        1_796_618_566_326_469_084,
        false,
        "a node restarted before its first event forgot the peer it had met (peers met were \
         kept only in its announcement, written only once it had a watermark): alone, it sealed \
         windows its peer still took on-time events for",
    ),
    (
        1_796_619_104_462_437_224,
        false,
        "a node restored (step 13) from a snapshot of a joining node taken before it synced \
         (the snapshot holds no announcement of the stream) opened as a founder: not joining, \
         and `Views::restore` makes a restored store wait for a fresh announcement only when \
         its snapshot holds one. It applied events on time for windows the cluster sealed \
         without it (final [u2] by n1 at step 8, u4 applied on n3 at step 13), or vouched over \
         itself alone and sealed a window with only its own events (final [u4] by n3 at step \
         13). Failed 3 runs in 3 before the fix. Now a snapshot of a cluster member records it \
         and the copy opens joining (`RedbStore::restored_joining`). First reported as \
         \"restart wrote late records\": those were audit records of n3's contributions \
         (`src/views/audit.rs`), which the restart check now skips as the ingest check does",
    ),
    (
        1_796_627_321_256_648_036,
        true,
        "a restored copy restarted before it synced forgot that it waits for a fresh \
         announcement: `Views::restore` wrote its announcement (the snapshot's marks) at its \
         first open, so at the next open that read as a watermark of its own. n4 (restored \
         from n2 at step 41, isolated) restarted at step 68 with no link and took events for \
         window 840000 on time at step 76, which the cluster sealed without it (2 ≠ recount \
         3). Failed in some runs (1 in 3); seed 1796627340188533698 found the same. Now the \
         restore keeps the snapshot's context and the wait is measured against it",
    ),
    (
        1_796_628_711_582_861_938,
        true,
        "a node restored (step 0, isolated) from a snapshot of a founder that had met its \
         peers but announced nothing yet opened as a lone founder: it applied events on time \
         and sealed window 600000 over itself alone (final 4 by n3, recount 13). Now a \
         snapshot of any node that met a peer makes the copy join",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finality_model_replays_the_seeds_found() {
    for (seed, isolated, found) in FOUND {
        println!("seed {seed} (isolated restores: {isolated}): {found}");
        run_model(seed, isolated).await;
    }
}

/// Seeds that found a defect still open, with isolated restores (`ISOLATED_RESTORE=1`: every
/// restored node left unconnected until a heal step links it), replayed by hand (`--ignored`).
const FOUND_OPEN_ISOLATED: [(u64, &str); 1] = [(
    1_796_627_331_978_309_120,
    "a restored copy takes as fresh an announcement that holds nothing new of its cluster: n3 \
     (restored from n1 at step 4, isolated) met only n4, a node joining through n3 alone (step \
     8); n4 synced from n3's own stale marks and announced, and that announcement is one n3's \
     snapshot did not hold, so n3 counted as synced and both took events on time (steps \
     14-21) for window 600000, which the cluster sealed without them (6 ≠ recount 9). Failed 2 \
     runs in 2 on the code before the joining-copy fix, and after it",
)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "open: a restored copy counts as synced on an announcement derived from its own stale state (FOUND_OPEN_ISOLATED)"]
async fn finality_model_replays_the_seeds_found_open_with_isolated_restores() {
    for (seed, found) in FOUND_OPEN_ISOLATED {
        println!("seed {seed} (ISOLATED_RESTORE=1): {found}");
        run_model(seed, true).await;
    }
}

/// One seeded run of the model (see the module docs).
/// `isolated`: every restored node stays unconnected until a heal step links it
/// (`ISOLATED_RESTORE=1`).
async fn run_model(seed: u64, isolated: bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let started = Instant::now();
    let root = tempfile::tempdir().expect("tempdir");
    let mut w = World {
        seed,
        root: root.path().to_path_buf(),
        slots: Vec::new(),
        links: BTreeSet::new(),
        clock: 10 * MIN,
        apps: Vec::new(),
        batches: Vec::new(),
        finals: BTreeMap::new(),
        reported: BTreeMap::new(),
        next_dir: 0,
    };
    let seeds = rng.random_range(2..=3);
    for _ in 0..seeds {
        let d = w.fresh_dir();
        w.new_slot(d, false).await;
    }
    for i in 0..seeds {
        for j in i + 1..seeds {
            w.connect(i, j);
        }
    }
    eprintln!("seed {seed}: {seeds} seed nodes in a mesh");
    let steps = if soak() { 1_500 } else { 150 };
    let mut snaps = 0;
    // Restarts whose reopen found the directory still held after `shutdown()` returned.
    let mut held = 0;
    for step in 0..steps {
        let n = w.slots.len();
        let mut pick = rng.random_range(0..20);
        if matches!(pick, 13 | 14) && n >= MAX_NODES {
            pick = 0;
        }
        if matches!(pick, 8 | 9) && w.batches.is_empty() {
            pick = 0;
        }
        let action: String = match pick {
            0..=7 => {
                let i = rng.random_range(0..n);
                let batch = w.fresh_batch(&mut rng, i);
                let ctx = format!("step {step}: ingest into {}", w.slots[i].who());
                let late = w.ingest_fresh(i, batch.clone(), step, &ctx).await;
                let times: Vec<u64> = batch.iter().map(|e| e.time).collect();
                w.batches.push((i, batch));
                format!(
                    "ingest {} events at {times:?} into {} ({late} late)",
                    times.len(),
                    w.slots[i].who()
                )
            }
            8 | 9 => {
                let (from, batch) = w.batches[rng.random_range(0..w.batches.len())].clone();
                let others: Vec<usize> = (0..n).filter(|&j| j != from).collect();
                if others.is_empty() {
                    "retry skipped (no other node)".to_owned()
                } else {
                    let i = others[rng.random_range(0..others.len())];
                    let ctx = format!("step {step}: retry into {}", w.slots[i].who());
                    let (applied, late) = w.ingest_retry(i, &batch, step, &ctx).await;
                    let ids: Vec<String> = batch
                        .iter()
                        .map(|e| format!("{}/{}", e.source, e.seq))
                        .collect();
                    format!(
                        "retry {ids:?} into {}: {applied} applied ({late} late)",
                        w.slots[i].who()
                    )
                }
            }
            10 | 11 => {
                let i = rng.random_range(0..n);
                let j = rng.random_range(0..n);
                if i == j {
                    "partition skipped".to_owned()
                } else if w.links.contains(&link(i, j)) {
                    w.disconnect(i, j);
                    format!("partition {} | {}", w.slots[i].who(), w.slots[j].who())
                } else {
                    w.connect(i, j);
                    format!("heal {} - {}", w.slots[i].who(), w.slots[j].who())
                }
            }
            12 => {
                let i = rng.random_range(0..n);
                w.slots[i].node.shutdown().await.expect("shutdown");
                let node = reopen(&w.slots[i].dir, w.slots[i].joining, &mut held).await;
                let slot = &mut w.slots[i];
                assert_eq!(
                    node.replica_id().to_string(),
                    slot.replica,
                    "a restart keeps the replica id"
                );
                // The old incarnation is closed and dropped here.
                slot.node = node;
                slot.inc += 1;
                slot.seq = 0;
                let (recs, tail) = lane_since(&slot.node, slot.lane_after);
                // The reopened node's first audit round may already have recorded another
                // node's contribution a seal leaves out (`src/views/audit.rs`): no event of
                // this slot's. A late event record is what a restart must never write.
                let events: Vec<&LateEvent> = recs
                    .iter()
                    .filter(|r| {
                        if r.record.get("contribution").is_some() {
                            assert_eq!(r.record["reason"].as_str(), Some("outside_seal"), "{r:?}");
                            return false;
                        }
                        true
                    })
                    .collect();
                assert!(events.is_empty(), "restart wrote late records: {events:?}");
                slot.lane_after = tail;
                let linked: Vec<usize> = w
                    .links
                    .iter()
                    .filter_map(|&(a, b)| (a == i).then_some(b).or((b == i).then_some(a)))
                    .collect();
                for j in &linked {
                    w.connect(i, *j);
                }
                format!("restart {} (links {linked:?})", w.slots[i].who())
            }
            13 => {
                let d = w.fresh_dir();
                let i = w.new_slot(d, true).await;
                let mut before = Vec::new();
                for _ in 0..rng.random_range(0..=2) {
                    let batch = w.fresh_batch(&mut rng, i);
                    let ctx = format!(
                        "step {step}: {} (joining, not synced) ingests",
                        w.slots[i].who()
                    );
                    let late = w.ingest_fresh(i, batch.clone(), step, &ctx).await;
                    assert_eq!(
                        late,
                        batch.len(),
                        "{ctx}: every event is late before syncing"
                    );
                    let k = w.apps.len();
                    for a in &w.apps[k - batch.len()..] {
                        assert_eq!(a.reason.as_deref(), Some("not_synced"), "{ctx}: {a:?}");
                        assert_eq!(a.late.len(), VIEWS.len(), "{ctx}: {a:?}");
                    }
                    before.extend(batch.iter().map(|e| e.time));
                    w.batches.push((i, batch));
                }
                let peers = w.peers(&mut rng, i);
                for &j in &peers {
                    w.connect(i, j);
                }
                let names: Vec<String> = peers.iter().map(|&j| w.slots[j].who()).collect();
                format!(
                    "join {} (ingested {before:?} before syncing), connect to {names:?}",
                    w.slots[i].who()
                )
            }
            14 => {
                let x = rng.random_range(0..n);
                snaps += 1;
                let snap = w.root.join(format!("snap{snaps}"));
                w.slots[x].node.snapshot(&snap).await.expect("snapshot");
                let d = w.fresh_dir();
                Node::restore(&snap, &d).expect("restore");
                let i = w.new_slot(d, false).await;
                assert_ne!(w.slots[i].replica, w.slots[x].replica, "a new replica id");
                // It may take events before it connects: late by the watermarks its state
                // holds (or `not_synced`, a copy of a joining node), or counted.
                let mut before = Vec::new();
                if rng.random_bool(0.3) {
                    let batch = w.fresh_batch(&mut rng, i);
                    let ctx = format!("step {step}: restored {} ingests", w.slots[i].who());
                    w.ingest_fresh(i, batch.clone(), step, &ctx).await;
                    before.extend(batch.iter().map(|e| e.time));
                    w.batches.push((i, batch));
                }
                // ISOLATED_RESTORE=1: the restored node stays unconnected until a heal step
                // (or the end) links it.
                let peers = if isolated {
                    Vec::new()
                } else {
                    w.peers(&mut rng, i)
                };
                for &j in &peers {
                    w.connect(i, j);
                }
                let names: Vec<String> = peers.iter().map(|&j| w.slots[j].who()).collect();
                format!(
                    "restore {} from a snapshot of {} (ingested {before:?} before connecting), \
                     connect to {names:?}",
                    w.slots[i].who(),
                    w.slots[x].who()
                )
            }
            15 | 16 => {
                let ms = rng.random_range(20..=80);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                format!("idle {ms} ms")
            }
            _ => {
                w.seal_round().await;
                "seal round".to_owned()
            }
        };
        eprintln!("seed {seed} step {step}: {action}");
        w.check(step, &format!("step {step} ({action})")).await;
    }

    // Heal everything; every node passes every window so far; converge; seal until no new
    // window turns final.
    let n = w.slots.len();
    for i in 0..n {
        for j in i + 1..n {
            if !w.links.contains(&(i, j)) {
                w.connect(i, j);
            }
        }
    }
    w.clock += 5 * MIN;
    for i in 0..n {
        w.slots[i].seq += 1;
        let e = Ev {
            source: w.slots[i].source(),
            seq: w.slots[i].seq,
            time: w.clock,
            page: "a",
            user: "closing".to_owned(),
        };
        let ctx = format!("closing ingest into {}", w.slots[i].who());
        w.ingest_fresh(i, vec![e], steps, &ctx).await;
    }
    w.converge().await;
    let settle = Instant::now();
    let mut stable = 0;
    let mut last = w.finals.len();
    while stable < 5 && settle.elapsed() < Duration::from_secs(20) {
        w.seal_round().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        w.check(steps, "settling").await;
        if w.finals.len() == last {
            stable += 1;
        } else {
            stable = 0;
            last = w.finals.len();
        }
    }
    w.converge().await;
    w.check(steps, "settled").await;

    // Every window ever reported final equals the batch recount.
    let want = recount(&w.apps);
    let mut bad = Vec::new();
    for (cell, first) in &w.finals {
        if want.get(cell) == Some(&first.value) {
            continue;
        }
        let mut msg = format!(
            "seed {seed}: final {cell:?} = {} (first reported by {} at step {}) ≠ recount {:?}\n",
            first.value,
            first.node,
            first.step,
            want.get(cell)
        );
        for a in w
            .apps
            .iter()
            .filter(|a| a.ev.start() == cell.1 && a.ev.page == cell.2)
        {
            msg.push_str(&format!(
                "  step {} on {} ({}): {}/{} t={} user={} late for {:?} ({:?})\n",
                a.step,
                a.node,
                a.replica,
                a.ev.source,
                a.ev.seq,
                a.ev.time,
                a.ev.user,
                a.late,
                a.reason
            ));
        }
        for s in &w.slots {
            let r = rows(&s.node).await;
            msg.push_str(&format!(
                "  now on {} ({}): {:?}\n",
                s.who(),
                s.replica,
                r.get(cell)
            ));
        }
        bad.push(msg);
    }
    let open_cells = want.keys().filter(|c| !w.finals.contains_key(*c)).count();
    if std::env::var("VERBOSE").is_ok() {
        for c in want.keys() {
            eprintln!(
                "  {c:?}: {}",
                if w.finals.contains_key(c) {
                    "final"
                } else {
                    "open"
                }
            );
        }
        for s in &w.slots {
            let page = s
                .node
                .view("clicks", &ViewQuery::default())
                .await
                .expect("view");
            eprintln!(
                "  {}: wm {:?} cluster {:?}",
                s.who(),
                page.watermark,
                page.cluster_watermark
            );
        }
    }
    let late = w.apps.iter().filter(|a| !a.late.is_empty()).count();
    eprintln!(
        "seed {seed}: {steps} steps, {} nodes, {} applications ({late} late for some view), \
         {} cells final, {open_cells} open, {held} reopens found the directory still held, \
         {:.1} s",
        w.slots.len(),
        w.apps.len(),
        w.finals.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(bad.is_empty(), "{}", bad.join(""));
    for s in &w.slots {
        s.node.shutdown().await.expect("shutdown");
    }
}

/// Regression test of what the model found (seed 1796306425833397795; fixed: peers met are
/// recorded from every link since open and kept in the node's announcement, so a restart
/// remembers them): seed nodes A and B are connected, then partitioned before they exchanged
/// anything; A restarts while partitioned, which forgot that it met B (members are replicas in its context, peers met
/// since open, announcers: B is none of them now). A then passes a window's deadline alone and
/// reports it final with its own contributions, while B — which met A only in A's previous
/// life — acknowledges an event for that window as applied and not late. The final value
/// misses an acknowledged on-time event; a node joining later adopts A's seal (it applied
/// nothing below its start) and reports the same short value final, while B holds the window
/// open with the full value for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_while_partitioned_never_finalizes_without_its_peer() {
    let root = tempfile::tempdir().expect("tempdir");
    let (da, db) = (root.path().join("a"), root.path().join("b"));
    let a = open(&da, false).await;
    let b = open(&db, false).await;
    // Connected, then partitioned before any gossip round.
    a.connect(&b).expect("connect");
    a.disconnect(&b).expect("disconnect");
    let ev = |s: &str, q: u64, t: u64| Event::new(s, q, json!({"page": "a", "user": s})).at(t);
    let out = b
        .ingest(STREAM, vec![ev("b", 1, 10 * MIN + 6_000)])
        .await
        .expect("b");
    assert_eq!((out.applied, out.late), (1, 0), "{out:?}");
    let out = a
        .ingest(STREAM, vec![ev("a", 1, 10 * MIN + 5_000)])
        .await
        .expect("a");
    assert_eq!((out.applied, out.late), (1, 0), "{out:?}");
    a.shutdown().await.expect("shutdown");
    drop(a);
    let a = open(&da, false).await;
    // A alone passes the window [10m, 11m) of `clicks` (no lateness).
    a.ingest(STREAM, vec![ev("a", 2, 13 * MIN)])
        .await
        .expect("a");
    for _ in 0..3 {
        a.maintain_views().await.expect("maintain");
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    // B never passed it: it still takes an event for the window, on time.
    let out = b
        .ingest(STREAM, vec![ev("b", 2, 10 * MIN + 30_000)])
        .await
        .expect("b");
    assert_eq!((out.applied, out.late), (1, 0), "{out:?}");
    let cell = ("clicks".to_owned(), 10 * MIN, "a".to_owned());
    // Every event acknowledged on time for the window: a1, b1, b2.
    let want = json!(3);
    a.connect(&b).expect("heal");
    let started = Instant::now();
    while a.context().expect("ctx") != b.context().expect("ctx") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no convergence"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..5 {
        a.maintain_views().await.expect("maintain");
        b.maintain_views().await.expect("maintain");
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    for (name, n) in [("A", &a), ("B", &b)] {
        let r = rows(n).await;
        if let Some((v, true)) = r.get(&cell) {
            assert_eq!(
                v, &want,
                "{name} reports {cell:?} final without acknowledged on-time events: {r:?}"
            );
        }
    }
    for n in [a, b] {
        n.shutdown().await.expect("shutdown");
    }
}

/// Regression test of seed 1796618566326469084: as above, but the restarted node had written
/// nothing before its restart — no event, so no watermark, so no announcement, which was the
/// only place the peers it met were kept. A met B, was partitioned, restarted and forgot B;
/// alone it vouched over itself, sealed a window and reported it final without B's on-time
/// events (B, which never restarted, still counted A and kept the window open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_before_its_first_event_remembers_the_peers_it_met() {
    let root = tempfile::tempdir().expect("tempdir");
    let (da, db) = (root.path().join("a"), root.path().join("b"));
    let a = open(&da, false).await;
    let b = open(&db, false).await;
    a.connect(&b).expect("connect");
    // A maintenance round or two while linked (nothing ingested anywhere yet).
    for _ in 0..3 {
        a.maintain_views().await.expect("maintain");
        b.maintain_views().await.expect("maintain");
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    a.disconnect(&b).expect("disconnect");
    a.shutdown().await.expect("shutdown");
    drop(a);
    let a = open(&da, false).await;
    let ev = |s: &str, q: u64, t: u64| Event::new(s, q, json!({"page": "a", "user": s})).at(t);
    let out = b
        .ingest(STREAM, vec![ev("b", 1, 10 * MIN + 6_000)])
        .await
        .expect("b");
    assert_eq!((out.applied, out.late), (1, 0), "{out:?}");
    let out = a
        .ingest(STREAM, vec![ev("a", 1, 10 * MIN + 5_000)])
        .await
        .expect("a");
    assert_eq!((out.applied, out.late), (1, 0), "{out:?}");
    a.ingest(STREAM, vec![ev("a", 2, 13 * MIN)])
        .await
        .expect("a");
    for _ in 0..3 {
        a.maintain_views().await.expect("maintain");
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let out = b
        .ingest(STREAM, vec![ev("b", 2, 10 * MIN + 30_000)])
        .await
        .expect("b");
    assert_eq!((out.applied, out.late), (1, 0), "{out:?}");
    let cell = ("clicks".to_owned(), 10 * MIN, "a".to_owned());
    let want = json!(3);
    a.connect(&b).expect("heal");
    let started = Instant::now();
    while a.context().expect("ctx") != b.context().expect("ctx") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no convergence"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..5 {
        a.maintain_views().await.expect("maintain");
        b.maintain_views().await.expect("maintain");
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    for (name, n) in [("A", &a), ("B", &b)] {
        let r = rows(n).await;
        if let Some((v, true)) = r.get(&cell) {
            assert_eq!(
                v, &want,
                "{name} reports {cell:?} final without acknowledged on-time events: {r:?}"
            );
        }
    }
    for n in [a, b] {
        n.shutdown().await.expect("shutdown");
    }
}
