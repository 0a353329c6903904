//! Jepsen-style harness: a cluster of `tidemark serve` processes, nftables partitions, kill -9,
//! SIGSTOP, client tasks recording a history, and the offline checker.
#![allow(dead_code)]

pub mod client;
pub mod cluster;
pub mod history;
pub mod nft;
pub mod run;
