//! The layering of the node crate, read from the code: every `crate::` path in `src/**/*.rs`
//! (the library; the binary's `main.rs` and `cli/` use the public API) must name a module the
//! file's own module may use, by the table below — the same table as ARCHITECTURE.md's
//! "Layers". Test code (`#[cfg(test)]` modules and test-only files) is not checked. An import
//! outside the table fails this test with the file, line and path; an import that runs back up
//! the layers is allowed only where `BACK_UP` lists it, and there are at most two such.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module → the modules of this crate it may use (lowest layer first).
const ALLOWED: &[(&str, &[&str])] = &[
    // Leaves: no other module of the crate.
    ("limits", &[]),
    ("clock", &[]),
    ("metrics", &[]),
    ("codec", &[]),
    ("model", &[]),
    // The HTTP API's JSON bodies as types (shared by the server and clients).
    ("api", &[]),
    // Committed changes buffered for watchers.
    ("watch", &[]),
    // The sans-IO replication core.
    ("proto", &["model", "codec", "limits", "clock"]),
    // Admission of remote input (validation before anything reaches state).
    ("admission", &["model", "limits", "proto", "codec"]),
    // Storage (redb) and the network (quinn): neither knows the other.
    (
        "store",
        &["model", "limits", "proto", "admission", "codec", "clock"],
    ),
    ("net", &["model", "limits", "proto", "codec", "clock"]),
    // The crate's error type wraps the storage and network errors.
    ("error", &["store", "net", "model", "limits", "codec"]),
    // Client operations, then stream views over them.
    (
        "ops",
        &["error", "store", "model", "limits", "admission", "codec"],
    ),
    (
        "views",
        &[
            "ops", "error", "store", "proto", "model", "limits", "codec", "clock",
        ],
    ),
    ("config", &["limits", "proto", "views"]),
    // The single writer thread: storage + replication core + network links.
    (
        "driver",
        &[
            "store",
            "proto",
            "net",
            "error",
            "metrics",
            "model",
            "codec",
            "admission",
            "limits",
            "clock",
            "watch",
        ],
    ),
    // The embedded node: everything below.
    (
        "node",
        &[
            "config",
            "driver",
            "error",
            "metrics",
            "model",
            "net",
            "ops",
            "proto",
            "store",
            "views",
            "admission",
            "limits",
            "codec",
            "clock",
            "watch",
        ],
    ),
    // The HTTP API: the node and the types it serves.
    (
        "http",
        &[
            "api",
            "node",
            "ops",
            "views",
            "net",
            "proto",
            "store",
            "admission",
            "error",
            "metrics",
            "driver",
            "model",
            "limits",
            "config",
            "codec",
            "clock",
            "watch",
        ],
    ),
];

/// Imports that run back up the layers, each with its reason: (file, module it imports).
const BACK_UP: &[(&str, &str)] = &[];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None`: the crate root or the binary).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    if first == "lib.rs" || first == "main.rs" || first == "cli" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_owned())
}

fn is_test_file(rel: &Path) -> bool {
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs" || name.ends_with("_tests.rs") || name.starts_with("test_")
}

/// The lines of `text` that are library code: comments and `#[cfg(test)]` items removed.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            // The next item: one line (`mod x;`) or a block up to its closing brace at the
            // same indentation.
            let indent = line.len() - trimmed.len();
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim_start().starts_with("#[") {
                j += 1;
            }
            if j < lines.len() && lines[j].trim_end().ends_with('{') {
                let close = format!("{}}}", " ".repeat(indent));
                while j < lines.len() && !lines[j].trim_end().starts_with(&close) {
                    j += 1;
                }
            }
            i = j + 1;
            continue;
        }
        if !trimmed.starts_with("//") {
            out.push((i + 1, line.to_owned()));
        }
        i += 1;
    }
    out
}

/// Every `crate::NAME` (or each NAME of `crate::{A, b::C}`, a group may span lines) in `text`,
/// with the byte offset where its path starts.
fn crate_paths_at(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("crate::") {
        let at = from + found;
        let before = text[..at].chars().last();
        from = at + "crate::".len();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // e.g. `tidemark_crdts::` or `$crate::`
        }
        let rest = &text[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push((at, first_segment(&item)));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            if !item.trim().is_empty() {
                out.push((at, first_segment(&item)));
            }
        } else {
            out.push((at, first_segment(rest)));
        }
    }
    out.retain(|(_, s)| !s.is_empty());
    out
}

