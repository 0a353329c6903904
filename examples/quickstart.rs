//! The README quickstart: open a node, apply ops, read a typed value, shut down.
//!
//! Its data directory is `./quickstart-data`, not the daemon's `./tidemark-data`, so it runs
//! beside a `tidemark serve` started in the same directory.
use std::process::ExitCode;
use tidemark::{Key, KeyKind, Node, NodeConfig, Op, value_to_json};

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart: {e}"); // e.g. "data directory ... is in use by another tidemark process"
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), tidemark::Error> {
    let node = Node::open(NodeConfig::new("./quickstart-data")).await?;
    node.apply(Op::inc_pncounter("stock", 5)).await?; // returns after the durable commit
    node.apply(Op::add("online", "alice")).await?;
    let online = node.get(&Key::new(KeyKind::ORSet, "online"))?; // a typed value
    println!("online = {}", value_to_json(&online)); // ["alice"]
    node.shutdown().await
}
