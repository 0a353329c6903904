//! View definitions (API.md "Events and streams"): their TOML/serde shape and their validation
//! into [`CompiledView`]s, with errors that name the view and the field.

use serde::{Deserialize, Serialize};

/// What a view computes per group (and window).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ViewKind {
    /// Number of events (a grow-only counter).
    Count,
    /// Sum of an integer field (an up-down counter; saturates, never wraps).
    Sum,
    /// The set of distinct values of a field (an add-wins set).
    Distinct,
    /// The value of a field in the event with the greatest event time (ties: greatest event
    /// id), whatever the arrival order.
    Latest,
    /// An add-wins set whose elements are added or removed according to another field.
    Members,
}

/// A condition on an event field: `{ field = "kind", equals = "join" }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldEquals {
    /// The event field.
    pub field: String,
    /// The value (any JSON) it must equal.
    pub equals: serde_json::Value,
}

/// A hopping window: windows of `size` starting every `every`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hopping {
    /// Window length (`"10m"`).
    pub size: String,
    /// Distance between window starts (`"1m"`, at most `size`).
    pub every: String,
}

/// The event-time window of a view: exactly one of `tumbling`, `hopping` and `session`.
/// Durations are `<integer><unit>` with unit `ms`, `s`, `m`, `h` or `d`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowDef {
    /// Tumbling windows of this size (`"1m"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tumbling: Option<String>,
    /// Hopping windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hopping: Option<Hopping>,
    /// Session windows with this gap (`"30m"`): per group, events closer than the gap form
    /// one session (`count`, `sum`, `distinct`, `latest` views; see [`super::session`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// How long after a window's end events for it are still applied (default `0s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lateness: Option<String>,
    /// How long after its end (measured against the cluster watermark) a window is kept
    /// (default: forever).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<String>,
    /// Allowed out-of-orderness of the stream: the watermark trails the greatest event time
    /// seen by this much (default `0s`; a stream uses the largest of its views').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_orderness: Option<String>,
    /// After this long without an event of the stream on a node, the node advances its
    /// watermark of the stream from its clock (to now − `idle_timeout`) and announces it, so an
    /// idle member does not hold windows open forever (default: never; a stream uses the
    /// smallest of its views'). Events for windows behind the advanced watermark are late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
}

/// One view, as declared in the node config:
/// ```toml
/// [[views]]
/// name = "clicks_per_page"
/// stream = "clicks"
/// kind = "count"
/// group_by = ["page"]
/// window = { tumbling = "1m", lateness = "30s", retention = "7d" }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewDef {
    /// The view's name: 1–64 characters of `A-Z a-z 0-9 _ - .`, unique among views.
    pub name: String,
    /// The stream whose events feed the view.
    pub stream: String,
    /// What it computes.
    pub kind: ViewKind,
    /// Event fields whose values form the group (none: one group).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_by: Vec<String>,
    /// The value field (`sum`, `distinct`, `latest`, `members`; not `count`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// `members`: events matching this add the field's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_when: Option<FieldEquals>,
    /// `members`: events matching this remove the field's value (observed-remove).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove_when: Option<FieldEquals>,
    /// The event-time window (none: one value per group, never final).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowDef>,
    /// How far ahead of the ingesting node's clock an event time may be (default `1h`; a
    /// stream uses the smallest of its views'). An event further ahead is refused, and no
    /// watermark or horizon of the stream is taken beyond the clock plus this. An ingest
    /// policy, not part of the view's value: it is left out of the definition digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_future: Option<String>,
}

/// The default of [`ViewDef::max_future`]: one hour (as Kafka's
/// `message.timestamp.after.max.ms`).
pub const MAX_FUTURE_DEFAULT_MS: u64 = 3_600_000;

/// A validated window, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Window length.
    pub size_ms: u64,
    /// Distance between starts (`size_ms` for tumbling windows).
    pub every_ms: u64,
    /// Allowed lateness.
    pub lateness_ms: u64,
    /// Retention after the window's end (`None`: forever).
    pub retention_ms: Option<u64>,
    /// Allowed out-of-orderness.
    pub out_of_orderness_ms: u64,
    /// Idle timeout of the stream's watermark (`None`: never advanced by the clock).
    pub idle_timeout_ms: Option<u64>,
    /// The gap of a session window (`None`: tumbling or hopping). A session view is stored
    /// as tumbling windows of 1 ms (`size_ms` and `every_ms` are 1), one cell per group and
    /// event time; sessions are computed from them when read ([`super::session`]).
    pub session_gap_ms: Option<u64>,
}

