//! The HTTP API's JSON bodies as types: the one contract the server ([`crate::http`], which
//! serializes them) and the `tidemark` command line (which deserializes them) share, and that
//! an embedded client may use too. Pure serde types: no other module of the crate, no HTTP
//! stack (they are built without the `server` feature).
//!
//! Guarantees:
//! - **One definition per field.** The server builds each reply by naming the fields of these
//!   structs and the CLI reads them by name, so renaming or removing a field is a compile error
//!   on both sides at once, never a reply the CLI silently reads as empty:
//!   ```compile_fail,E0560
//!   // `duplicate` is not a field of the reply: neither side compiles with it.
//!   let reply = tidemark::api::OpsReply { applied: 1, duplicate: 0 };
//!   ```
//! - **The wire form of `API.md`.** Field names, which fields are omitted and which are `null`,
//!   and number versus string forms are those the routes of `API.md` answer with (the unit tests
//!   of this module round-trip each type through a sample of `API.md` and compare the field
//!   names `API.md` lists with the ones each type writes). Fields are declared in the order the
//!   server sends them: the replies that were built as JSON maps carry their keys sorted, so
//!   those structs list their fields alphabetically.
//! - **Free-form JSON only where users put it**: a key's value, a view row's value and group, a
//!   late event as ingested, a condition's `equals` are [`serde_json::Value`]s inside typed
//!   structs; everything the node itself names is a typed field.
//! - **Lenient readers.** Deserializing ignores fields a type does not know (a newer server may
//!   add some); a missing or mistyped field it knows is an error naming the field.

mod cluster;
mod feeds;
mod keys;
mod views;
mod writes;

#[cfg(test)]
mod tests;

pub use cluster::{
    Cluster, ClusterMember, ClusterNode, ClusterPeer, LogBounds, MemberRemoved, SwimMember,
};
pub use feeds::{
    FinalFeedLine, FinalReset, FinalWindow, WatchEntry, WatchReset, WatchSnapshotEnd, WatchValue,
};
pub use keys::{KeyList, KeyValue};
pub use views::{
    FieldEquals, Hopping, IngestedEvent, LateContribution, LateEntry, LatePage, LateRecord,
    ViewCounters, ViewDefinition, ViewPage, ViewRow, ViewSummary, ViewsList, WindowDefinition,
    WriteHistory, WriteSample,
};
pub use writes::{ErrorDetail, ErrorReply, IngestCommitted, IngestReply, OpsReply, ProbeReply};
