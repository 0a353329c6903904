//! The invariants: after every input a node completed (`check_node`), and once the cluster
//! converged (`check_converged`).

use super::Backend;
use super::crash::committed;
use super::harness::{Sim, durable_mark, entries, value};
use crate::common::{ImageKind, crash_image};
use tidemark::proto::{PeerId, StateStore};
use tidemark_crdts::{CausalContext, DotStore, Entry};

/// Backend log records kept before a checkpoint folds them into one image.
const CHECKPOINT_RECORDS: usize = 512;

impl Sim {
    /// Invariants of node `i` after an input it completed.
    pub fn check_node(&mut self, i: usize) {
        let seed = self.seed;
        let n = self.n();
        let node = &mut self.nodes[i];
        // Immediate durability (invariants 6, 7): whatever an input committed was synced before
        // the input returned (before any ack or client acknowledgement left). (redb may still
        // write afterwards: its post-commit epilogue is a non-durable commit whose pages reach
        // the file later; crash images cover that.)
        let last = &node.last_mark;
        let unchanged = node.store.log_bounds() == last.0
            && (0..n).all(|j| node.store.peer_cursor(PeerId(j as u64)) == last.2[j])
            && *node.store.ctx() == last.1;
        let syncs = node.backend.syncs();
        assert!(
            unchanged || syncs > node.last_syncs,
            "seed {seed}: node {i}: an input committed without a sync"
        );
        if !unchanged {
            node.last_mark = durable_mark(&node.store, n);
        }
        // Without a sync and with the mark unchanged the input committed nothing: the store is
        // the one `verify` last passed.
        let committed = syncs > node.last_syncs || !unchanged;
        node.last_syncs = syncs;
        if committed && self.verify_inputs {
            node.store
                .verify()
                .unwrap_or_else(|e| panic!("seed {seed}: node {i}: verify: {e}"));
        }
        self.check_state(i, false);
    }

    /// The state-wide invariants of node `i` (G7): they run only when its state changed since
    /// they last ran (every state change is logged) or when `force`d.
    pub fn check_state(&mut self, i: usize, force: bool) {
        let seed = self.seed;
        let node = &mut self.nodes[i];
        let me = node.id;
        let end = node.store.log_bounds().1;
        if !force && node.checked_at == Some(end) {
            return;
        }
        node.checked_at = Some(end);
        let ctx = node.store.ctx();
        assert!(
            node.last_ctx.is_subset(ctx),
            "seed {seed}: node {i}: the context shrank"
        );
        assert!(
            ctx.own_dots_contiguous(me),
            "seed {seed}: node {i}: own dots are not contiguous"
        );
        let entries = entries(&node.store);
        let mut live = CausalContext::new();
        for (key, entry) in &entries {
            let mut in_ctx = true;
            entry.for_each_dot(&mut |d| {
                in_ctx &= ctx.contains(&d);
                live.insert(d);
            });
            assert!(
                in_ctx,
                "seed {seed}: node {i}: {key} holds a dot outside the context"
            );
            // A causal counter holds at most one live dot per replica (its running total).
            let mut replicas = Vec::new();
            match entry {
                Entry::GCounter(f) => replicas.extend(f.iter().map(|(d, _)| d.replica)),
                Entry::PNCounter(f) => replicas.extend(f.iter().map(|(d, _)| d.replica)),
                _ => {}
            }
            let k = replicas.len();
            replicas.dedup();
            assert_eq!(
                replicas.len(),
                k,
                "seed {seed}: node {i}: {key} holds two live dots of one replica: {entry:?}"
            );
        }
        let hlc = node.store.hlc_mark();
        assert!(
            hlc >= node.last_hlc,
            "seed {seed}: node {i}: the HLC went back"
        );
        node.last_hlc = hlc;
        if node.last_ctx != *node.store.ctx() {
            node.last_ctx = node.store.ctx().clone();
        }
        let contexts: Vec<&CausalContext> = self.nodes.iter().map(|n| n.store.ctx()).collect();
        if let Some(op) = self.oracle.unwitnessed_retirement(
            &self.nodes[i].delivered,
            &live,
            contexts.into_iter(),
        ) {
            panic!(
                "seed {seed}: node {i}: {:?} {:?} on {} was retired, but no node holds a dot \
                 that retired it (an effect whose dot is in no context)",
                op.dot, op.mutation, op.key
            );
        }
    }

    /// Folds a long recording into one image (the recording backend only records).
    pub fn checkpoint(&mut self, i: usize) {
        let backend = &self.nodes[i].backend;
        if backend.log_len() > CHECKPOINT_RECORDS && backend.checkpoint() {
            self.counts.checkpoints += 1;
        }
    }

