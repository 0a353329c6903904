//! Test binary `views`: stream views: windows, seals and finality across membership change, session windows, the
//! model tests against a batch recount, and the attacks on the finality promise.
//!
//! One binary per area (each file is a module): one link and one copy of the dependencies
//! instead of one per file. Tests that measure this process (`memory_soak`, `http_abuse`) or
//! change the host firewall (`cluster_nemesis`) keep binaries of their own.

#[path = "../common/mod.rs"]
mod common;
#[path = "../http_support/mod.rs"]
mod http_support;

mod restore_review;
mod seal_review;
mod settle_review;
mod support;
mod views_attacks;
mod views_basic;
mod views_cluster;
mod views_finality_model;
mod views_lifecycle;
mod views_membership;
mod views_model;
mod views_session;
mod views_trust;
