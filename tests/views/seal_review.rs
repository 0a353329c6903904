//! Hostile review of 4b742e0 end to end (`Ledger::agreed`: below `since`, a seal of the
//! node's lost cluster is adopted over an agreeing set counting the node): two copies of the
//! lost cluster's members, linked, both remove the lost cluster; every window the snapshots
//! held final must read final with the same value on both copies (the Ledger-level attacks
//! are in `src/views/seal_review_tests.rs`).

use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark::views::{Event, ViewDef, ViewQuery};
use tidemark::{Node, NodeConfig};

use crate::support::converge;

const MIN: u64 = 60_000;

fn config(dir: &std::path::Path) -> NodeConfig {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = serde_json::from_value::<Vec<ViewDef>>(json!([
        {"name": "c", "stream": "s", "kind": "count", "window": {"tumbling": "1m"}},
    ]))
    .expect("defs");
    cfg
}

async fn open(dir: &std::path::Path) -> Node {
    Node::open(config(dir)).await.expect("open")
}

fn ev(src: &str, seq: u64, t: u64) -> Event {
    Event::new(src, seq, json!({"user": src})).at(t)
}

/// `window start → (value, final)` of view `c` on `node`.
async fn rows(node: &Node) -> BTreeMap<u64, (serde_json::Value, bool)> {
    let page = node.view("c", &ViewQuery::default()).await.expect("view");
    page.rows
        .into_iter()
        .map(|r| (r.window_start.unwrap_or(0), (r.value, r.is_final)))
        .collect()
}

