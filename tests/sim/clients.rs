//! Client writes: one commit group through `commit_local`, acknowledged only once it returned
//! `Ok` after a sync; what an acknowledged (or crash-kept) group records (oracle, issued dots,
//! the issuer's acknowledged max seq); events retried after convergence.

use super::Backend;
use super::harness::Sim;
use super::workload::is_invalid;
use rand::Rng;
use tidemark::codec;
use tidemark::proto::StateStore;
use tidemark::store::{LocalWrite, StoreError};
use tidemark_crdts::{CausalContext, Dot, Key, Mutation};

impl Sim {
    /// The `Write` action on node `i`: the backend's workload draws a commit group and commits it.
    pub fn write(&mut self, i: usize) {
        let (writes, invalid) = match self.backend {
            Backend::Memory => self.memory_group(),
            Backend::Recording => self.recording_group(),
        };
        let is_event = writes.iter().any(|w| w.event.is_some());
        if self.commit(i, writes, invalid) == Some(true) && is_event {
            self.counts.events += 1;
        }
    }

    /// Commits `writes` as one group on node `i`; `invalid` when the workload put an op in it
    /// that must be refused. `None` when the node is down or the group was refused;
    /// `Some(false)` when every write was a duplicate event (a no-op); `Some(true)` when it was
    /// applied and acknowledged.
    pub fn commit(&mut self, i: usize, writes: Vec<LocalWrite>, invalid: bool) -> Option<bool> {
        if !self.running(i) {
            self.counts.writes_while_down += 1;
            return None;
        }
        let seed = self.seed;
        let now = self.now_of(i);
        let before = self.nodes[i].store.ctx().clone();
        let log_before = self.nodes[i].backend.log_len();
        let syncs_before = self.nodes[i].backend.syncs();
        match self.nodes[i].store.commit_local(&writes, now.wall_ms) {
            Ok(commit) if commit.log_seq.is_some() => {
                assert!(
                    !invalid,
                    "seed {seed}: node {i}: an invalid group committed"
                );
                // Acknowledged only once durable (Immediate durability).
                assert!(
                    self.nodes[i].backend.syncs() > syncs_before,
                    "seed {seed}: node {i}: commit_local returned without a sync"
                );
                self.log(|| format!("node {i} commit {writes:?}"));
                self.nodes[i].replica.handle_local_commit(now);
                self.record_commit(i, &before, &writes, commit.log_seq);
                self.after_input(i);
                Some(true)
            }
            Ok(_) => {
                assert!(
                    writes.iter().all(|w| w.event.is_some()),
                    "seed {seed}: node {i}: a write without an event id was skipped"
                );
                assert_eq!(
                    self.nodes[i].store.ctx(),
                    &before,
                    "seed {seed}: node {i}: a duplicate event changed the context"
                );
                self.counts.duplicate_events += 1;
                Some(false)
            }
            Err(StoreError::InvalidOp(_)) if invalid => {
                let node = &self.nodes[i];
                assert!(
                    node.store.halted().is_none(),
                    "seed {seed}: node {i}: an invalid op halted the store"
                );
                assert_eq!(
                    node.store.ctx(),
                    &before,
                    "seed {seed}: node {i}: a refused group changed the context"
                );
                assert_eq!(
                    node.backend.log_len(),
                    log_before,
                    "seed {seed}: node {i}: a refused group wrote"
                );
                self.counts.ops_refused_invalid += 1;
                None
            }
            Err(e) => panic!("seed {seed}: node {i}: commit_local failed: {e}"),
        }
    }

    /// Records an acknowledged (or kept) commit group of node `i` whose store's context was
    /// `before`: oracle, issued dots, acknowledged max seq, events, trace.
    pub fn record_commit(
        &mut self,
        i: usize,
        before: &CausalContext,
        writes: &[LocalWrite],
        log_seq: Option<u64>,
    ) {
        let seed = self.seed;
        let ops: Vec<(Key, Mutation)> = writes.iter().flat_map(|w| w.ops.clone()).collect();
        let node = &mut self.nodes[i];
        let me = node.id;
        let base = before.max_seq(me);
        assert_eq!(
            node.store.ctx().max_seq(me),
            base + ops.len() as u64,
            "seed {seed}: node {i}: a commit group must take the next contiguous dots"
        );
        // Exactly those dots, under the store's current id: never one of an earlier id (a
        // restored snapshot's source, this node before a restore or a wipe).
        let gained = node.store.ctx().diff(before);
        assert!(
            gained == CausalContext::from_range(me, base + 1, base + ops.len() as u64)
                && !self.restores.retired_ids.contains(&me)
                && node.store.replica() == me,
            "seed {seed}: node {i} ({me:?}): a commit took dots {:?} (retired ids {:?})",
            gained.iter_dots().take(8).collect::<Vec<_>>(),
            self.restores.retired_ids
        );
        let log_seq = log_seq.expect("a non-empty group is logged");
        if node.store.log_bounds().1 > log_seq + 1 {
            self.counts.split_commits += 1;
        }
        let delta = node
            .store
            .log_interval(log_seq, None, usize::MAX)
            .expect("read the group's log entry")
            .delta
            .expect("the group's log entry");
        node.acked_max_seq = node.acked_max_seq.max(base + ops.len() as u64);
        // Happens-before: what the harness delivered to the node, not what its context claims.
        self.oracle
            .record_batch(me, before, &self.nodes[i].delivered, &ops, &delta);
        for (k, (key, m)) in ops.iter().enumerate() {
            self.issue(Dot::new(me, base + 1 + k as u64), key, m);
        }
        for d in delta.context().iter_dots().filter(|d| d.replica == me) {
            self.nodes[i].delivered.insert(d);
        }
        if self.measure {
            self.delta_bytes += codec::encoded_len("delta", &delta).expect("encodable") as u64;
        }
        let mut first = base + 1;
        for w in writes {
            if let Some(ev) = &w.event {
                self.events
                    .push((ev.clone(), w.ops.clone(), Dot::new(me, first)));
            }
            first += w.ops.len() as u64;
        }
        self.counts.ops_acked += ops.len() as u64;
        if self.restores.restored_ids.contains(&me) {
            self.counts.restored_ops_acked += ops.len() as u64;
        }
        self.mix(&codec::encode("delta", &delta).expect("encodable"));
    }

    /// A client write of `ops` on node `i` (no event id), for the measuring runs.
    #[allow(dead_code)] // the measuring runs are in `tests/sim.rs`
    pub fn client_write(&mut self, i: usize, ops: Vec<(Key, Mutation)>) -> bool {
        let invalid = ops.iter().any(|(k, m)| is_invalid(k, m));
        let write = LocalWrite {
            ops,
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        self.commit(i, vec![write], invalid) == Some(true)
    }

    /// After convergence, retries every acknowledged event whose ops survived at a random node:
    /// each must be a duplicate (dedup marks replicated with the state) and change nothing.
    pub fn retry_events(&mut self) {
        let events = std::mem::take(&mut self.events);
        for (ev, ops, first) in &events {
            if self.oracle.is_lost(first) {
                continue;
            }
            let i = self.rng.random_range(0..self.n());
            let write = LocalWrite {
                ops: ops.clone(),
                event: Some(ev.clone()),
                stamps: Vec::new(),
                late: None,
                own_dots: false,
            };
            let got = self.commit(i, vec![write], false);
            assert_eq!(
                got,
                Some(false),
                "seed {}: node {i}: retrying event {ev:?} after convergence was not a no-op",
                self.seed
            );
        }
        self.events = events;
    }
}