    /// Every check of a converged cluster.
    pub fn check_converged(&mut self) {
        let seed = self.seed;
        let n = self.n();
        // Identical canonical bytes everywhere.
        let bytes0 =
            tidemark::codec::encode("state", &super::harness::state(&mut self.nodes[0].store))
                .expect("encodes");
        for i in 1..n {
            let bytes =
                tidemark::codec::encode("state", &super::harness::state(&mut self.nodes[i].store))
                    .expect("encodes");
            assert!(bytes == bytes0, "seed {seed}: node {i} differs from node 0");
        }
        // Every store: consistent, no surviving acknowledged dot missing, only issued dots with
        // their content, durable, its retained log readable.
        for i in 0..n {
            let node = &mut self.nodes[i];
            node.store
                .verify()
                .unwrap_or_else(|e| panic!("seed {seed}: node {i}: final verify: {e}"));
            assert!(
                node.store.check_integrity().expect("integrity check runs"),
                "seed {seed}: node {i}: final integrity check failed"
            );
            for (j, other) in self.nodes.iter().enumerate() {
                assert!(
                    self.nodes[i].store.ctx().max_seq(other.id) >= other.acked_max_seq,
                    "seed {seed}: node {i} lacks acknowledged dots of node {j}"
                );
            }
            // Every acknowledged (or kept) op no restore or wipe lost is held, under any id.
            let missing = self.dots.surviving().diff(self.nodes[i].store.ctx());
            assert!(
                missing.is_empty(),
                "seed {seed}: node {i} lacks surviving acknowledged dots {:?}",
                missing.iter_dots().take(8).collect::<Vec<_>>()
            );
            self.check_store(i, &format!("node {i} after convergence"));
            // The converged state is durable.
            let what = format!("node {i}: durable image after convergence");
            let image = match self.backend {
                Backend::Memory => self.nodes[i].backend.live(),
                Backend::Recording => {
                    let log = self.nodes[i].backend.log();
                    crash_image(&log, log.len(), ImageKind::DurableOnly, &mut self.rng)
                }
            };
            let (_, mut store) = self.reopen(i, image, &what);
            assert!(
                committed(&mut store, n) == committed(&mut self.nodes[i].store, n),
                "seed {seed}: {what}: differs from the live store"
            );
            // Every retained log record is readable.
            let store = &mut self.nodes[i].store;
            let start = store.log_bounds().0;
            if let Err(e) = store.log_interval(start, None, usize::MAX) {
                panic!("seed {seed}: node {i}: the log does not read back: {e}");
            }
        }
        // Equal to the oracle over the acknowledged, not-lost ops.
        let store = &self.nodes[0].store;
        let stored = entries(store);
        let mut keys = self.oracle.keys();
        keys.extend(stored.keys().cloned());
        for key in keys {
            let expected = self.oracle.expected(&key);
            let actual = value(store, &key);
            if actual != expected {
                eprintln!(
                    "seed {seed}: key {key}: stored entry {:?}",
                    stored.get(&key)
                );
                for op in self.oracle.ops.iter().filter(|o| o.key == key) {
                    eprintln!(
                        "  op {:?} {:?} lost={} ts={:?}",
                        op.dot, op.mutation, op.lost, op.ts
                    );
                }
            }
            assert_eq!(
                actual,
                expected,
                "seed {seed}: key {key} differs from the oracle ({})",
                match key.kind {
                    tidemark_crdts::KeyKind::GCounter | tidemark_crdts::KeyKind::PNCounter =>
                        "a counter is the sum of the surviving acknowledged ops",
                    tidemark_crdts::KeyKind::ORSet =>
                        "a set holds the acknowledged adds no acknowledged remove/delete observed",
                    _ => "a register holds the writes no acknowledged write/delete observed",
                }
            );
        }
        // Dedup marks replicate with the state: a retried event is a no-op at every node.
        self.retry_events();
    }

    /// Logs drain (pitfalls "one dead peer pins the log", "BP drain"): once every peer
    /// acknowledged everything, each node's stable frontier reaches its log end and the whole
    /// log is truncated. Only meaningful where compaction keeps nothing back (`log_retain` 0).
    pub fn check_logs_drain(&mut self) {
        let seed = self.seed;
        let drain_deadline = self.now + 10_000;
        while self.now < drain_deadline && self.nodes.iter().any(|n| n.store.log_len() > 0) {
            let next = self.now + 100;
            self.run_until(next);
        }
        for (i, n) in self.nodes.iter().enumerate() {
            assert_eq!(
                n.store.log_len(),
                0,
                "seed {seed}: node {i}'s log did not drain (bounds {:?}, frontier {:?})",
                n.store.log_bounds(),
                n.replica.stable_frontier()
            );
        }
    }
}
