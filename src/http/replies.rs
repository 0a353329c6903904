//! The node's and the views' own types turned into the API's reply types ([`crate::api`]),
//! field by field: a field renamed on either side stops this file compiling, never changes a
//! reply silently.

use super::error::ApiError;
use crate::api;
use crate::ops::value_to_json;
use crate::views;
use axum::http::StatusCode;
use tidemark_crdts::{Key, Value};

/// A key and its value (`{"key","type","value"}`).
pub(super) fn key_value(key: &Key, value: &Value) -> api::KeyValue {
    api::KeyValue {
        key: key.name.clone(),
        kind: key.kind,
        value: value_to_json(value),
    }
}

/// A view's counters.
pub(super) fn counters(c: views::ViewCounters) -> api::ViewCounters {
    let views::ViewCounters {
        folded,
        late,
        rejected,
        expired_dropped,
        foreign_cells,
    } = c;
    api::ViewCounters {
        expired_dropped,
        folded,
        foreign_cells,
        late,
        rejected,
    }
}

/// A page of `view`'s rows.
pub(super) fn view_page(view: String, page: views::ViewPage) -> api::ViewPage {
    let views::ViewPage {
        rows,
        next,
        counters: c,
        watermark,
        cluster_watermark,
        definition_conflicts,
        horizon,
    } = page;
    api::ViewPage {
        cluster_watermark,
        counters: counters(c),
        definition_conflicts,
        horizon,
        next,
        rows: rows
            .into_iter()
            .map(|r| api::ViewRow {
                is_final: r.is_final,
                group: r.group,
                value: r.value,
                window_end: r.window_end,
                window_start: r.window_start,
            })
            .collect(),
        view,
        watermark,
    }
}

fn field_equals(f: views::FieldEquals) -> api::FieldEquals {
    api::FieldEquals {
        equals: f.equals,
        field: f.field,
    }
}

/// A view's definition as configured.
fn view_definition(d: views::ViewDef) -> api::ViewDefinition {
    let views::ViewDef {
        name,
        stream,
        kind,
        group_by,
        field,
        add_when,
        remove_when,
        window,
        max_future,
    } = d;
    let kind = match kind {
        views::ViewKind::Count => "count",
        views::ViewKind::Sum => "sum",
        views::ViewKind::Distinct => "distinct",
        views::ViewKind::Latest => "latest",
        views::ViewKind::Members => "members",
    };
    api::ViewDefinition {
        add_when: add_when.map(field_equals),
        field,
        group_by,
        kind: kind.to_owned(),
        max_future,
        name,
        remove_when: remove_when.map(field_equals),
        stream,
        window: window.map(|w| {
            let views::WindowDef {
                tumbling,
                hopping,
                session,
                lateness,
                retention,
                out_of_orderness,
                idle_timeout,
            } = w;
            api::WindowDefinition {
                hopping: hopping.map(|h| api::Hopping {
                    every: h.every,
                    size: h.size,
                }),
                idle_timeout,
                lateness,
                out_of_orderness,
                retention,
                session,
                tumbling,
            }
        }),
    }
}

/// One configured view and where it stands, its watermark's lag measured at `now_ms`.
pub(super) fn view_summary(v: views::ViewSummary, now_ms: u64) -> api::ViewSummary {
    let views::ViewSummary {
        definition,
        counters: c,
        watermark,
        cluster_watermark,
        definition_conflicts,
        horizon,
    } = v;
    api::ViewSummary {
        cluster_watermark,
        counters: counters(c),
        name: definition.name.clone(),
        definition: view_definition(definition),
        definition_conflicts,
        horizon,
        watermark,
        watermark_lag_seconds: watermark.map(|w| now_ms.saturating_sub(w) as f64 / 1000.0),
    }
}

/// One final window as the feed delivers it.
pub(super) fn final_window(w: views::FinalWindow) -> api::FinalWindow {
    let views::FinalWindow {
        view,
        group,
        window_start,
        window_end,
        value,
        version,
        cursor,
    } = w;
    api::FinalWindow {
        view,
        group,
        window_start,
        window_end,
        value,
        version,
        cursor,
    }
}

/// A late-lane page. Each record is kept as the JSON the views wrote
/// (`Views::late_note` in `src/views/mod.rs`); one that does not read as an [`api::LateRecord`] is a 500
/// naming it, never a page with a record left out.
pub(super) fn late_page(page: views::LateEvents) -> Result<api::LatePage, ApiError> {
    let views::LateEvents {
        stream,
        events,
        next,
        kept_bytes,
        dropped,
    } = page;
    let events = events
        .into_iter()
        .map(|e| {
            let id = e.id;
            serde_json::from_value(e.record)
                .map(|record| api::LateEntry { id, record })
                .map_err(|err| {
                    ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        format!(
                            "late-lane record {id} of stream {stream:?} is not in the API's \
                             shape: {err}"
                        ),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(api::LatePage {
        stream,
        events,
        next,
        kept_bytes,
        dropped,
    })
}

/// The applied-writes history.
pub(super) fn write_history(samples: Vec<crate::metrics::WriteSample>) -> api::WriteHistory {
    api::WriteHistory {
        samples: samples
            .into_iter()
            .map(|s| api::WriteSample {
                applied: s.applied,
                at_ms: s.at_ms,
            })
            .collect(),
    }
}

/// One member as SWIM sees it.
pub(super) fn swim_member(m: &crate::net::MemberStatus) -> api::SwimMember {
    api::SwimMember {
        addr: m.addr.to_string(),
        epoch: m.epoch,
        incarnation: m.incarnation,
        last_contact_ms: m.last_contact_ms,
        left: m.left,
        name: m.name.clone(),
        replica: m.replica.clone(),
        state: match m.state {
            crate::net::MemberState::Alive => "alive",
            crate::net::MemberState::Suspect => "suspect",
            crate::net::MemberState::Down => "down",
        }
        .to_owned(),
        version: m.version.clone(),
    }
}

/// A count as the API's `u64` (a `usize` always fits on the targets the node builds for).
pub(super) fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// `value` as JSON text for an event stream's data; a type that fails to serialize (none of
/// the API's can) is logged and sent as `null`.
pub(super) fn json_text(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        tracing::error!(error = %e, "encoding a stream event failed");
        "null".to_owned()
    })
}
