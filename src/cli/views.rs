//! `tidemark views`: the views configured on the node at `--url`, with where each stands.

use super::client::{Client, accept};
use super::output::{Output, print_table, time_text, value_text};

/// Prints every configured view (table: name, stream, kind, window, watermark, cluster
/// watermark, folded, late, rejected, conflicts; `--json`: `GET /v1/views` as is).
///
/// # Errors
/// Transport failures and error answers.
pub fn views(client: &Client, out: &Output) -> anyhow::Result<()> {
    let body = accept(client.get("/v1/views", &[])?)?;
    if out.json {
        crate::outln!("{body}")?;
        return Ok(());
    }
    let views = body["views"].as_array().cloned().unwrap_or_default();
    if views.is_empty() {
        crate::outln!("no views: declare [[views]] in the node's config (API.md, Stream views)")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            let d = &v["definition"];
            let w = &d["window"];
            let window = if w.is_null() {
                "-".to_owned()
            } else if let Some(t) = w["tumbling"].as_str() {
                format!("tumbling {t}")
            } else {
                format!(
                    "hopping {} every {}",
                    value_text(&w["hopping"]["size"]),
                    value_text(&w["hopping"]["every"])
                )
            };
            let conflicts = v["definition_conflicts"].as_array().map_or(0, Vec::len);
            let c = &v["counters"];
            let time = |t: &serde_json::Value| {
                if t.is_null() {
                    "-".to_owned()
                } else {
                    time_text(t)
                }
            };
            vec![
                value_text(&v["name"]),
                value_text(&d["stream"]),
                value_text(&d["kind"]),
                window,
                time(&v["watermark"]),
                time(&v["cluster_watermark"]),
                value_text(&c["folded"]),
                value_text(&c["late"]),
                value_text(&c["rejected"]),
                conflicts.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "VIEW",
            "STREAM",
            "KIND",
            "WINDOW",
            "WATERMARK",
            "CLUSTER WATERMARK",
            "FOLDED",
            "LATE",
            "REJECTED",
            "CONFLICTS",
        ],
        &rows,
    )?;
    Ok(())
}
