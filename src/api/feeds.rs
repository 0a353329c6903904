//! The change feeds' event data: `GET /v1/watch` (server-sent events `change`, `snapshot`,
//! `snapshot_end`, `reset`) and `GET /v1/views/{view}/final` (SSE `final` and `reset`, or
//! NDJSON lines tagged by `event`).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tidemark_crdts::KeyKind;

/// The data of a watch `change` or `snapshot` event: a key and its new value,
/// `{"key","type","value"}`, or for a value over about 1 MiB of JSON
/// `{"key","type","value_bytes":n,"value_omitted":true}` (read the key for it).
#[derive(Clone, Debug, PartialEq)]
pub struct WatchEntry {
    /// The key's name.
    pub key: String,
    /// The key's type.
    pub kind: KeyKind,
    /// Its value, or that it was left out.
    pub value: WatchValue,
}

/// A [`WatchEntry`]'s value.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchValue {
    /// The value as JSON (`value`).
    Value(serde_json::Value),
    /// Too large to copy into the stream (`value_omitted: true`): `bytes` is its size as JSON
    /// text (`value_bytes`); `GET /v1/keys/{type}/{name}` reads it.
    Omitted {
        /// Its size as JSON text.
        bytes: u64,
    },
}

/// The wire form of a [`WatchEntry`], written.
#[derive(Serialize)]
struct WatchEntryOut<'a> {
    key: &'a str,
    #[serde(rename = "type")]
    kind: KeyKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value_omitted: Option<bool>,
}

/// The wire form of a [`WatchEntry`], read: `value` present (even `null`) or absent.
#[derive(Deserialize)]
struct WatchEntryIn {
    key: String,
    #[serde(rename = "type")]
    kind: KeyKind,
    #[serde(default, deserialize_with = "present")]
    value: Option<serde_json::Value>,
    #[serde(default)]
    value_bytes: Option<u64>,
    #[serde(default)]
    value_omitted: bool,
}

/// A member that is present, whatever its JSON (a `null` value is `Some(Null)`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

impl Serialize for WatchEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (value, value_bytes, value_omitted) = match &self.value {
            WatchValue::Value(v) => (Some(v), None, None),
            WatchValue::Omitted { bytes } => (None, Some(*bytes), Some(true)),
        };
        WatchEntryOut {
            key: &self.key,
            kind: self.kind,
            value,
            value_bytes,
            value_omitted,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for WatchEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = WatchEntryIn::deserialize(d)?;
        let value = match (w.value, w.value_omitted, w.value_bytes) {
            (Some(v), false, None) => WatchValue::Value(v),
            (None, true, Some(bytes)) => WatchValue::Omitted { bytes },
            _ => {
                return Err(D::Error::custom(
                    "a watch entry carries `value`, or `value_omitted: true` with `value_bytes`",
                ));
            }
        };
        Ok(Self {
            key: w.key,
            kind: w.kind,
            value,
        })
    }
}

/// The data of a watch `snapshot_end` event, `{"cursor"}`: the snapshot is complete and the
/// changes after `cursor` follow (also the event's `id`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchSnapshotEnd {
    /// Where the changes after the snapshot start (`RUN-N`).
    pub cursor: String,
}

/// The data of a watch `reset` event, `{"cursor","hint","missed","reason"}`: the cursor asked
/// for could not be honoured without a gap; re-read the keys (or take the snapshot that
/// follows) and go on from `cursor`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchReset {
    /// Where the changes after the reset start.
    pub cursor: String,
    /// What to do now, in words.
    pub hint: String,
    /// Changes skipped, of any key (`behind_retention`); `null` when not known
    /// (`unknown_cursor`).
    pub missed: Option<u64>,
    /// `behind_retention` (the changes after the cursor left the ring) or `unknown_cursor` (a
    /// run or position this node cannot vouch for).
    pub reason: String,
}

/// One final window as the final feed delivers it (SSE `final` data, `id:` its cursor):
/// `{"view","group","window_start","window_end","value","version","cursor"}`, once per window,
/// in window order, only when final (its value never changes after).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinalWindow {
    /// The view.
    pub view: String,
    /// The group: `group_by` field → value (empty for a view without `group_by`).
    pub group: serde_json::Map<String, serde_json::Value>,
    /// Window start (epoch ms).
    pub window_start: u64,
    /// Window end, exclusive (epoch ms).
    pub window_end: u64,
    /// The value, as a view read returns it; the same on every node that reports it final.
    pub value: serde_json::Value,
    /// Always 1 (a final value never changes): an `upsert(key, version, value)` sink ignores
    /// every replay.
    pub version: u64,
    /// This window's cursor (opaque hex): resume after it with `after` or `Last-Event-ID`.
    pub cursor: String,
}

/// The data of a final feed's `reset` event, `{"cursor","hint","reason"}`: windows after the
/// consumer's cursor may have been removed by retention before it read them; the feed goes on
/// with the first window kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalReset {
    /// The position the feed read from (resuming from it loses nothing); `null` for a feed
    /// opened without a cursor.
    pub cursor: Option<String>,
    /// What happened, in words.
    pub hint: String,
    /// Always `behind_retention`.
    pub reason: String,
}

/// One line of the final feed as NDJSON (`Accept: application/x-ndjson`): the SSE event's data
/// with its name in `event` (`{"event":"final",...}` or `{"event":"reset",...}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum FinalFeedLine {
    /// A final window.
    Final(FinalWindow),
    /// Windows may have been missed (see [`FinalReset`]).
    Reset(FinalReset),
}
