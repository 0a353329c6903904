//! Helpers shared by the modules of the `views` test binary.

use std::time::{Duration, Instant};
use tidemark::Node;

/// Waits until every node of `nodes` holds the same causal context (they have exchanged every
/// write); fails after 30 s.
pub(crate) async fn converge(nodes: &[&Node]) {
    let started = Instant::now();
    loop {
        let ctxs: Vec<_> = nodes.iter().map(|n| n.context().expect("ctx")).collect();
        if ctxs.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no convergence"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
