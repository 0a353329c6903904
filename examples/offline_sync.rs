//! Two embedded nodes write while "offline", connect, and converge.
//!
//! Run: `cargo run --example offline_sync`
use std::time::Duration;
use tidemark::{Key, KeyKind, Node, NodeConfig, Op, value_to_json};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("tidemark-offline-sync-{}", std::process::id()));
    let laptop = Node::open(NodeConfig::new(dir.join("laptop"))).await?;
    let phone = Node::open(NodeConfig::new(dir.join("phone"))).await?;

    // Offline: each device writes on its own.
    laptop
        .apply_batch(vec![
            Op::inc_gcounter("visits", 3),
            Op::add("tags", "work"),
            Op::add("tags", "urgent"),
            Op::set_lww("title", "Quarterly plan (laptop)"),
            Op::set_mvreg("draft", "laptop edit"),
        ])
        .await?;
    phone
        .apply_batch(vec![
            Op::inc_gcounter("visits", 2),
            Op::add("tags", "mobile"),
            Op::set_mvreg("draft", "phone edit"),
        ])
        .await?;
    // The phone removes a tag it has seen: only its own observation, so the laptop's
    // concurrent add of the same tag would survive (add-wins).
    phone.apply(Op::remove("tags", "mobile")).await?;
    phone
        .apply(Op::set_lww("title", "Quarterly plan (phone, later)"))
        .await?;

    println!("before sync:");
    show(&laptop, "laptop")?;
    show(&phone, "phone")?;

    // Back online: connect and let anti-entropy run until both hold the same causal context.
    laptop.connect(&phone)?;
    let started = std::time::Instant::now();
    while laptop.context()? != phone.context()? {
        if started.elapsed() > Duration::from_secs(30) {
            return Err("nodes did not converge within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("after sync ({} ms):", started.elapsed().as_millis());
    show(&laptop, "laptop")?;
    show(&phone, "phone")?;

    for (kind, name) in [
        (KeyKind::GCounter, "visits"),
        (KeyKind::ORSet, "tags"),
        (KeyKind::Lww, "title"),
        (KeyKind::MvReg, "draft"),
    ] {
        let key = Key::new(kind, name);
        if laptop.get(&key)? != phone.get(&key)? {
            return Err(format!("{key} differs after sync").into());
        }
    }
    println!("converged: every key equal on both nodes");
    laptop.shutdown().await?;
    phone.shutdown().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn show(node: &Node, name: &str) -> Result<(), tidemark::Error> {
    let get = |kind, key: &str| node.get(&Key::new(kind, key)).map(|v| value_to_json(&v));
    println!(
        "  {name:7} visits={} tags={} title={} draft={}",
        get(KeyKind::GCounter, "visits")?,
        get(KeyKind::ORSet, "tags")?,
        get(KeyKind::Lww, "title")?,
        get(KeyKind::MvReg, "draft")?,
    );
    Ok(())
}