impl Window {
    /// Starts of the windows holding event time `t`, ascending.
    pub fn starts(&self, t: u64) -> Vec<u64> {
        let last = t - t % self.every_ms;
        let mut out = Vec::new();
        let mut s = last;
        loop {
            if t - s >= self.size_ms {
                break;
            }
            out.push(s);
            match s.checked_sub(self.every_ms) {
                Some(n) => s = n,
                None => break,
            }
        }
        out.reverse();
        out
    }

    /// The instant after which events for the window starting at `start` are late: a window
    /// is late (and, cluster-wide, final) once a watermark is strictly greater than this.
    pub fn deadline(&self, start: u64) -> u64 {
        start
            .saturating_add(self.size_ms)
            .saturating_add(self.lateness_ms)
    }
}

/// Most windows one event may fall into (hopping `size / every`).
pub const WINDOWS_PER_EVENT_MAX: u64 = 1_000;

/// A validated view definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledView {
    /// The definition as given.
    pub def: ViewDef,
    /// The validated window.
    pub window: Option<Window>,
    /// The validated `max_future` (ms).
    pub max_future_ms: u64,
    /// Digest of the definition (16 hex digits): the view's cells are keyed by it, so state of
    /// a differing definition of the same name lives under other keys and is never merged.
    pub digest: String,
}

/// Parses a duration: `<integer><unit>`, unit `ms`, `s`, `m`, `h` or `d`.
///
/// # Errors
/// A message describing the accepted form.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit (ms, s, m, h, d)"))?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not <integer><unit>"))?;
    let mult = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?}: unknown unit (ms, s, m, h, d)")),
    };
    let ms = n
        .checked_mul(mult)
        .ok_or_else(|| format!("{text:?} is too long"))?;
    // Event times plus durations stay exact in a JSON number (below 2^53: JavaScript, SQLite)
    // and far from overflow.
    if ms > DURATION_MAX_MS {
        return Err(format!("{text:?} is too long (at most 36500d)"));
    }
    Ok(ms)
}

/// The longest duration a view accepts: 100 years (36,500 days).
pub const DURATION_MAX_MS: u64 = 36_500 * 86_400_000;

fn err(view: &str, field: &str, message: impl std::fmt::Display) -> String {
    format!("view {view:?}, field `{field}`: {message}")
}

