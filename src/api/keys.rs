//! Key reads and listings (`GET /v1/keys/{type}/{name}`, `GET /v1/keys`).

use serde::{Deserialize, Serialize};
use tidemark_crdts::KeyKind;

/// One key and its value: `{"key","type","value"}` (`GET /v1/keys/{type}/{name}`, each entry
/// of `GET /v1/keys`, and the data of a watch's `change` and `snapshot` events whose value is
/// sent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyValue {
    /// The key's name.
    pub key: String,
    /// The key's type (`gcounter`, `pncounter`, `orset`, `lww`, `mvreg`).
    #[serde(rename = "type")]
    pub kind: KeyKind,
    /// The value as JSON (API.md "Keys and values": a number, a sorted array, any JSON value
    /// or `null`).
    pub value: serde_json::Value,
}

/// `GET /v1/keys` answered 200: `{"keys":[...],"next":...}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyList {
    /// At most `limit` keys, ordered by type then name.
    pub keys: Vec<KeyValue>,
    /// The `after` of the next page (`type/name`); `null` on the last page.
    pub next: Option<String>,
}
