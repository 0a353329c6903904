//! Simulated power loss (docs/design/principles.md, "Testing goals"; pitfall "acknowledged before
//! durable"): a workload runs through `RedbStore` on a backend that records every write, resize and
//! sync; crash images are cut from that record ("durable only", "durable + random subset of
//! unsynced writes", "durable + last write torn at a 512 B / 4 KiB boundary", "header written but
//! file extension not", and "everything reached the disk"); each image is reopened on a fresh
//! backend. Pass: the store opens with exactly the state of the acknowledged commits (plus, at
//! most, the one commit in flight at the crash, all or nothing), consistent (`verify`,
//! `check_integrity`), dedup marks and dot counter intact — or the open refuses with a clear error.
//! Never a panic, never a silent loss.
//!
//! `IMAGES=<n>` sets the image count (CI default 10,000; `SOAK=1` ×100); `SEED=<n>` replays.

use crate::common;

use common::workload::{Action, ME, Model, Peer, STREAM, WALL0, values_of};
use common::{FaultBackend, ImageKind, Rec, crash_image};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::time::Instant;
use tidemark::crdts::CausalContext;
use tidemark::ops::{validate_events, validate_ops};
use tidemark::store::{OpenOptions, RedbStore};
use tidemark::{Event, Limits, Op};

/// The state after one step of the workload, and where its records lie in the backend log.
#[derive(Clone, Debug)]
struct Step {
    start: usize,
    end: usize,
    model: Model,
    ctx: CausalContext,
    what: &'static str,
}

struct Recorded {
    log: Vec<Rec>,
    steps: Vec<Step>,
    options: OpenOptions,
}

fn options(rng: &mut ChaCha8Rng) -> OpenOptions {
    // Small caches make redb write pages out before the commit's sync, too.
    let cache_bytes = [64 * 1024, 512 * 1024, 4 << 20][rng.random_range(0..3)];
    OpenOptions {
        limits: Limits {
            cache_bytes,
            ..Limits::default()
        },
        new_replica_id: Some(ME),
        ..OpenOptions::default()
    }
}

/// Runs a random workload on a recording backend.
fn record_workload(rng: &mut ChaCha8Rng, steps: usize) -> Recorded {
    let backend = FaultBackend::recording();
    let options = options(rng);
    let mut store =
        RedbStore::open_with_backend(backend.clone(), options.clone()).expect("open recorder");
    let mut peer = Peer::new();
    let mut model = Model::default();
    let mut out = vec![Step {
        start: 0,
        end: backend.log_len(),
        model: model.clone(),
        ctx: store.ctx().clone(),
        what: "open",
    }];
    for i in 0..steps {
        let wall = WALL0 + 5 * i as u64;
        let start = backend.log_len();
        let action = Action::random(rng);
        action
            .execute(&mut store, &mut peer, wall)
            .expect("workload step");
        action.apply(&mut model, &peer);
        // The live store agrees with its tables after every step (pitfall "bookkeeping equals
        // disk").
        store.verify().expect("verify the live store");
        out.push(Step {
            start,
            end: backend.log_len(),
            model: model.clone(),
            ctx: store.ctx().clone(),
            what: action.name(),
        });
    }
    // A crash, not a shutdown: nothing after this point is part of the record.
    let log = backend.log();
    drop(store);
    Recorded {
        log,
        steps: out,
        options,
    }
}

#[derive(Debug, Default)]
struct Tally {
    opened: BTreeMap<String, u64>,
    refused: BTreeMap<String, u64>,
    in_flight_applied: u64,
    in_flight_dropped: u64,
    refusals: Vec<String>,
}

