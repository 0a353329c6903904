//! `tidemark late STREAM`: the stream's late lane on the node at `--url`.

use super::client::{Client, Reply, accept_as, encode_segment};
use super::output::{Output, ms_text, print_table, value_text};
use tidemark::api;

/// Prints one page of `stream`'s late lane (table: id, source/seq, event time, views, reason,
/// received; a contribution a seal left out shows its node, window and value; `--json`: the server's answer as is), then how much the lane keeps and dropped,
/// and the `--after` for the next page when there is one.
///
/// # Errors
/// Transport failures, error answers (a stream no view reads is 404) and replies that do not
/// match the API.
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
    let reply: Reply<api::LatePage> =
        accept_as("GET /v1/streams/{stream}/late", client.get(&path, &query)?)?;
    if out.json {
        crate::outln!("{}", reply.json)?;
        return Ok(());
    }
    let page = reply.value;
    let rows: Vec<Vec<String>> = page
        .events
        .iter()
        .map(|e| {
            let r = &e.record;
            // An event record names the event; a contribution a seal left out names its node,
            // window and value.
            let (what, when, why) = match (&r.event, &r.contribution) {
                (Some(ev), _) => (
                    format!("{}/{}", ev.source, ev.seq),
                    ev.time.as_ref().map_or_else(|| "-".into(), value_text),
                    r.reason.clone(),
                ),
                (None, Some(c)) => (
                    format!(
                        "node {} group {}",
                        r.node,
                        serde_json::Value::Object(c.group.clone())
                    ),
                    match c.window_end {
                        Some(end) => format!("window {}–{}", ms_text(c.window_start), ms_text(end)),
                        None => format!("session cell {}", ms_text(c.window_start)),
                    },
                    format!("{} value {}", r.reason, value_text(&c.value)),
                ),
                (None, None) => ("-".into(), "-".into(), r.reason.clone()),
            };
            vec![
                e.id.to_string(),
                what,
                when,
                r.views.join(","),
                why,
                ms_text(r.received_ms),
            ]
        })
        .collect();
    print_table(
        &[
            "ID",
            "EVENT (SOURCE/SEQ) OR CONTRIBUTION",
            "EVENT TIME OR WINDOW",
            "VIEWS",
            "REASON",
            "RECEIVED",
        ],
        &rows,
    )?;
    crate::outln!(
        "kept {} bytes  dropped {} (oldest first, past limits.late_bytes_max)",
        page.kept_bytes,
        page.dropped
    )?;
    if let Some(next) = page.next {
        crate::outln!("more: --after {next}")?;
    }
    Ok(())
}
