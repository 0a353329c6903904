//! Stream views over HTTP: a view's page (`GET /v1/views/{view}`), the views list
//! (`GET /v1/views`), a stream's late lane (`GET /v1/streams/{stream}/late`) and the write-rate
//! history (`GET /v1/stats/writes`).

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;

/// A view's counters on the answering node since it opened (sorted keys, as sent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewCounters {
    /// Remote entries of removed windows dropped on receipt.
    #[serde(default)]
    pub expired_dropped: u64,
    /// Events applied to at least one window.
    pub folded: u64,
    /// Remote cells of another definition of the view (kept apart, never read).
    #[serde(default)]
    pub foreign_cells: u64,
    /// Events refused as late for at least one window.
    pub late: u64,
    /// Events of rejected batches.
    pub rejected: u64,
}

/// One row of a view page: a group's value in one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ViewRow {
    /// The window is sealed on the answering node: its value never changes again, here or on
    /// any node that reports it final.
    #[serde(rename = "final")]
    pub is_final: bool,
    /// The group: `group_by` field → value (empty for a view without `group_by`).
    pub group: serde_json::Map<String, serde_json::Value>,
    /// The value: count/sum a number, distinct/members a sorted array, latest the value.
    pub value: serde_json::Value,
    /// Window end, exclusive (epoch ms; `null` for an unwindowed view).
    pub window_end: Option<u64>,
    /// Window start (epoch ms; `null` for an unwindowed view).
    pub window_start: Option<u64>,
}

/// `GET /v1/views/{view}` answered 200: one page of rows, ordered by window start then group
/// (session views: by group then start), with where the view stands on the answering node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ViewPage {
    /// The watermark every known member passed with its state joined here (`null`: not
    /// known).
    pub cluster_watermark: Option<u64>,
    /// The view's counters.
    pub counters: ViewCounters,
    /// Replicas that announced another definition of the view (no window is final while any
    /// is listed).
    pub definition_conflicts: Vec<String>,
    /// The stream's retention horizon as the node knows it.
    #[serde(default)]
    pub horizon: Option<u64>,
    /// The `after` of the next page; `null` when there are no more rows.
    pub next: Option<String>,
    /// The rows.
    pub rows: Vec<ViewRow>,
    /// The view's name.
    pub view: String,
    /// The node's announced watermark of the view's stream (epoch ms).
    pub watermark: Option<u64>,
}

/// A condition on an event field (`add_when`, `remove_when`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldEquals {
    /// The value (any JSON) the field must equal.
    pub equals: serde_json::Value,
    /// The event field.
    pub field: String,
}

/// Hopping windows: `size` long, one starting every `every`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hopping {
    /// Distance between window starts (`"1m"`).
    pub every: String,
    /// Window length (`"10m"`).
    pub size: String,
}

/// A view's window as configured (durations as written: `"1m"`, `"30s"`); exactly one of
/// `tumbling`, `hopping` and `session` is set. Unset settings are omitted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowDefinition {
    /// Hopping windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hopping: Option<Hopping>,
    /// Idle time after which a node advances its watermark from its clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// How long after a window's end its events are still applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lateness: Option<String>,
    /// How far the watermark trails the greatest event time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_orderness: Option<String>,
    /// How long after its end a window is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<String>,
    /// Session windows with this gap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Tumbling windows of this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tumbling: Option<String>,
}

/// A view's definition as configured (the `[[views]]` table of API.md "Stream views");
/// unset settings are omitted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewDefinition {
    /// `members`: events matching this add the field's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_when: Option<FieldEquals>,
    /// The value field (`sum`, `distinct`, `latest`, `members`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Event fields forming the group (omitted when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_by: Vec<String>,
    /// `count`, `sum`, `distinct`, `latest` or `members`.
    pub kind: String,
    /// How far ahead of the clock an event time may be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_future: Option<String>,
    /// The view's name.
    pub name: String,
    /// `members`: events matching this remove the field's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove_when: Option<FieldEquals>,
    /// The stream it reads.
    pub stream: String,
    /// Its window (omitted for an unwindowed view).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowDefinition>,
}

/// One configured view and where it stands on the answering node (an entry of
/// `GET /v1/views`). Times are epoch ms, `null` until known.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ViewSummary {
    /// The cluster watermark as the node can vouch for it.
    pub cluster_watermark: Option<u64>,
    /// The view's counters.
    pub counters: ViewCounters,
    /// The definition as configured.
    pub definition: ViewDefinition,
    /// Replicas that announced other definitions of the view.
    pub definition_conflicts: Vec<String>,
    /// The stream's retention horizon.
    pub horizon: Option<u64>,
    /// The view's name (its definition's `name`).
    pub name: String,
    /// The node's announced watermark of the stream.
    pub watermark: Option<u64>,
    /// Seconds the node's watermark trails its clock (`null` without a watermark).
    pub watermark_lag_seconds: Option<f64>,
}