fn compile_window(name: &str, kind: ViewKind, w: &WindowDef) -> Result<Window, String> {
    let dur = |field: &str, text: &str| {
        parse_duration_ms(text).map_err(|e| err(name, &format!("window.{field}"), e))
    };
    let mut session_gap_ms = None;
    if let Some(gap) = &w.session {
        let other = match (&w.tumbling, &w.hopping) {
            (Some(_), _) => Some("tumbling"),
            (None, Some(_)) => Some("hopping"),
            (None, None) => None,
        };
        if let Some(other) = other {
            return Err(err(
                name,
                &format!("window.{other}"),
                format!(
                    "a session window has no `{other}`: `session` sets the gap, the events \
                     set the length (give exactly one of `tumbling`, `hopping` and `session`)"
                ),
            ));
        }
        if kind == ViewKind::Members {
            return Err(err(
                name,
                "window.session",
                "session windows are for count, sum, distinct and latest views",
            ));
        }
        let g = dur("session", gap)?;
        if g == 0 {
            return Err(err(name, "window.session", "the gap must be positive"));
        }
        session_gap_ms = Some(g);
    }
    let (size_ms, every_ms) = match (&w.tumbling, &w.hopping) {
        // One cell per event time: a tumbling window of 1 ms.
        (None, None) if session_gap_ms.is_some() => (1, 1),
        (Some(t), None) => {
            let s = dur("tumbling", t)?;
            (s, s)
        }
        (None, Some(h)) => (
            dur("hopping.size", &h.size)?,
            dur("hopping.every", &h.every)?,
        ),
        _ => {
            return Err(err(
                name,
                "window",
                "give exactly one of `tumbling`, `hopping` and `session`",
            ));
        }
    };
    if size_ms == 0 || every_ms == 0 {
        return Err(err(name, "window", "sizes must be positive"));
    }
    if every_ms > size_ms {
        return Err(err(
            name,
            "window.hopping.every",
            "must not exceed `size` (events would fall between windows)",
        ));
    }
    if size_ms.div_ceil(every_ms) > WINDOWS_PER_EVENT_MAX {
        return Err(err(
            name,
            "window.hopping.every",
            format!("an event would fall into more than {WINDOWS_PER_EVENT_MAX} windows"),
        ));
    }
    let opt = |field: &str, text: &Option<String>| -> Result<Option<u64>, String> {
        text.as_deref().map(|t| dur(field, t)).transpose()
    };
    let lateness_ms = opt("lateness", &w.lateness)?.unwrap_or(0);
    let retention_ms = opt("retention", &w.retention)?;
    if retention_ms.is_some_and(|r| r < lateness_ms) {
        return Err(err(
            name,
            "window.retention",
            "must be at least `lateness` (a window is removed only once it is final)",
        ));
    }
    let idle_timeout_ms = opt("idle_timeout", &w.idle_timeout)?;
    if idle_timeout_ms == Some(0) {
        return Err(err(name, "window.idle_timeout", "must be positive"));
    }
    Ok(Window {
        size_ms,
        every_ms,
        lateness_ms,
        retention_ms,
        out_of_orderness_ms: opt("out_of_orderness", &w.out_of_orderness)?.unwrap_or(0),
        idle_timeout_ms,
        session_gap_ms,
    })
}

/// The characters view names, stream names of views and `group_by` field names are made of:
/// URL-path-safe without escaping (RFC 3986 unreserved, without `~`).
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// A view or stream name: 1–`max` characters of `A-Z a-z 0-9 _ - .`, and not `.` or `..`
/// (a path segment that means "this" or "the parent" in a URL: `/v1/views/..` is not a view).
fn path_name_ok(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name.chars().all(name_char)
        && name != "."
        && name != ".."
}

/// A `group_by` field name: 1–128 characters of `A-Z a-z 0-9 _ - .`, not `.` or `..` (so it
/// can be named in `group.<field>=` and as a column without quoting), not an envelope name.
fn check_group_field(view: &str, name: &str) -> Result<(), String> {
    if name == "." || name == ".." {
        return Err(err(
            view,
            "group_by",
            format!("{name:?}: `.` and `..` are no field names"),
        ));
    }
    if name.is_empty() || name.len() > 128 || !name.chars().all(name_char) {
        return Err(err(
            view,
            "group_by",
            format!("{name:?}: group_by field names are 1–128 characters of A-Z a-z 0-9 _ - ."),
        ));
    }
    // Envelope names in any case: a column `Source` beside the envelope's `source` is the
    // same column to SQL (and repeats are compared without case too).
    if matches!(
        name.to_ascii_lowercase().as_str(),
        "source" | "seq" | "time" | "ops"
    ) {
        return Err(err(
            view,
            "group_by",
            format!("{name:?} is (in another case) part of the event envelope, not a field"),
        ));
    }
    check_field_name(view, "group_by", name)
}

fn check_field_name(view: &str, field: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(err(
            view,
            field,
            "field names are 1–128 bytes without control characters",
        ));
    }
    if matches!(name, "source" | "seq" | "time" | "ops") {
        return Err(err(
            view,
            field,
            format!("{name:?} is part of the event envelope, not a field"),
        ));
    }
    Ok(())
}