/// Waits until window `start` is final on every node of `all` (maintaining each).
async fn wait_final_on_all(all: &[&Node], start: u64) {
    let started = Instant::now();
    loop {
        for n in all {
            n.maintain_views().await.expect("maintain");
        }
        let mut done = true;
        for n in all {
            done &= matches!(rows(n).await.get(&start), Some((_, true)));
        }
        if done {
            return;
        }
        let mut seen = Vec::new();
        for n in all {
            seen.push(rows(n).await);
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "window {start} never final everywhere: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ingests `events` of source `src` into `node` until none is late (a restored copy refuses
/// events as late while it still waits to start), with fresh sequence numbers from `seq` on;
/// returns the next free sequence number.
async fn ingest_on_time(node: &Node, src: &str, mut seq: u64, times: &[u64]) -> u64 {
    let started = Instant::now();
    loop {
        let events: Vec<Event> = times
            .iter()
            .enumerate()
            .map(|(i, t)| ev(src, seq + i as u64, *t))
            .collect();
        seq += times.len() as u64;
        let out = node.ingest("s", events).await.expect("ingest");
        if out.late == 0 {
            return seq;
        }
        if started.elapsed() > Duration::from_secs(15) {
            let lane = node.late_events("s", None, 0).expect("late lane");
            let last: Vec<_> = lane
                .events
                .iter()
                .rev()
                .take(2)
                .map(|e| &e.record)
                .collect();
            let own = node.get(&tidemark::views::keys::wm_key("s", node.replica_id()));
            panic!("{src}: events stay late; last late records {last:?}; announcement {own:?}");
        }
        node.maintain_views().await.expect("maintain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Holds: A + B hold window [0, 1m) final = 2 (and [1m, 2m) = 2); both are lost. Copies of
/// both (each under a new replica id, its `since` above those windows) are linked, remove A
/// and B, and go on ingesting. Both copies report the old windows final with A's and B's
/// value (each adopts {A, B} over {copy A, copy B}, which agrees there too), and agree on
/// the windows they seal themselves.
///
/// Here each copy removes A and B before the two are linked (then each vouched alone first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_linked_copies_of_a_lost_cluster_keep_its_final_windows_alike() {
    two_linked_copies(false, 4).await;
}

/// BUG (liveness, intermittent, not 4b742e0's rule): the same with the copies linked first
/// and A and B removed on x, then on y. Rarely (seen twice on this branch: once in ~10 runs
/// of 4 rounds, once in 12 runs of 10 rounds, each time on y) y keeps
/// refusing every event as late `not_synced` (for 15 s, maintaining all along) although it
/// vouches and seals: its announcement holds epochs over {x, y} and seals, with `"u":1`
/// (it never applied). The window x and y take events for then never becomes final (x
/// waits for y's watermark). Seen as `y: events stay late; last late records [... "reason":
/// "not_synced" ...]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "BUG (liveness, intermittent, ~1 round in 40-120): a restored copy linked to another copy, \
            then removing its lost cluster, stays not_synced forever: `y: events stay late` \
            (late lane reason not_synced) while its announcement already vouches and seals"]
async fn two_copies_linked_before_the_removal_both_start() {
    two_linked_copies(true, 10).await;
}

async fn two_linked_copies(link_first: bool, rounds: usize) {
    for round in 0..rounds {
        let root = tempfile::tempdir().expect("tempdir");
        let a = open(&root.path().join("a")).await;
        let b = open(&root.path().join("b")).await;
        a.connect(&b).expect("connect");
        a.ingest("s", vec![ev("a", 1, 10_000)]).await.expect("a");
        b.ingest("s", vec![ev("b", 1, 20_000)]).await.expect("b");
        a.ingest("s", vec![ev("a", 2, MIN + 1)]).await.expect("a");
        b.ingest("s", vec![ev("b", 2, MIN + 2)]).await.expect("b");
        a.ingest("s", vec![ev("a", 3, 3 * MIN)]).await.expect("a");
        b.ingest("s", vec![ev("b", 3, 3 * MIN)]).await.expect("b");
        converge(&[&a, &b]).await;
        wait_final_on_all(&[&a, &b], MIN).await;
        let before = rows(&a).await;
        assert_eq!(before.get(&0), Some(&(json!(2), true)), "round {round}");
        assert_eq!(rows(&b).await.get(&0), Some(&(json!(2), true)));
        let (sa, sb) = (root.path().join("a.snap"), root.path().join("b.snap"));
        a.snapshot(&sa).await.expect("snapshot a");
        b.snapshot(&sb).await.expect("snapshot b");
        let lost = [a.replica_id(), b.replica_id()];
        for n in [a, b] {
            n.shutdown().await.expect("shutdown");
        }
        let (dx, dy) = (root.path().join("x"), root.path().join("y"));
        Node::restore(&sa, &dx).expect("restore x");
        Node::restore(&sb, &dy).expect("restore y");
        let x = open(&dx).await;
        let y = open(&dy).await;
        if link_first {
            x.connect(&y).expect("connect");
        }
        for n in [&x, &y] {
            for id in lost {
                n.decommission(id).await.expect("decommission");
            }
        }
        if !link_first {
            for n in [&x, &y] {
                n.maintain_views().await.expect("maintain");
            }
            x.connect(&y).expect("connect");
        }
        ingest_on_time(&x, "x", 1, &[4 * MIN, 6 * MIN]).await;
        ingest_on_time(&y, "y", 1, &[4 * MIN + 1, 6 * MIN]).await;
        converge(&[&x, &y]).await;
        wait_final_on_all(&[&x, &y], 4 * MIN).await;
        let (on_x, on_y) = (rows(&x).await, rows(&y).await);
        for w in [0, MIN] {
            assert_eq!(
                on_x.get(&w),
                before.get(&w),
                "round {round}: window {w} on copy x {on_x:?}, on A before {before:?}"
            );
            assert_eq!(
                on_y.get(&w),
                before.get(&w),
                "round {round}: window {w} on copy y {on_y:?}, on A before {before:?}"
            );
        }
        for (w, (v, fin)) in &on_x {
            if *fin && on_y.get(w).is_some_and(|(_, f)| *f) {
                assert_eq!(
                    Some(v),
                    on_y.get(w).map(|(v, _)| v),
                    "round {round}: window {w} final on both copies with different values"
                );
            }
        }
        assert_eq!(on_x.get(&(4 * MIN)), Some(&(json!(2), true)), "{on_x:?}");
        for n in [x, y] {
            n.shutdown().await.expect("shutdown");
        }
    }
}

/// Fixed (was BUG, pre-existing: the same with `Ledger::agreed` of 4b742e0^): copies of
/// snapshots of different ages. y (of B, taken before window [0, 1m) was final) removes A and
/// B alone and takes 3 events for that window on time (its `since` is 20 s; the epochs its
/// snapshot holds fix {A, B} only below 10 s, so nothing refuses them). x (of A, taken after
/// A and B reported the window final = 2) adopts {A, B} for every deadline below 3m at its
/// open, before it holds y's announcement (its announced seals: `[0, 180000)` over {A, B}),
/// and only later vouches over {x, y} from deadline 0 on. y met x and read x's epochs fixing
/// {x, y} for window 0's deadline; at or above its `since` it kept to its own agreeing set
/// {x, y}: final = 3 (its events), while x reports 2. The cause: x's epochs name {x, y} where
/// x sealed {A, B}, and y took a set as agreed from epochs alone. Now a node seals no
/// deadline with a set other than one another announcer reported it sealed with
/// (`Ledger::sealed_of`: x's seal, and A's own), and adopts no set below epochs it already
/// announced while that announced set may still be sealed (`Ledger::fixed_to`): y keeps window 0
/// not final (its own events are in it; the cluster's value leaves them out), x keeps it
/// final = 2 as A reported it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_snapshots_of_different_ages_agree_on_the_old_window() {
    copies_of_snapshots_of_different_ages(false, false).await;
}

/// The same with x converged with y before it removes A and B: before the fix y reported
/// window 0 final = 3 and x = 2 here too. Safety only: here x keeps refusing its own events
/// as `not_synced` for good after the removal (pre-existing, by the restored copy's
/// known-member rule: y is a live announcer that is neither a known member of x's cluster nor
/// removed, so nothing ends x's wait; `read::restored_settled`), so later windows are not
/// waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_snapshots_of_different_ages_agree_after_syncing_first() {
    copies_of_snapshots_of_different_ages(true, false).await;
}

/// Still weak (documented in ARCHITECTURE.md's known weak spots): the same, but y's
/// watermark passes window 0's deadline while it is alone (an event at 2m), so it seals window
/// 0 over {y} (= 3, its own events) before it ever holds x's seal or A's last announcement; x
/// adopts A's seal (= 2) at its open from its snapshot alone. Each decided on what it held; a
/// copy cannot know how far its lost cluster got after its snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "WEAK SPOT (not fixable without coordination): an older copy that removed its lost cluster \
            seals window 0 alone (= 3) before it holds any newer seal; a newer copy adopts the \
            cluster's seal (= 2) at its open: window 0 final on both with different values"]
async fn an_older_copy_that_seals_alone_first_still_contradicts_a_newer_copy() {
    copies_of_snapshots_of_different_ages(false, true).await;
}

async fn copies_of_snapshots_of_different_ages(sync_first: bool, y_seals_alone: bool) {
    for round in 0..4 {
        let root = tempfile::tempdir().expect("tempdir");
        let a = open(&root.path().join("a")).await;
        let b = open(&root.path().join("b")).await;
        a.connect(&b).expect("connect");
        a.ingest("s", vec![ev("a", 1, 10_000)]).await.expect("a");
        b.ingest("s", vec![ev("b", 1, 20_000)]).await.expect("b");
        converge(&[&a, &b]).await;
        for n in [&a, &b] {
            n.maintain_views().await.expect("maintain");
        }
        converge(&[&a, &b]).await;
        let sb = root.path().join("b.snap");
        b.snapshot(&sb).await.expect("snapshot b");
        a.ingest("s", vec![ev("a", 2, 3 * MIN)]).await.expect("a");
        b.ingest("s", vec![ev("b", 2, 3 * MIN)]).await.expect("b");
        converge(&[&a, &b]).await;
        wait_final_on_all(&[&a, &b], 0).await;
        let before = rows(&a).await;
        assert_eq!(before.get(&0), Some(&(json!(2), true)), "round {round}");
        let sa = root.path().join("a.snap");
        a.snapshot(&sa).await.expect("snapshot a");
        let lost = [a.replica_id(), b.replica_id()];
        for n in [a, b] {
            n.shutdown().await.expect("shutdown");
        }
        let (dx, dy) = (root.path().join("x"), root.path().join("y"));
        Node::restore(&sa, &dx).expect("restore x");
        Node::restore(&sb, &dy).expect("restore y");
        let y = open(&dy).await;
        for id in lost {
            y.decommission(id).await.expect("decommission");
        }
        let took = y
            .ingest(
                "s",
                vec![ev("y", 1, 30_000), ev("y", 2, 40_000), ev("y", 3, 50_000)],
            )
            .await
            .expect("y");
        eprintln!(
            "round {round}: y took window 0 events with {} late",
            took.late
        );
        y.maintain_views().await.expect("maintain");
        if y_seals_alone {
            y.ingest("s", vec![ev("y", 100, 2 * MIN)]).await.expect("y");
            wait_final_on_all(&[&y], 0).await;
        }
        let x = open(&dx).await;
        if sync_first {
            x.connect(&y).expect("connect");
            converge(&[&x, &y]).await;
        }
        for id in lost {
            x.decommission(id).await.expect("decommission");
        }
        if !sync_first {
            // x ends its wait as a copy on the removal (every other member it knows of is
            // gone) before it holds y's announcement: y is no known member of its cluster,
            // so once x holds y's announcement first, nothing ends the wait (the variant
            // below), and x refuses its own events as `not_synced`. No maintenance round
            // before the link, and converged before x moves its watermark: x's first epochs
            // name y from deadline 0 on (had x vouched alone first, x and y would be two
            // clusters started apart, a known weak spot).
            x.connect(&y).expect("connect");
            converge(&[&x, &y]).await;
        }
        if sync_first {
            // x stays `not_synced` here (pre-existing, see the test's doc): only safety is
            // checked, after a few rounds of maintenance on both.
            x.ingest("s", vec![ev("x", 1, 4 * MIN), ev("x", 2, 6 * MIN)])
                .await
                .expect("x");
            y.ingest("s", vec![ev("y", 4, 4 * MIN + 1), ev("y", 5, 6 * MIN)])
                .await
                .expect("y");
            converge(&[&x, &y]).await;
            for _ in 0..10 {
                for n in [&x, &y] {
                    n.maintain_views().await.expect("maintain");
                }
                converge(&[&x, &y]).await;
            }
        } else {
            ingest_on_time(&x, "x", 1, &[4 * MIN, 6 * MIN]).await;
            ingest_on_time(&y, "y", 4, &[4 * MIN + 1, 6 * MIN]).await;
            converge(&[&x, &y]).await;
            wait_final_on_all(&[&x, &y], 4 * MIN).await;
        }
        let (on_x, on_y) = (rows(&x).await, rows(&y).await);
        eprintln!("round {round}: A before {before:?}\n  x {on_x:?}\n  y {on_y:?}");
        if std::env::var("SEAL_REVIEW_DEBUG").is_ok() {
            for n in [&x, &y] {
                for id in [x.replica_id(), y.replica_id()] {
                    let k = tidemark::views::keys::wm_key("s", id);
                    eprintln!("  on {}: {id} announces {:?}", n.replica_id(), n.get(&k));
                }
            }
            eprintln!("  x {} y {} lost {lost:?}", x.replica_id(), y.replica_id());
        }
        for (w, (v, fin)) in &on_x {
            if *fin && on_y.get(w).is_some_and(|(_, f)| *f) {
                assert_eq!(
                    Some(v),
                    on_y.get(w).map(|(v, _)| v),
                    "round {round}: window {w} final on both copies with different values: \
                     x {on_x:?}, y {on_y:?}"
                );
            }
        }
        // Nothing that any node reported final reads otherwise: A's value of window 0 is
        // either final with it or not final.
        for (copy, on) in [("x", &on_x), ("y", &on_y)] {
            if let Some((v, true)) = on.get(&0) {
                assert_eq!(
                    Some(v),
                    before.get(&0).map(|(v, _)| v),
                    "round {round}: copy {copy} reports window 0 final with another value: {on:?}"
                );
            }
        }
        // x adopts A's seal before it holds anything of y here (deterministic); linked and
        // converged first, x may hold y's start below window 0's deadline before its first
        // seal step, and then keeps the window not final (safe either way).
        if !sync_first {
            assert_eq!(
                on_x.get(&0),
                before.get(&0),
                "round {round}: x keeps A's final window 0: {on_x:?}"
            );
        }
        for n in [x, y] {
            n.shutdown().await.expect("shutdown");
        }
    }
}
