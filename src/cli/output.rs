//! Terminal output: aligned tables, or JSON with `--json`.

use serde_json::Value as J;

/// How to print.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    /// JSON instead of tables.
    pub json: bool,
}

/// A JSON value as a table cell: strings bare, everything else as JSON.
pub fn value_text(v: &J) -> String {
    match v {
        J::String(s) => s.clone(),
        J::Null => "null".into(),
        other => other.to_string(),
    }
}

/// Prints `rows` under `headers`, columns aligned.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let parts: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}
