//! The README quickstart: open a node, apply ops, read a typed value, shut down.
use tidemark::{Key, KeyKind, Node, NodeConfig, Op, value_to_json};

#[tokio::main]
async fn main() -> Result<(), tidemark::Error> {
    let node = Node::open(NodeConfig::new("./tidemark-data")).await?;
    node.apply(Op::inc_pncounter("stock", 5)).await?; // returns after the durable commit
    node.apply(Op::add("online", "alice")).await?;
    let online = node.get(&Key::new(KeyKind::ORSet, "online"))?; // a typed value
    println!("online = {}", value_to_json(&online)); // ["alice"]
    node.shutdown().await
}
