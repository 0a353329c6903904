//! Test binary `daemon`: the daemon as its users meet it: `tidemark serve` processes, the HTTP API, the CLI, the web
//! console, watch and final feeds, the late lane, rejoin after restarts, the deployment kit, a
//! rolling upgrade from an earlier build (opt-in: `TIDEMARK_OLD_BIN`, `scripts/rolling-upgrade.sh`).
//!
//! One binary per area (each file is a module): one link and one copy of the dependencies
//! instead of one per file. Tests that measure this process (`memory_soak`, `http_abuse`) or
//! change the host firewall (`cluster_nemesis`) keep binaries of their own.

#[path = "../common/mod.rs"]
mod common;
#[path = "../daemon_support/mod.rs"]
mod daemon_support;
#[path = "../http_support/mod.rs"]
mod http_support;

mod cli_commands;
mod cli_conventions;
mod console_cluster;
mod deploy_kit;
mod feed_metrics;
mod final_feed;
mod final_feed_cluster;
mod http_api;
mod http_commit_metrics;
mod http_console;
mod http_safety;
mod http_views;
mod late_lane;
mod rejoin;
mod rolling_upgrade;
mod snapshot_cli;
mod watch_resume;
