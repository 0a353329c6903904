//! Test binary `net`: the peer network: QUIC with mutual TLS, SWIM membership, sync and snapshots over the network,
//! peers that send garbage.
//!
//! One binary per area (each file is a module): one link and one copy of the dependencies
//! instead of one per file. Tests that measure this process (`memory_soak`, `http_abuse`) or
//! change the host firewall (`cluster_nemesis`) keep binaries of their own.

#[path = "../net_support/mod.rs"]
mod net_support;

mod net_hostile;
mod net_membership;
mod net_sync;
mod net_tls;
mod snapshot_net;
