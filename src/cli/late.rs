//! `tidemark late STREAM`: the stream's late lane on the node at `--url`.

use super::client::{Client, accept, encode_segment};
use super::output::{Output, print_table, time_text, value_text};

/// Prints one page of `stream`'s late lane (table: id, source/seq, event time, views, reason,
/// received; `--json`: the server's answer as is), then how much the lane keeps and dropped,
/// and the `--after` for the next page when there is one.
///
/// # Errors
/// Transport failures and error answers (a stream no view reads is 404).
pub fn late(
    client: &Client,
    out: &Output,
    stream: &str,
    after: Option<u64>,
    limit: Option<u16>,
) -> anyhow::Result<()> {
    let path = format!("/v1/streams/{}/late", encode_segment(stream));
    let mut query: Vec<(&str, String)> = Vec::new();
    if let Some(a) = after {
        query.push(("after", a.to_string()));
    }
    if let Some(l) = limit {
        query.push(("limit", l.to_string()));
    }
    let body = accept(client.get(&path, &query)?)?;
    if out.json {
        crate::outln!("{body}")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = body["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .map(|e| {
                    let r = &e["record"];
                    let ev = &r["event"];
                    let views = r["views"]
                        .as_array()
                        .map(|v| v.iter().map(value_text).collect::<Vec<_>>().join(","))
                        .unwrap_or_default();
                    vec![
                        value_text(&e["id"]),
                        format!("{}/{}", value_text(&ev["source"]), value_text(&ev["seq"])),
                        if ev["time"].is_null() {
                            "-".into()
                        } else {
                            value_text(&ev["time"])
                        },
                        views,
                        value_text(&r["reason"]),
                        time_text(&r["received_ms"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    print_table(
        &[
            "ID",
            "SOURCE/SEQ",
            "EVENT TIME",
            "VIEWS",
            "REASON",
            "RECEIVED",
        ],
        &rows,
    )?;
    crate::outln!(
        "kept {} bytes  dropped {} (oldest first, past limits.late_bytes_max)",
        body["kept_bytes"],
        body["dropped"]
    )?;
    if let Some(next) = body["next"].as_u64() {
        crate::outln!("more: --after {next}")?;
    }
    Ok(())
}