/// `GET /v1/views` answered 200: `{"views":[...]}`, in configuration order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ViewsList {
    /// Every configured view.
    pub views: Vec<ViewSummary>,
}

/// A late event as it was ingested: its envelope and every other member it carried. Written
/// with its members sorted by name, envelope included, as the lane keeps the record.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct IngestedEvent {
    /// The producer.
    pub source: String,
    /// The producer's sequence number.
    pub seq: u64,
    /// Its event time as sent (RFC 3339 text or epoch ms); omitted when it had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<serde_json::Value>,
    /// Every other member: `ops` when it carried ops, and the fields views read.
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// One member of an [`IngestedEvent`] as written.
enum Member<'a> {
    Text(&'a str),
    Number(u64),
    Json(&'a serde_json::Value),
}

impl Serialize for Member<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Member::Text(t) => s.serialize_str(t),
            Member::Number(n) => s.serialize_u64(*n),
            Member::Json(v) => v.serialize(s),
        }
    }
}

impl Serialize for IngestedEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut members: BTreeMap<&str, Member<'_>> = self
            .rest
            .iter()
            .map(|(k, v)| (k.as_str(), Member::Json(v)))
            .collect();
        members.insert("source", Member::Text(&self.source));
        members.insert("seq", Member::Number(self.seq));
        if let Some(time) = &self.time {
            members.insert("time", Member::Json(time));
        }
        let mut map = s.serialize_map(Some(members.len()))?;
        for (k, v) in &members {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// One late-lane record: of an event, `{"event","node","reason","received_ms","views",
/// "watermark"}`; of a contribution a seal left out, `{"contribution","node","reason",
/// "received_ms","recorded_by","sealed_members","views","watermark"}` (no `event`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LateRecord {
    /// The event as ingested (absent in a contribution record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<IngestedEvent>,
    /// A replica's contribution to a sealed window that the seal does not count (absent in
    /// an event record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contribution: Option<LateContribution>,
    /// The replica id of the node that took the event (of a contribution: whose it is).
    pub node: String,
    /// `behind_watermark`, `window_removed`, `not_synced`, `outside_seal` or `decommissioned`.
    pub reason: String,
    /// When the node received it, or recorded the contribution (wall clock, epoch ms).
    pub received_ms: u64,
    /// The replica id of the node that recorded a contribution (absent in an event record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_by: Option<String>,
    /// The replicas the seal counts (a contribution record; absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_members: Option<Vec<String>>,
    /// The views it was late for.
    pub views: Vec<String>,
    /// The node's watermark of the stream then (`null`: none yet, or a contribution record).
    pub watermark: Option<u64>,
}

/// A replica's contribution to one cell of a sealed window that the seal leaves out:
/// `{"view","group","window_start","window_end","value","seq"}`. A later record of the same
/// view, window, group and node supersedes it (its value is the contribution in full).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LateContribution {
    /// The view.
    pub view: String,
    /// The cell's group (`group_by` field → value).
    pub group: serde_json::Map<String, serde_json::Value>,
    /// The window's start (epoch ms).
    pub window_start: u64,
    /// The window's end (epoch ms, exclusive).
    pub window_end: Option<u64>,
    /// The contribution's value, as the view shows values (cut when over 16 KiB of JSON:
    /// a list keeps its first elements, any other value is `null`).
    pub value: serde_json::Value,
    /// Present when a list value was cut: how many elements the contribution holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements: Option<u64>,
    /// Present when a value other than a list was left out: its size in bytes of JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_bytes: Option<u64>,
    /// The greatest sequence number of the replica's dots the record covers.
    pub seq: u64,
}

/// One entry of a late-lane page: `{"id","record"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LateEntry {
    /// Its id in the stream's lane on the answering node (ascending, never reused).
    pub id: u64,
    /// The record.
    pub record: LateRecord,
}

/// `GET /v1/streams/{stream}/late` answered 200:
/// `{"stream","events":[{"id","record"}],"next","kept_bytes","dropped"}`, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatePage {
    /// The stream.
    pub stream: String,
    /// Records ascending by id.
    pub events: Vec<LateEntry>,
    /// The `after` of the next page; `null` at the end.
    pub next: Option<u64>,
    /// Bytes of records the lane keeps now.
    pub kept_bytes: u64,
    /// Records dropped, oldest first, to stay within `limits.late_bytes_max`.
    pub dropped: u64,
}

/// The applied-writes counter at one moment (`GET /v1/stats/writes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteSample {
    /// Ops and events applied since the node opened.
    pub applied: u64,
    /// When (wall clock, epoch ms).
    pub at_ms: u64,
}

/// `GET /v1/stats/writes` answered 200: `{"samples":[{"applied","at_ms"}]}`, about one a
/// second over the last ten minutes, oldest first (empty after a restart).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteHistory {
    /// The samples.
    pub samples: Vec<WriteSample>,
}
