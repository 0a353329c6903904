//! Three embedded nodes in one program syncing over real QUIC on loopback with mutual TLS:
//! they write concurrently, one is cut off by a partition and keeps writing offline, the
//! partition heals, and every node ends with the same values.
//!
//! Run: `cargo run --example network_sync`

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tidemark::net::{ClusterCa, Faults, NetOptions};
use tidemark::{Key, KeyKind, Node, NodeConfig, Op};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = tempfile::tempdir()?;
    // One cluster CA; each node gets a certificate naming it (`tidemark certs` does the same).
    let ca = ClusterCa::generate()?;
    let mut nodes = Vec::new();
    let mut addrs = Vec::new();
    let mut faults = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        let node = Node::open(NodeConfig::new(root.path().join(name))).await?;
        // Fault injection is only here to simulate the partition below.
        let f = Faults::new(1);
        let mut opts = NetOptions::new(node.config().limits.frame_bytes_max);
        opts.faults = Some(f.clone());
        opts.idle_timeout = Duration::from_secs(1);
        opts.keep_alive = Duration::from_millis(200);
        opts.redial_max = Duration::from_millis(300);
        let addr = node
            .listen_with(SocketAddr::from(([127, 0, 0, 1], 0)), ca.issue(name)?, opts)
            .await?;
        println!("{name} listens on {addr}");
        nodes.push(node);
        addrs.push(addr);
        faults.push(f);
    }
    for (i, node) in nodes.iter().enumerate() {
        for (j, addr) in addrs.iter().enumerate() {
            if i != j {
                node.join_peer(*addr)?;
            }
        }
    }

    // Concurrent writes on every node.
    let mut tasks = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..10 {
                node.apply_batch(vec![
                    Op::inc_gcounter("page-views", 1),
                    Op::add("visitors", format!("user-{i}-{k}")),
                ])
                .await?;
            }
            Ok::<_, tidemark::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    wait_converged(&nodes).await;
    println!("converged after concurrent writes: {}", summary(&nodes[0])?);

    // Partition gamma from the others; both sides keep writing (offline-first).
    for i in 0..2 {
        faults[i].block(addrs[2]);
        faults[2].block(addrs[i]);
    }
    nodes[0].apply(Op::inc_gcounter("page-views", 5)).await?;
    nodes[2].apply(Op::add("visitors", "offline-user")).await?;
    nodes[2]
        .apply(Op::set_lww("status", "written while partitioned"))
        .await?;
    // Long enough for the connections to time out: the heal below needs a redial.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    println!("during the partition, alpha: {}", summary(&nodes[0])?);
    println!("during the partition, gamma: {}", summary(&nodes[2])?);

    for f in &faults {
        f.heal();
    }
    let healed = Instant::now();
    wait_converged(&nodes).await;
    println!("healed; converged in {:?}", healed.elapsed());
    for (name, node) in ["alpha", "beta", "gamma"].iter().zip(&nodes) {
        println!("{name}: {}", summary(node)?);
    }
    for node in &nodes {
        node.shutdown().await?;
    }
    Ok(())
}

fn summary(node: &Node) -> Result<String, tidemark::Error> {
    let views = node.get(&Key::new(KeyKind::GCounter, "page-views"))?;
    let visitors = match node.get(&Key::new(KeyKind::ORSet, "visitors"))? {
        tidemark::Value::ORSet(s) => s.len(),
        _ => 0,
    };
    let status = node.get(&Key::new(KeyKind::Lww, "status"))?;
    Ok(format!(
        "page-views={} visitors={visitors} status={}",
        tidemark::value_to_json(&views),
        tidemark::value_to_json(&status)
    ))
}

async fn wait_converged(nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ctxs: Vec<_> = nodes.iter().filter_map(|n| n.context().ok()).collect();
        if ctxs.len() == nodes.len() && ctxs.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        if Instant::now() > deadline {
            eprintln!("no convergence within 30 s");
            std::process::exit(1);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
