//! `tidemark views`: the views configured on the node at `--url`, with where each stands.

use super::client::{Client, Reply, accept_as};
use super::output::{Output, opt_ms_text, print_table};
use tidemark::api;

/// A view's window in a few words (`tumbling 1m`, `hopping 10m every 1m`, `session 30m`; `-`
/// for an unwindowed view).
fn window_text(window: Option<&api::WindowDefinition>) -> String {
    let Some(w) = window else {
        return "-".to_owned();
    };
    if let Some(t) = &w.tumbling {
        format!("tumbling {t}")
    } else if let Some(h) = &w.hopping {
        format!("hopping {} every {}", h.size, h.every)
    } else if let Some(gap) = &w.session {
        format!("session {gap}")
    } else {
        "-".to_owned()
    }
}

/// Prints every configured view (table: name, stream, kind, window, watermark, cluster
/// watermark, folded, late, rejected, conflicts; `--json`: `GET /v1/views` as is).
///
/// # Errors
/// Transport failures, error answers and replies that do not match the API.
pub fn views(client: &Client, out: &Output) -> anyhow::Result<()> {
    let reply: Reply<api::ViewsList> = accept_as("GET /v1/views", client.get("/v1/views", &[])?)?;
    if out.json {
        crate::outln!("{}", reply.json)?;
        return Ok(());
    }
    let views = reply.value.views;
    if views.is_empty() {
        crate::outln!("no views: declare [[views]] in the node's config (API.md, Stream views)")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            let d = &v.definition;
            let c = &v.counters;
            vec![
                v.name.clone(),
                d.stream.clone(),
                d.kind.clone(),
                window_text(d.window.as_ref()),
                opt_ms_text(v.watermark, "-"),
                opt_ms_text(v.cluster_watermark, "-"),
                c.folded.to_string(),
                c.late.to_string(),
                c.rejected.to_string(),
                v.definition_conflicts.len().to_string(),
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
