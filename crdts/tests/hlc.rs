//! Hybrid logical clock properties over random sequences of local events, remote observations
//! (some too far ahead, some at the top of the logical range) and restarts from the persisted
//! mark, with a wall clock that jitters and steps back:
//!
//! * every `now()` is strictly greater, as `(l, c)`, than every timestamp the clock issued or
//!   accepted before (so a write after receiving a timestamp orders after it: happens-before);
//! * an observation is rejected exactly when `l_m > wall + max_drift`, and then leaves the clock
//!   unchanged;
//! * `l` never runs ahead of the largest wall time or accepted remote time by more than the one
//!   millisecond borrowed on a logical overflow;
//! * `restore(mark())` continues exactly where the clock was.

mod common;

use common::*;
use proptest::prelude::*;
use tidemark_crdts::{Hlc, HlcError, Timestamp};

const DRIFT: u64 = 500;
const START: u64 = 1_000_000;

#[derive(Clone, Debug)]
enum Ev {
    /// A local event; the wall clock moves by the given amount (may step back).
    Now(i64),
    /// A remote timestamp `wall + offset`, with the given logical counter.
    Observe(i64, u32),
    /// Restart from the persisted mark.
    Restart,
}

fn ev() -> impl Strategy<Value = Ev> {
    let logical = prop_oneof![0u32..4, (u32::MAX - 3)..=u32::MAX];
    prop_oneof![
        6 => (-3i64..6).prop_map(Ev::Now),
        4 => (-20i64..(DRIFT as i64 + 20), logical).prop_map(|(o, c)| Ev::Observe(o, c)),
        1 => Just(Ev::Restart),
    ]
}

#[test]
fn hlc_is_monotonic_respects_happened_before_and_rejects_far_future() {
    check(
        "hlc_is_monotonic_respects_happened_before_and_rejects_far_future",
        CASES,
        proptest::collection::vec(ev(), 1..60),
        |events| {
            let me = rid(0);
            let mut clock = Hlc::new(me, DRIFT);
            let mut wall = START;
            let mut max_lc: (u64, u32) = (0, 0);
            let mut max_l = 0u64;
            for e in events {
                match e {
                    Ev::Now(step) => {
                        wall = wall.saturating_add_signed(step);
                        let t = clock.now(wall).expect("clock left");
                        prop_assert!(
                            (t.physical_ms, t.logical) > max_lc,
                            "{t:?} not above {max_lc:?}"
                        );
                        prop_assert_eq!(t.replica, me);
                        prop_assert_eq!(t, clock.stamp());
                        max_lc = (t.physical_ms, t.logical);
                        max_l = max_l.max(wall);
                    }
                    Ev::Observe(off, logical) => {
                        let remote = Timestamp {
                            physical_ms: wall.saturating_add_signed(off),
                            logical,
                            replica: rid(1),
                        };
                        let before = clock.clone();
                        match clock.observe(&remote, wall) {
                            Ok(()) => {
                                prop_assert!(remote.physical_ms <= wall + DRIFT);
                                let lc = (clock.stamp().physical_ms, clock.stamp().logical);
                                prop_assert!(lc > (remote.physical_ms, remote.logical));
                                prop_assert!(lc > max_lc || lc == max_lc && before == clock);
                                max_lc = max_lc.max(lc).max((remote.physical_ms, remote.logical));
                                max_l = max_l.max(wall).max(remote.physical_ms);
                            }
                            Err(HlcError::TooFarAhead {
                                remote_ms,
                                wall_ms,
                                max_drift_ms,
                            }) => {
                                prop_assert!(remote.physical_ms > wall + DRIFT);
                                prop_assert_eq!(
                                    (remote_ms, wall_ms, max_drift_ms),
                                    (remote.physical_ms, wall, DRIFT)
                                );
                                prop_assert_eq!(
                                    &clock,
                                    &before,
                                    "a rejected observation changed the clock"
                                );
                            }
                            Err(HlcError::Exhausted) => {
                                prop_assert!(false, "clock exhausted far below its ceiling");
                            }
                        }
                    }
                    Ev::Restart => {
                        let restored = Hlc::restore(me, clock.mark(), DRIFT);
                        prop_assert_eq!(&restored, &clock);
                        clock = restored;
                    }
                }
                prop_assert!(
                    clock.stamp().physical_ms <= max_l + 1,
                    "l ran ahead of every input"
                );
            }
            Ok(())
        },
    );
}