/// Validates view definitions (names unique and well-formed, fields present where the kind
/// needs them and absent where it does not, windows well-formed).
///
/// # Errors
/// The first problem, as `view "NAME", field `FIELD`: why`.
pub fn compile(defs: &[ViewDef]) -> Result<Vec<CompiledView>, String> {
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(defs.len());
    for d in defs {
        let name = d.name.as_str();
        if !path_name_ok(name, 64) {
            return Err(err(
                name,
                "name",
                "view names are 1–64 characters of A-Z a-z 0-9 _ - ., not `.` or `..`",
            ));
        }
        if !names.insert(name) {
            return Err(err(name, "name", "defined twice"));
        }
        if !path_name_ok(&d.stream, 128) {
            return Err(err(
                name,
                "stream",
                format!(
                    "{:?}: stream names of views are 1–128 characters of A-Z a-z 0-9 _ - ., \
                     not `.` or `..`",
                    d.stream
                ),
            ));
        }
        let mut grouped = std::collections::BTreeSet::new();
        for g in &d.group_by {
            check_group_field(name, g)?;
            // Compared without case: SQL columns (a sink's table) and many tools do not tell
            // `page` from `Page`.
            if !grouped.insert(g.to_ascii_lowercase()) {
                return Err(err(
                    name,
                    "group_by",
                    format!("{g:?} is listed twice (field names are compared without case)"),
                ));
            }
        }
        let needs_field = d.kind != ViewKind::Count;
        match (&d.field, needs_field) {
            (None, true) => {
                return Err(err(
                    name,
                    "field",
                    format!("a `{:?}` view needs a value field", d.kind).to_lowercase(),
                ));
            }
            (Some(_), false) => {
                return Err(err(name, "field", "a count view has no value field"));
            }
            (Some(f), true) => check_field_name(name, "field", f)?,
            (None, false) => {}
        }
        let members = d.kind == ViewKind::Members;
        for (label, cond) in [("add_when", &d.add_when), ("remove_when", &d.remove_when)] {
            match (cond, members) {
                (Some(c), true) => check_field_name(name, &format!("{label}.field"), &c.field)?,
                (None, true) => return Err(err(name, label, "a members view needs it")),
                (Some(_), false) => {
                    return Err(err(name, label, "only members views have it"));
                }
                (None, false) => {}
            }
        }
        if let (Some(a), Some(r)) = (&d.add_when, &d.remove_when) {
            if a == r {
                return Err(err(name, "remove_when", "equals `add_when`"));
            }
        }
        let window = d
            .window
            .as_ref()
            .map(|w| compile_window(name, d.kind, w))
            .transpose()?;
        let max_future_ms = match &d.max_future {
            None => MAX_FUTURE_DEFAULT_MS,
            Some(t) => parse_duration_ms(t).map_err(|e| err(name, "max_future", e))?,
        };
        out.push(CompiledView {
            def: d.clone(),
            window,
            max_future_ms,
            digest: super::keys::defs_digest(&[d]),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_starts_cover_exactly_the_windows_holding_an_event() {
        let tumbling = Window {
            size_ms: 60_000,
            every_ms: 60_000,
            lateness_ms: 0,
            retention_ms: None,
            out_of_orderness_ms: 0,
            idle_timeout_ms: None,
            session_gap_ms: None,
        };
        assert_eq!(tumbling.starts(0), vec![0]);
        assert_eq!(tumbling.starts(59_999), vec![0]);
        assert_eq!(tumbling.starts(60_000), vec![60_000]);
        let hopping = Window {
            size_ms: 30,
            every_ms: 10,
            ..tumbling
        };
        assert_eq!(hopping.starts(25), vec![0, 10, 20]);
        assert_eq!(hopping.starts(30), vec![10, 20, 30]);
        assert_eq!(hopping.starts(5), vec![0]);
        assert_eq!(hopping.deadline(10), 40);
    }

    fn def(name: &str, stream: &str, group_by: &[&str]) -> ViewDef {
        serde_json::from_value(serde_json::json!({
            "name": name, "stream": stream, "kind": "count", "group_by": group_by,
        }))
        .expect("shape")
    }

    #[test]
    fn names_that_are_not_path_safe_are_refused_naming_the_field() {
        assert!(compile(&[def("clicks.v2", "app-clicks_1", &["page", "geo.country"])]).is_ok());
        for bad in [".", "..", "", "a/b", "a b", "clicks%2F", "é", "~x"] {
            let e = compile(&[def(bad, "s", &[])]).expect_err(bad);
            assert_eq!(
                e,
                format!(
                    "view {bad:?}, field `name`: view names are 1–64 characters of \
                     A-Z a-z 0-9 _ - ., not `.` or `..`"
                )
            );
        }
        assert!(compile(&[def("...", "s", &[])]).is_ok());
        assert!(compile(&[def(&"v".repeat(65), "s", &[])]).is_err());
        for bad in [".", "..", "a/b", "a b", "clicks?x", "é"] {
            let e = compile(&[def("v", bad, &[])]).expect_err(bad);
            assert_eq!(
                e,
                format!(
                    "view \"v\", field `stream`: {bad:?}: stream names of views are 1–128 \
                     characters of A-Z a-z 0-9 _ - ., not `.` or `..`"
                )
            );
        }
        for bad in ["", "a b", "a=b", "a&b", "é"] {
            let e = compile(&[def("v", "s", &["page", bad])]).expect_err(bad);
            assert_eq!(
                e,
                format!(
                    "view \"v\", field `group_by`: {bad:?}: group_by field names are 1–128 \
                     characters of A-Z a-z 0-9 _ - ."
                )
            );
        }
        let e = compile(&[def("v", "s", &["seq"])]).expect_err("envelope");
        assert!(e.starts_with("view \"v\", field `group_by`:"), "{e}");
    }

    fn session_def(kind: &str, window: serde_json::Value) -> ViewDef {
        let mut d = serde_json::json!({
            "name": "sess", "stream": "s", "kind": kind, "group_by": ["user"], "window": window,
        });
        if kind != "count" {
            d["field"] = "v".into();
        }
        if kind == "members" {
            d["add_when"] = serde_json::json!({"field": "op", "equals": "add"});
            d["remove_when"] = serde_json::json!({"field": "op", "equals": "rm"});
        }
        serde_json::from_value(d).expect("shape")
    }

    #[test]
    fn durations_are_bounded() {
        assert_eq!(
            super::parse_duration_ms("36500d"),
            Ok(super::DURATION_MAX_MS)
        );
        let e = super::parse_duration_ms("36501d").expect_err("too long");
        assert!(e.contains("at most 36500d"), "{e}");
        assert!(super::parse_duration_ms("106751991167d").is_err());
    }

    #[test]
    fn session_windows_compile_to_one_ms_cells_and_refuse_a_size() {
        let v = compile(&[session_def(
            "count",
            serde_json::json!({"session": "30m", "lateness": "5m", "retention": "1d"}),
        )])
        .expect("compiles");
        let w = v[0].window.expect("window");
        assert_eq!(w.session_gap_ms, Some(1_800_000));
        assert_eq!((w.size_ms, w.every_ms, w.lateness_ms), (1, 1, 300_000));
        assert_eq!(w.starts(12_345), vec![12_345]);
        assert_eq!(w.deadline(12_345), 12_345 + 1 + 300_000);
        for kind in ["sum", "distinct", "latest"] {
            assert!(compile(&[session_def(kind, serde_json::json!({"session": "1s"}))]).is_ok());
        }
        let e = compile(&[session_def(
            "count",
            serde_json::json!({"session": "30m", "tumbling": "1m"}),
        )])
        .expect_err("both");
        assert!(
            e.starts_with("view \"sess\", field `window.tumbling`:"),
            "{e}"
        );
        let e = compile(&[session_def(
            "count",
            serde_json::json!({"session": "30m", "hopping": {"size": "2m", "every": "1m"}}),
        )])
        .expect_err("both");
        assert!(
            e.starts_with("view \"sess\", field `window.hopping`:"),
            "{e}"
        );
        for bad in ["30", "30x", "0s", ""] {
            let e = compile(&[session_def("count", serde_json::json!({"session": bad}))])
                .expect_err(bad);
            assert!(
                e.starts_with("view \"sess\", field `window.session`:"),
                "{bad}: {e}"
            );
        }
        let e = compile(&[session_def("members", serde_json::json!({"session": "1m"}))])
            .expect_err("members");
        assert!(
            e.starts_with("view \"sess\", field `window.session`:"),
            "{e}"
        );
    }

    #[test]
    fn durations_parse_with_units_only() {
        assert_eq!(parse_duration_ms("1m"), Ok(60_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("7d"), Ok(7 * 86_400_000));
        assert!(parse_duration_ms("10").is_err());
        assert!(parse_duration_ms("1w").is_err());
        assert!(parse_duration_ms("99999999999999999d").is_err());
    }
}
