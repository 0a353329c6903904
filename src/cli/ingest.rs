//! `tidemark ingest --stream S FILE|-`: NDJSON events sent in chunks, 429 retried with backoff,
//! rejected lines skipped and reported, a progress bar on a terminal.

use super::client::{Client, Rejected, accept_as};
use super::output::Output;
use anyhow::{Context, bail};
use serde_json::{Value as J, json};
use std::io::{BufRead, IsTerminal, Read};
use std::time::{Duration, Instant};
use tidemark::api;

/// Lines per request.
const CHUNK_LINES: usize = 1000;
/// Bytes per request (a chunk ends at the first line boundary past it).
const CHUNK_BYTES: usize = 1024 * 1024;
/// Give up after this many consecutive 429 answers.
const BUSY_RETRIES_MAX: u32 = 60;

#[derive(Default)]
struct Summary {
    accepted: u64,
    duplicates: u64,
    late: u64,
    rejected: Vec<(u64, String)>,
    lines: u64,
    bytes: u64,
}

impl Summary {
    /// Counts events the node committed (a whole request's or, before an error, some of it).
    fn add(&mut self, accepted: u64, duplicates: u64, late: u64) {
        self.accepted += accepted;
        self.duplicates += duplicates;
        self.late += late;
    }
}

/// The line number an error's `at` names (`line 7, field seq` → 7).
fn line_of(at: Option<&str>) -> Option<usize> {
    let rest = at?.strip_prefix("line ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Rewrites the `line N` an error's `at` starts with to `line {abs}`.
fn renumber(rejected: &mut Rejected, line: usize, abs: u64) {
    let Some(at) = rejected.reply.as_mut().and_then(|r| r.error.at.as_mut()) else {
        return;
    };
    let renumbered = at.strip_prefix(&format!("line {line}")).and_then(|rest| {
        (!rest.starts_with(|c: char| c.is_ascii_digit())).then(|| format!("line {abs}{rest}"))
    });
    if let Some(text) = renumbered {
        *at = text;
    }
}

/// Sends one chunk of `(line number, line)` until everything in it is committed or rejected.
fn send_chunk(
    client: &Client,
    path: &str,
    mut pending: Vec<(u64, Vec<u8>)>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let mut backoff = Duration::from_millis(100);
    let mut busy = 0;
    while !pending.is_empty() {
        let mut body = Vec::with_capacity(pending.iter().map(|(_, l)| l.len() + 1).sum());
        for (_, line) in &pending {
            body.extend_from_slice(line);
            body.push(b'\n');
        }
        let (answer, retry_after) = client.post(path, "application/x-ndjson", &body)?;
        let rejected = match answer {
            Ok(json) => {
                let reply =
                    accept_as::<api::IngestReply>("POST /v1/streams/{stream}/events", Ok(json))?
                        .value;
                summary.add(reply.accepted, reply.duplicates, reply.late);
                return Ok(());
            }
            Err(r) => r,
        };
        // What the node committed before the error; an error body without `committed` (one
        // refused before the stream was read, or a body that is not the API's) committed
        // nothing.
        let done = match rejected.committed() {
            Some(c) => {
                summary.add(c.accepted, c.duplicates, c.late);
                usize::try_from(c.committed_lines).unwrap_or(usize::MAX)
            }
            None => 0,
        };
        if rejected.is_busy() {
            busy += 1;
            if busy > BUSY_RETRIES_MAX {
                bail!("the node stayed busy (429) for {busy} retries: {rejected}");
            }
            pending.drain(..done.min(pending.len()));
            let wait = retry_after
                .map_or(backoff, Duration::from_secs)
                .max(backoff);
            std::thread::sleep(wait);
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        busy = 0;
        let mut rejected = rejected;
        let line = line_of(rejected.at()).filter(|l| (1..=pending.len()).contains(l));
        if let Some(line) = line {
            // The node numbers the lines of this request: name the input's line instead, as
            // the node would have for the whole input sent at once.
            renumber(&mut rejected, line, pending[line - 1].0);
        }
        match line {
            Some(line) if (400..500).contains(&rejected.status) => {
                let (abs, _) = pending[line - 1];
                summary.rejected.push((abs, rejected.to_string()));
                // Lines before `done` are committed; the rejected one is dropped; the rest
                // (uncommitted, valid so far) are sent again.
                pending.remove(line - 1);
                pending.drain(..done.min(line - 1));
            }
            _ => return Err(anyhow::Error::new(rejected)),
        }
    }
    Ok(())
}

/// Progress on stderr: an indicatif bar when stderr is a terminal (a bar with bytes/s and ETA
/// for a file, a spinner with counts for stdin), plain lines every second otherwise.
enum Progress {
    Bar(indicatif::ProgressBar),
    Lines { last: Instant },
}

/// A file's bar: at 80 columns everything but the bar takes at most ~56 cells
/// (`100% 1023.99 MiB/1023.99 MiB 1023.99 MiB/s ETA 59m`), leaving the bar 20 or more.
const FILE_TEMPLATE: &str =
    "{spinner} [{wide_bar}] {percent:>3}% {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}";
/// Stdin's spinner: no length to measure against, so counts and rates.
const STDIN_TEMPLATE: &str = "{spinner} [{elapsed_precise}] {msg}, {bytes} ({bytes_per_sec})";

impl Progress {
    fn new(total: Option<u64>) -> Self {
        if !std::io::stderr().is_terminal() {
            return Progress::Lines {
                last: Instant::now(),
            };
        }
        let (bar, template) = match total {
            Some(t) => (indicatif::ProgressBar::new(t), FILE_TEMPLATE),
            None => (indicatif::ProgressBar::no_length(), STDIN_TEMPLATE),
        };
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message("0 events, 0 events/s");
        // The spinner turns (and the rate and ETA update) between chunks too.
        bar.enable_steady_tick(Duration::from_millis(100));
        Progress::Bar(bar)
    }

    fn update(&mut self, s: &Summary, started: Instant) {
        let rate = s.lines as f64 / started.elapsed().as_secs_f64().max(1e-3);
        match self {
            Progress::Bar(bar) => {
                bar.set_position(s.bytes);
                bar.set_message(format!("{} events, {rate:.0} events/s", s.lines));
            }
            Progress::Lines { last } => {
                if last.elapsed() >= Duration::from_secs(1) {
                    *last = Instant::now();
                    eprintln!(
                        "ingest: {} events, {} bytes, {rate:.0} events/s",
                        s.lines, s.bytes
                    );
                }
            }
        }
    }

    fn finish(self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// Reads `reader` line by line and sends it in chunks, counting into `summary`.
fn send_all(
    client: &Client,
    path: &str,
    reader: &mut impl BufRead,
    summary: &mut Summary,
    progress: &mut Progress,
    started: Instant,
) -> anyhow::Result<()> {
    let mut line_no = 0u64;
    let mut chunk: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut chunk_bytes = 0;
    loop {
        let mut line = Vec::new();
        let n = reader
            .read_until(b'\n', &mut line)
            .context("reading the input")?;
        if n > 0 {
            line_no += 1;
            summary.bytes += n as u64;
            while matches!(line.last(), Some(b'\n' | b'\r')) {
                line.pop();
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                chunk_bytes += line.len();
                chunk.push((line_no, line));
            }
        }
        if !chunk.is_empty() && (n == 0 || chunk.len() >= CHUNK_LINES || chunk_bytes >= CHUNK_BYTES)
        {
            summary.lines += chunk.len() as u64;
            send_chunk(client, path, std::mem::take(&mut chunk), summary)?;
            chunk_bytes = 0;
            progress.update(summary, started);
        }
        if n == 0 {
            break;
        }
    }
    Ok(())
}

/// Runs the ingest; `Ok(false)` when some lines were rejected (exit status 1).
pub fn run(client: &Client, out: &Output, stream: &str, input: &str) -> anyhow::Result<bool> {
    let (reader, total): (Box<dyn Read>, Option<u64>) = if input == "-" {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        // A file that cannot be opened is a wrong argument (exit 2), like a --token-file.
        if std::path::Path::new(input).is_dir() {
            return Err(
                crate::Usage(format!("{input} is a directory, not a file of events")).into(),
            );
        }
        let file = std::fs::File::open(input)
            .map_err(|e| crate::Usage(format!("cannot open {input}: {e}")))?;
        let len = file.metadata().ok().map(|m| m.len());
        (Box::new(file), len)
    };
    let mut reader = std::io::BufReader::with_capacity(256 * 1024, reader);
    let path = format!(
        "/v1/streams/{}/events",
        stream
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            })
            .collect::<String>()
    );
    let started = Instant::now();
    let mut progress = Progress::new(total);
    let mut summary = Summary::default();
    let sent = send_all(
        client,
        &path,
        &mut reader,
        &mut summary,
        &mut progress,
        started,
    );
    // The bar is cleared before anything else is printed, an error too.
    progress.finish();
    sent?;
    let ok = summary.rejected.is_empty();
    if out.json {
        let rejected: Vec<J> = summary
            .rejected
            .iter()
            .map(|(line, error)| json!({"line": line, "error": error}))
            .collect();
        crate::outln!(
            "{}",
            json!({
                "accepted": summary.accepted,
                "duplicates": summary.duplicates,
                "late": summary.late,
                "rejected": rejected,
            })
        )?;
    } else {
        crate::outln!(
            "accepted {}, duplicates {}, late {}, rejected {} ({} lines, {} bytes in {:.1}s)",
            summary.accepted,
            summary.duplicates,
            summary.late,
            summary.rejected.len(),
            summary.lines,
            summary.bytes,
            started.elapsed().as_secs_f64()
        )?;
        for (line, error) in summary.rejected.iter().take(20) {
            eprintln!("rejected line {line}: {error}");
        }
        if summary.rejected.len() > 20 {
            eprintln!(
                "... and {} more rejected lines",
                summary.rejected.len() - 20
            );
        }
    }
    Ok(ok)
}
