//! The recorded history (one record per op: invoke and completion time, outcome) and the
//! offline checker.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How an op ended, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged (200 after the durable commit).
    Ok,
    /// Definitely not applied (connection refused, 4xx including 429).
    Fail,
    /// Unknown: timeout or error after the request may have reached the node, or 5xx.
    Info,
}

/// What an op did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// `gcounter/{key}` += by.
    Inc { key: String, by: u64 },
    /// `orset/{key}` add of an element unique to this op.
    Add { key: String, elem: String },
    /// `orset/{key}` remove of `elem`, issued at the node whose read just showed `elem` (so the
    /// remove observes that element's add: the node's state only grows and is durable).
    Remove { key: String, elem: String },
}

/// One op of the history.
#[derive(Clone, Debug)]
pub struct Op {
    /// Client task.
    pub client: usize,
    /// Node the request went to.
    pub node: usize,
    /// What it did.
    pub kind: OpKind,
    /// Invoked at (since the run started).
    pub invoke: Duration,
    /// Completed at.
    pub complete: Duration,
    /// Result.
    pub outcome: Outcome,
}

/// Final state of one node: counter and set values by key name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    /// `gcounter` values (absent key = 0).
    pub counters: BTreeMap<String, u64>,
    /// `orset` values.
    pub sets: BTreeMap<String, BTreeSet<String>>,
}

/// Every sum of a sub-multiset of `values` (exact, by dynamic programming over a bitset).
pub fn subset_sums(values: &[u64]) -> Vec<bool> {
    let total: u64 = values.iter().sum();
    let mut reach = vec![false; usize::try_from(total).expect("sum fits") + 1];
    reach[0] = true;
    let mut hi = 0usize;
    for &v in values {
        let v = usize::try_from(v).expect("fits");
        for s in (0..=hi).rev() {
            if reach[s] {
                reach[s + v] = true;
            }
        }
        hi += v;
    }
    reach
}

/// Summary of a successful check.
#[derive(Debug, Default)]
pub struct Summary {
    /// Ops by outcome.
    pub ok: usize,
    /// Definite failures.
    pub fail: usize,
    /// Indeterminate.
    pub info: usize,
    /// Set elements present at the end / acknowledged adds removed by acknowledged removes.
    pub present: usize,
    /// Acknowledged adds later removed.
    pub removed: usize,
}

/// Checks the history against the final states of every node; returns every violation found.
pub fn check(history: &[Op], finals: &[NodeState]) -> Result<Summary, Vec<String>> {
    let mut errors = Vec::new();
    let mut summary = Summary::default();
    for op in history {
        match op.outcome {
            Outcome::Ok => summary.ok += 1,
            Outcome::Fail => summary.fail += 1,
            Outcome::Info => summary.info += 1,
        }
    }
    // 1. Every node returns the same values.
    for (i, f) in finals.iter().enumerate().skip(1) {
        if f != &finals[0] {
            errors.push(format!(
                "node n{i} differs from n0:\n  n0: {:?}\n  n{i}: {f:?}",
                finals[0]
            ));
        }
    }
    let state = &finals[0];
    // 2. Counters: final = acknowledged sum + a subset sum of the indeterminate increments.
    let mut acked: BTreeMap<&str, u64> = BTreeMap::new();
    let mut unknown: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for op in history {
        if let OpKind::Inc { key, by } = &op.kind {
            match op.outcome {
                Outcome::Ok => *acked.entry(key).or_default() += by,
                Outcome::Info => unknown.entry(key).or_default().push(*by),
                Outcome::Fail => {}
            }
        }
    }
    let keys: BTreeSet<&str> = acked
        .keys()
        .chain(unknown.keys())
        .copied()
        .chain(state.counters.keys().map(String::as_str))
        .collect();
    for key in keys {
        let got = state.counters.get(key).copied().unwrap_or(0);
        let base = acked.get(key).copied().unwrap_or(0);
        let maybe = unknown.get(key).cloned().unwrap_or_default();
        let sums = subset_sums(&maybe);
        let fine = got
            .checked_sub(base)
            .and_then(|excess| usize::try_from(excess).ok())
            .is_some_and(|excess| sums.get(excess).copied().unwrap_or(false));
        if !fine {
            errors.push(format!(
                "counter {key}: final {got}, acknowledged sum {base}, indeterminate increments {maybe:?}: \
                 the excess is not a subset sum (lost or invented increments)"
            ));
        }
    }
    // 3. Sets: every element is added by exactly one op.
    let mut adds: BTreeMap<(&str, &str), &Op> = BTreeMap::new();
    let mut removes: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for op in history {
        match &op.kind {
            OpKind::Add { key, elem } => {
                assert!(
                    adds.insert((key, elem), op).is_none(),
                    "element {elem} added twice"
                );
            }
            OpKind::Remove { key, elem } => removes.entry((key, elem)).or_default().push(op),
            OpKind::Inc { .. } => {}
        }
    }
    for ((key, elem), add) in &adds {
        let present = state.sets.get(*key).is_some_and(|s| s.contains(*elem));
        let rms = removes
            .get(&(*key, *elem))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let rm_ok = rms.iter().any(|r| r.outcome == Outcome::Ok);
        let rm_maybe = rms.iter().any(|r| r.outcome != Outcome::Fail);
        if present {
            summary.present += 1;
            if add.outcome == Outcome::Fail {
                errors.push(format!(
                    "orset/{key}: {elem} present but its add failed: {add:?}"
                ));
            }
            if rm_ok {
                errors.push(format!(
                    "orset/{key}: {elem} present after an acknowledged remove that observed it: {rms:?}"
                ));
            }
        } else if add.outcome == Outcome::Ok {
            if rm_ok {
                summary.removed += 1;
            } else if !rm_maybe {
                errors.push(format!(
                    "orset/{key}: acknowledged add of {elem} lost (no remove of it acknowledged or pending): {add:?}"
                ));
            }
        }
        for r in rms {
            if r.invoke < add.invoke {
                errors.push(format!(
                    "history: remove of {elem} invoked before its add: {r:?} / {add:?}"
                ));
            }
        }
    }
    for (key, set) in &state.sets {
        for elem in set {
            if !adds.contains_key(&(key.as_str(), elem.as_str())) {
                errors.push(format!("orset/{key}: {elem} present but never added"));
            }
        }
    }
    if errors.is_empty() {
        Ok(summary)
    } else {
        Err(errors)
    }
}