/// Every path that climbs to the crate root with `super::` from a file at module depth
/// `depth` (`src/store/local.rs` is 2, `src/store/mod.rs` 1): the first segment after the
/// climb, as [`crate_paths_at`] gives it.
fn super_paths_at(text: &str, depth: usize) -> Vec<(usize, String)> {
    let spans = inline_mods(text);
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("super::") {
        let at = from + found;
        let before = text[..at].chars().last();
        from = at + "super::".len();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // inside a longer path, counted from its first `super::`
        }
        let mut climbs = 1;
        let mut rest = &text[from..];
        while let Some(r) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = r;
        }
        let inner = spans.iter().filter(|(a, b)| *a < at && at < *b).count();
        if climbs >= depth + inner {
            let name = first_segment(rest);
            if !name.is_empty() {
                out.push((at, name));
            }
        }
    }
    out
}

/// The byte ranges of the inline modules (`mod name { ... }`) in `text`: a `super::` inside
/// one climbs one module less far.
fn inline_mods(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("mod ") {
        let at = from + found;
        from = at + 4;
        if text[..at]
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &text[from..];
        let name = first_segment(rest);
        let after = rest[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = from + name.len() + (rest.len() - name.len() - after.len());
        let mut depth = 0usize;
        for (i, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((open, open + i));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// The module depth of a file of `src/` (see [`super_paths_at`]).
fn depth_of(rel: &Path) -> usize {
    let n = rel.components().count();
    let is_mod = rel.file_name().is_some_and(|f| f == "mod.rs");
    if is_mod { n - 1 } else { n }
}

/// The names of [`crate_paths_at`], without offsets.
fn crate_paths(text: &str) -> Vec<String> {
    crate_paths_at(text).into_iter().map(|(_, n)| n).collect()
}

fn first_segment(s: &str) -> String {
    s.trim()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Names the crate root re-exports (`pub use module::{A, B};`) → their module.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.trim_end_matches(';');
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for n in names.split(',') {
            let n = first_segment(n);
            if !n.is_empty() {
                map.insert(n, module.to_owned());
            }
        }
    }
    map
}

#[test]
fn every_crate_import_follows_the_layer_table() {
    let src = src_dir();
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(m, deps)| (*m, deps.iter().copied().collect()))
        .collect();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let reexports = root_reexports(&lib);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(
        files.len() > 40,
        "found only {} files under src/",
        files.len()
    );
    let mut violations = Vec::new();
    let mut back_up_used = BTreeSet::new();
    for path in &files {
        let rel = path.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(rel) else {
            continue;
        };
        if is_test_file(rel) {
            continue;
        }
        let shown = format!("src/{}", rel.display());
        let Some(deps) = allowed.get(module.as_str()) else {
            violations.push(format!(
                "{shown}: module `{module}` is not in the layer table"
            ));
            continue;
        };
        let text = std::fs::read_to_string(path).expect("readable source");
        // The library code as one text (groups may span lines), with each line's number.
        let lines = code_lines(&text);
        let mut code = String::new();
        let mut starts = Vec::new();
        for (n, line) in &lines {
            starts.push((code.len(), *n));
            code.push_str(line);
            code.push('\n');
        }
        let code = code
            .replace("crate ::", "crate::")
            .replace("super ::", "super::");
        let mut paths = crate_paths_at(&code);
        paths.extend(super_paths_at(&code, depth_of(rel)));
        for (at, name) in paths {
            let n = starts
                .iter()
                .rev()
                .find(|(start, _)| *start <= at)
                .map_or(0, |(_, n)| *n);
            {
                let target = if allowed.contains_key(name.as_str()) {
                    name.clone()
                } else if let Some(m) = reexports.get(&name) {
                    m.clone()
                } else {
                    violations.push(format!("{shown}:{n}: `crate::{name}` names no module"));
                    continue;
                };
                if target == "tidemark_crdts" || target == module {
                    continue;
                }
                if deps.contains(target.as_str()) {
                    continue;
                }
                if BACK_UP.contains(&(shown.as_str(), target.as_str())) {
                    back_up_used.insert((shown.clone(), target.clone()));
                    continue;
                }
                violations.push(format!(
                    "{shown}:{n}: `{module}` may not use `{target}` (via crate::{name})"
                ));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports outside the layer table (tests/node/layering.rs, ARCHITECTURE.md \"Layers\"):\n{}",
        violations.join("\n")
    );
    assert!(BACK_UP.len() <= 2, "at most two imports may run back up");
    let stale: Vec<_> = BACK_UP
        .iter()
        .filter(|(f, m)| !back_up_used.contains(&((*f).to_owned(), (*m).to_owned())))
        .collect();
    assert!(
        stale.is_empty(),
        "BACK_UP entries no longer used: {stale:?}"
    );
}

#[test]
fn the_layer_table_has_no_circle() {
    // Depth-first search over the table: a module reachable from itself is a circle.
    let graph: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    fn visit<'a>(
        m: &'a str,
        graph: &BTreeMap<&'a str, &'a [&'a str]>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(m) {
            return;
        }
        assert!(
            !stack.contains(&m),
            "circle in the layer table: {stack:?} -> {m}"
        );
        stack.push(m);
        for d in graph.get(m).copied().unwrap_or_default() {
            assert!(
                graph.contains_key(d),
                "`{m}` may use `{d}`, which the table lacks"
            );
            visit(d, graph, stack, done);
        }
        stack.pop();
        done.insert(m);
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_parser_sees_grouped_and_inline_paths() {
    assert_eq!(
        crate_paths("use crate::{model::Delta, store::{A, B}, Durability};"),
        ["model", "store", "Durability"]
    );
    assert_eq!(
        crate_paths("    let x = crate::views::keys::f(tidemark_crdts::X, $crate::y);"),
        ["views"]
    );
    let code =
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    use crate::store::X;\n}\nuse crate::net::Y;\n";
    let kept: Vec<_> = code_lines(code).into_iter().map(|(n, _)| n).collect();
    assert_eq!(kept, [1, 6]);
}

#[test]
fn the_parser_sees_paths_that_climb_to_the_root_with_super() {
    let code =
        "use super::super::views::X;\nuse super::local::Y;\nlet z = super::super::store::f();";
    let names = |code: &str, depth| {
        super_paths_at(code, depth)
            .into_iter()
            .map(|(_, n)| n)
            .collect::<Vec<_>>()
    };
    assert_eq!(names(code, 2), ["views", "store"]);
    assert!(names(code, 3).is_empty());
    // Inside an inline module, one climb more reaches the root.
    let code = "pub mod fuzzing {\n    use super::events::f;\n    use super::super::net::g;\n}\nuse super::store::h;";
    assert_eq!(names(code, 1), ["net", "store"]);
    assert_eq!(depth_of(Path::new("store/mod.rs")), 1);
    assert_eq!(depth_of(Path::new("store/local.rs")), 2);
    assert_eq!(depth_of(Path::new("node.rs")), 1);
}

/// ARCHITECTURE.md's "Layers" table is this test's table: the map of the code says what the
/// code is held to.
#[test]
fn the_layer_table_is_the_one_architecture_md_shows() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path).expect("ARCHITECTURE.md");
    let section = text
        .split("\n## Layers")
        .nth(1)
        .expect("a \"## Layers\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut shown: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, module, deps, _] = cells.as_slice() else {
            continue;
        };
        let Some(module) = module.strip_prefix('`').and_then(|m| m.strip_suffix('`')) else {
            continue;
        };
        let deps: BTreeSet<String> = deps
            .split(',')
            .map(|d| d.trim().trim_matches('`').to_owned())
            .filter(|d| !d.is_empty() && d != "—")
            .collect();
        shown.insert(module.to_owned(), deps);
    }
    let table: BTreeMap<String, BTreeSet<String>> = ALLOWED
        .iter()
        .map(|(m, deps)| {
            (
                (*m).to_owned(),
                deps.iter().map(|d| (*d).to_owned()).collect(),
            )
        })
        .collect();
    assert_eq!(
        shown, table,
        "ARCHITECTURE.md's \"Layers\" table differs from tests/node/layering.rs's"
    );
}