/// Reopens one image and checks it against the candidates (`steps[acked]`, and the step in
/// flight if any). Returns the refusal message if the open refused.
fn check_image(
    image: Vec<u8>,
    options: &OpenOptions,
    candidates: &[&Step],
    rng: &mut ChaCha8Rng,
) -> Result<usize, String> {
    let mut store = RedbStore::open_with_backend(FaultBackend::from_image(image), options.clone())
        .map_err(|e| e.to_string())?;
    assert_eq!(store.replica(), ME, "the replica id changed");
    store.verify().expect("verify after recovery");
    assert!(
        store.check_integrity().expect("integrity check runs"),
        "redb integrity check failed"
    );
    let values = values_of(&store);
    let which = candidates
        .iter()
        .position(|c| c.model.values == values && &c.ctx == store.ctx())
        .unwrap_or_else(|| {
            let acked = &candidates[0].model.values;
            let lost: Vec<_> = acked
                .iter()
                .filter(|(k, v)| values.get(*k) != Some(*v))
                .map(|(k, v)| format!("{k}: expected {v:?}, got {:?}", values.get(k)))
                .take(5)
                .collect();
            panic!(
                "recovered state matches no acknowledged prefix: {} keys recovered, {} expected; \
                 first differences: {lost:?}; context {:?}, expected {:?}",
                values.len(),
                acked.len(),
                store.ctx(),
                candidates[0].ctx,
            )
        });
    let step = candidates[which];
    // Dedup marks survived with their effects: re-sending applied events changes nothing.
    let limits = Limits::default();
    let seen: Vec<_> = step.model.seen.iter().collect();
    if !seen.is_empty() {
        let events: Vec<Event> = (0..rng.random_range(1..8))
            .map(|_| {
                let (source, seq) = seen[rng.random_range(0..seen.len())];
                Event {
                    source: source.clone(),
                    seq: *seq,
                    ops: vec![Op::inc_gcounter("g0", 1)],
                    ..Default::default()
                }
            })
            .collect();
        let commit = store
            .commit_local(
                &validate_events(STREAM, &events, &limits).expect("valid"),
                WALL0 + 1_000_000,
            )
            .expect("commit after recovery");
        assert!(
            commit.duplicate.iter().all(|d| *d),
            "an applied event was applied again"
        );
    }
    // No dot reuse: the next dot is right above every committed one.
    let before = store.ctx().max_seq(ME);
    assert_eq!(before, step.ctx.max_seq(ME));
    store
        .commit_local(
            &validate_ops(&[Op::inc_gcounter("probe", 1)], &limits).expect("valid"),
            WALL0 + 1_000_001,
        )
        .expect("commit after recovery");
    assert_eq!(store.ctx().max_seq(ME), before + 1);
    store.verify().expect("verify after a new commit");
    Ok(which)
}

fn pick_crash_point(log: &[Rec], rng: &mut ChaCha8Rng) -> usize {
    let syncs: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, r)| **r == Rec::Sync)
        .map(|(i, _)| i)
        .collect();
    match rng.random_range(0..10) {
        // Just before a sync: the largest window of unsynced writes.
        0..=3 if !syncs.is_empty() => syncs[rng.random_range(0..syncs.len())],
        4 if !syncs.is_empty() => syncs[rng.random_range(0..syncs.len())] + 1,
        _ => rng.random_range(0..=log.len()),
    }
}

#[test]
fn crash_images_recover_every_acknowledged_commit() {
    let seed = common::seed("crash_images");
    let mut rng = common::rng(seed);
    let images = common::env_usize("IMAGES", 10_000) * if common::soak() { 100 } else { 1 };
    let per_workload = 250;
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut done = 0;
    let mut workload = 0;
    while done < images {
        let wseed: u64 = rng.random();
        let mut wrng = common::rng(wseed);
        let steps = wrng.random_range(20..60);
        let rec = record_workload(&mut wrng, steps);
        let n = per_workload.min(images - done);
        for i in 0..n {
            let upto = pick_crash_point(&rec.log, &mut wrng);
            let kind = ImageKind::pick(&mut wrng);
            let image = crash_image(&rec.log, upto, kind, &mut wrng);
            let acked = rec.steps.iter().filter(|s| s.end <= upto).count();
            let mut candidates = vec![&rec.steps[acked.saturating_sub(1)]];
            if let Some(flight) = rec.steps.get(acked).filter(|s| s.start < upto) {
                candidates.push(flight);
            }
            let ctx = format!(
                "seed {seed}, workload {workload} (seed {wseed}), image {i}: {kind:?} at record \
                 {upto}/{} ({} steps acked, in flight: {:?})",
                rec.log.len(),
                acked,
                candidates.get(1).map(|s| s.what)
            );
            let mut irng = common::rng(wrng.random());
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                check_image(image, &rec.options, &candidates, &mut irng)
            }));
            let label = format!("{kind:?}");
            match r {
                Ok(Ok(which)) => {
                    *tally.opened.entry(label).or_default() += 1;
                    if candidates.len() == 2 {
                        if which == 1 {
                            tally.in_flight_applied += 1;
                        } else {
                            tally.in_flight_dropped += 1;
                        }
                    }
                }
                Ok(Err(msg)) => {
                    assert!(!msg.trim().is_empty(), "{ctx}: refused without a message");
                    // Only a crash while the database file was first being created may leave
                    // a file that does not open; nothing was acknowledged then.
                    assert_eq!(acked, 0, "{ctx}: refused to open: {msg}");
                    *tally.refused.entry(label).or_default() += 1;
                    if tally.refusals.len() < 5 {
                        tally.refusals.push(format!("{ctx}: {msg}"));
                    }
                }
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default();
                    panic!("{ctx}: {msg}");
                }
            }
        }
        done += n;
        workload += 1;
    }
    println!(
        "crash_images: {done} images from {workload} workloads in {:.1?}: opened {:?}, refused \
         {:?}, commit in flight applied {} / dropped {}",
        started.elapsed(),
        tally.opened,
        tally.refused,
        tally.in_flight_applied,
        tally.in_flight_dropped
    );
    for r in &tally.refusals {
        println!("  refusal: {r}");
    }
    // Refusals happen only for crashes while the file was first created (asserted above):
    // redb writes its magic number last, and such a file is refused ("Not a redb database")
    // rather than silently re-created; nothing was acknowledged by then.
}
