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

/// Stdout was closed by its reader (`tidemark list | head -1`): the command stops, and
/// `main` exits 0 without a message (what the reader wanted, it has).
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `text` as is to stdout: the one way the commands print (never `println!`, which
/// panics on a closed pipe). A closed stdout is [`StdoutClosed`]; another failure an error.
pub fn write_out(text: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to stdout")),
    }
}

/// Writes `args` and a newline to stdout ([`write_out`]); see [`outln!`](crate::outln).
pub fn write_line(args: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut text = args.to_string();
    text.push('\n');
    write_out(text.as_bytes())
}

/// Prints `rows` under `headers`, columns aligned.
///
/// # Errors
/// As [`write_out`].
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let parts: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        text.push_str(parts.join("  ").trim_end());
        text.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    write_out(text.as_bytes())
}

/// Epoch milliseconds as RFC 3339 UTC, or `none` when not known.
pub fn opt_ms_text(ms: Option<u64>, none: &str) -> String {
    ms.map_or_else(|| none.to_owned(), ms_text)
}

/// Epoch milliseconds as RFC 3339 UTC (`2026-11-29T10:00:00Z`, with `.mmm` when not whole
/// seconds).
pub fn ms_text(ms: u64) -> String {
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, sec) = (rem / 3600, rem / 60 % 60, rem % 60);
    if millis == 0 {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{sec:02}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{sec:02}.{millis:03}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_rfc3339_utc() {
        assert_eq!(ms_text(0), "1970-01-01T00:00:00Z");
        assert_eq!(ms_text(1_795_946_400_123), "2026-11-29T10:00:00.123Z");
        assert_eq!(ms_text(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(opt_ms_text(None, "null"), "null");
        assert_eq!(opt_ms_text(Some(0), "-"), "1970-01-01T00:00:00Z");
    }
}
