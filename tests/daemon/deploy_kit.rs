//! The deployment kit (deploy/systemd, deploy/kubernetes, the Dockerfile) starts the real
//! binary with flags and keys it accepts: each command line is taken out of its file,
//! placeholders are filled in the way systemd or the kubelet fills them, and the real binary
//! runs it with `--print-config`, which must exit 0 and print the expected settings.
//! `systemd-analyze verify` checks the unit where it is installed (required when
//! TIDEMARK_REQUIRE_SYSTEMD_ANALYZE=1, as in CI).
//!
//! No YAML crate is a dependency, so the StatefulSet is read with the small extractor in
//! [`yaml`], which understands only the subset the manifest is written in (block lists of
//! one-line scalars) and panics on anything else rather than guessing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tidemark");

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    let path = repo_file(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Runs `tidemark serve <args> --print-config` and returns the printed config, parsed.
fn print_config(args: &[String]) -> toml::Table {
    let out = Command::new(BIN)
        .args(args)
        .arg("--print-config")
        .env_remove("TIDEMARK_TOKEN")
        .output()
        .expect("run tidemark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tidemark {args:?} --print-config failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    toml::from_str(&stdout).unwrap_or_else(|e| panic!("printed config is not TOML: {e}\n{stdout}"))
}

/// The value at a dotted `key` of the printed config.
fn at<'a>(config: &'a toml::Table, key: &str) -> &'a toml::Value {
    let mut parts = key.split('.');
    let first = parts.next().expect("a key");
    let mut v = config
        .get(first)
        .unwrap_or_else(|| panic!("printed config has no `{key}`"));
    for p in parts {
        v = v
            .get(p)
            .unwrap_or_else(|| panic!("printed config has no `{key}`"));
    }
    v
}

fn str_at<'a>(config: &'a toml::Table, key: &str) -> &'a str {
    at(config, key)
        .as_str()
        .unwrap_or_else(|| panic!("`{key}` is not a string: {:?}", at(config, key)))
}

fn strings_at(config: &toml::Table, key: &str) -> Vec<String> {
    at(config, key)
        .as_array()
        .unwrap_or_else(|| panic!("`{key}` is not an array"))
        .iter()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

/// The files `tidemark certs issue` writes (the names `serve --tls DIR` reads), issued for
/// `name` into `dir/out` with a fresh CA in `dir/ca`.
fn issued_files(dir: &Path, name: &str) -> (PathBuf, Vec<String>) {
    let ca = dir.join("ca");
    let out = dir.join("issued");
    let run = |args: &[&str]| {
        let o = Command::new(BIN)
            .args(args)
            .output()
            .expect("run tidemark certs");
        assert!(
            o.status.success(),
            "tidemark {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    run(&["certs", "init", "--out", ca.to_str().expect("utf-8 path")]);
    run(&[
        "certs",
        "issue",
        "--ca",
        ca.to_str().expect("utf-8 path"),
        "--name",
        name,
        "--out",
        out.to_str().expect("utf-8 path"),
    ]);
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .expect("read issued dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["ca.pem", "node.key", "node.pem"],
        "`certs issue` writes other files than the deploy kit maps"
    );
    (out, files)
}

/// A minimal reader for the YAML subset of deploy/kubernetes/statefulset.yaml.
///
/// Supported, and nothing else: documents split by `---` lines; `key: value` lines; block
/// sequences (`key:` followed by `- item` lines, at the key's indentation or deeper), whose
/// items are either one-line scalars or small mappings (`- name: X` with deeper `key: value`
/// lines); scalars plain (a ` #` starts a comment), single-quoted (`''` is a quote) or
/// double-quoted (only `\"` and `\\` escapes). Block scalars (`|`, `>`), flow collections
/// (`[`, `{`), anchors, aliases, tags and multi-line scalars panic: the test must fail loudly
/// when the manifest leaves the format it knows, not read something else.
mod yaml {
    /// A non-blank, non-comment line: its indentation and its text.
    #[derive(Clone, Debug)]
    pub struct Line {
        pub indent: usize,
        pub text: String,
    }

    fn lines(doc: &str) -> Vec<Line> {
        doc.lines()
            .filter(|l| {
                let t = l.trim_start();
                !t.is_empty() && !t.starts_with('#')
            })
            .map(|l| {
                assert!(!l.contains('\t'), "tab in YAML line {l:?}");
                let text = l.trim_start();
                Line {
                    indent: l.len() - text.len(),
                    text: text.trim_end().to_owned(),
                }
            })
            .collect()
    }

    /// The document (between `---` lines) with `kind: KIND` at its top level.
    pub fn document(text: &str, kind: &str) -> String {
        let docs: Vec<String> = text
            .split("\n---")
            .map(str::to_owned)
            .filter(|d| d.lines().any(|l| l.trim_end() == format!("kind: {kind}")))
            .collect();
        assert_eq!(
            docs.len(),
            1,
            "expected exactly one `kind: {kind}` document"
        );
        docs.into_iter().next().expect("one document")
    }

    /// Parses one scalar as it follows `- ` or `key: `.
    pub fn scalar(raw: &str) -> String {
        let raw = raw.trim();
        if let Some(rest) = raw.strip_prefix('\'') {
            let inner = rest
                .strip_suffix('\'')
                .unwrap_or_else(|| panic!("unterminated or multi-line '...' scalar: {raw:?}"));
            assert!(
                !inner.replace("''", "").contains('\''),
                "stray quote in {raw:?}"
            );
            return inner.replace("''", "'");
        }
        if let Some(rest) = raw.strip_prefix('"') {
            let inner = rest
                .strip_suffix('"')
                .unwrap_or_else(|| panic!("unterminated or multi-line \"...\" scalar: {raw:?}"));
            let mut out = String::new();
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some(e @ ('"' | '\\')) => out.push(e),
                        other => panic!("unsupported escape \\{other:?} in {raw:?}"),
                    },
                    '"' => panic!("stray quote in {raw:?}"),
                    c => out.push(c),
                }
            }
            return out;
        }
        let plain = match raw.find(" #") {
            Some(i) => raw[..i].trim_end(),
            None => raw,
        };
        assert!(
            !plain.is_empty()
                && !plain.starts_with(['|', '>', '[', '{', '&', '*', '!', '%', '@', '`']),
            "unsupported YAML scalar {raw:?} (block, flow, anchor, alias or tag)"
        );
        assert!(
            !plain.contains(": "),
            "a mapping where a scalar was expected: {raw:?}"
        );
        plain.to_owned()
    }

    /// The items of the block sequence under the only line `key:` in `doc`: each item as its
    /// first line (after `- `) and the deeper lines that follow it.
    pub fn items(doc: &str, key: &str) -> Vec<Vec<Line>> {
        let all = lines(doc);
        let header = format!("{key}:");
        let at: Vec<usize> = (0..all.len()).filter(|&i| all[i].text == header).collect();
        assert_eq!(
            at.len(),
            1,
            "expected exactly one `{header}` line (a block sequence follows it)"
        );
        let key_indent = all[at[0]].indent;
        let rest = &all[at[0] + 1..];
        let first = rest
            .first()
            .filter(|l| l.indent >= key_indent && l.text.starts_with("- "))
            .unwrap_or_else(|| panic!("`{header}` is not followed by a block sequence (`- item`)"));
        let item_indent = first.indent;
        let mut out: Vec<Vec<Line>> = Vec::new();
        for l in rest {
            if l.indent < item_indent || (l.indent == item_indent && !l.text.starts_with("- ")) {
                break;
            }
            if l.indent == item_indent {
                out.push(vec![Line {
                    indent: item_indent + 2,
                    text: l.text[2..].to_owned(),
                }]);
            } else {
                out.last_mut().expect("an item").push(l.clone());
            }
        }
        out
    }

    /// The block sequence under `key:` as a list of one-line scalars.
    pub fn scalars(doc: &str, key: &str) -> Vec<String> {
        items(doc, key)
            .into_iter()
            .map(|item| {
                assert_eq!(
                    item.len(),
                    1,
                    "`{key}` item spans lines (unsupported): {item:?}"
                );
                scalar(&item[0].text)
            })
            .collect()
    }

    /// The value of `field: value` among an item's lines (at any depth), if present.
    pub fn field(item: &[Line], field: &str) -> Option<String> {
        let prefix = format!("{field}:");
        let found: Vec<&Line> = item
            .iter()
            .filter(|l| {
                l.text
                    .strip_prefix(&prefix)
                    .is_some_and(|r| r.is_empty() || r.starts_with(' '))
            })
            .collect();
        assert!(found.len() <= 1, "`{field}` twice in one item: {item:?}");
        found.first().map(|l| scalar(&l.text[prefix.len()..]))
    }

    /// The value of the only top-level-or-nested line `key: value` in `doc`.
    pub fn only(doc: &str, key: &str) -> String {
        let all = lines(doc);
        field(&all, key).unwrap_or_else(|| panic!("no `{key}:` line"))
    }
}

/// What the kubelet does to a container's command and args: `$(VAR)` becomes the value of
/// the container's env var VAR; `$$` is a literal `$`; a reference to an undefined variable
/// is left as written.
fn kubelet_expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after.strip_prefix('(').and_then(|a| a.split_once(')')) {
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

const POD_NAME: &str = "tidemark-1";
const POD_NAMESPACE: &str = "prod-data";
const POD_IP: &str = "10.20.30.41";

#[test]
fn kubernetes_statefulset_args_are_accepted_by_the_binary() {
    let text = read("deploy/kubernetes/statefulset.yaml");
    let sts = yaml::document(&text, "StatefulSet");
    let services = read("deploy/kubernetes/service.yaml");
    let replicas: usize = yaml::only(&sts, "replicas")
        .parse()
        .expect("replicas is a number");
    assert_eq!(replicas, 3, "the kit is a three-member cluster");
    let service_name = yaml::only(&sts, "serviceName");

    // The headless Service that gives the pods their names publishes them before readiness.
    let headless = services
        .split("\n---")
        .find(|d| d.contains(&format!("\n  name: {service_name}\n")))
        .unwrap_or_else(|| panic!("service.yaml has no Service named {service_name}"));
    assert!(
        headless.contains("clusterIP: None"),
        "{service_name} is not headless"
    );
    assert!(
        headless.contains("publishNotReadyAddresses: true"),
        "{service_name} must publish not-ready pods (a node joins before it is ready)"
    );

    // The env: each variable from the downward API, filled in as for pod tidemark-1.
    let pod_fields: BTreeMap<&str, &str> = [
        ("metadata.name", POD_NAME),
        ("metadata.namespace", POD_NAMESPACE),
        ("status.podIP", POD_IP),
    ]
    .into();
    let mut env = BTreeMap::new();
    for item in yaml::items(&sts, "env") {
        let name = yaml::field(&item, "name").expect("env item has a name");
        let value = match (yaml::field(&item, "value"), yaml::field(&item, "fieldPath")) {
            (Some(v), None) => v,
            (None, Some(f)) => pod_fields
                .get(f.as_str())
                .unwrap_or_else(|| panic!("env {name}: field {f} not simulated"))
                .to_string(),
            other => panic!("env {name}: expected value or fieldRef, got {other:?}"),
        };
        env.insert(name, value);
    }
    assert_eq!(
        env.get("POD_NAME").map(String::as_str),
        Some(POD_NAME),
        "POD_NAME must come from metadata.name (it picks the pod's certificate)"
    );

    let command = yaml::scalars(&sts, "command");
    assert_eq!(command, ["/usr/local/bin/tidemark"], "the image's binary");
    let args: Vec<String> = yaml::scalars(&sts, "args")
        .iter()
        .map(|a| kubelet_expand(a, &env))
        .collect();
    assert_eq!(args.first().map(String::as_str), Some("serve"));
    for a in &args {
        assert!(!a.contains("$("), "undefined variable left in {a:?}");
    }

    // The token Secret is mounted where --token-file reads; the test gives a file of its own.
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "k8s-token\n").expect("write token");
    let token_flag = "--token-file=/etc/tidemark/token/token";
    assert!(args.iter().any(|a| a == token_flag), "no {token_flag}");
    assert!(sts.contains("mountPath: /etc/tidemark/token\n"));
    let args: Vec<String> = args
        .into_iter()
        .map(|a| {
            if a == token_flag {
                format!("--token-file={}", token.display())
            } else {
                a
            }
        })
        .collect();

    let config = print_config(&args);
    assert_eq!(str_at(&config, "data_dir"), "/var/lib/tidemark/data");
    assert!(
        sts.contains("- name: data\n              mountPath: /var/lib/tidemark\n"),
        "the data volume is not mounted above data_dir"
    );
    assert_eq!(str_at(&config, "http.listen"), "0.0.0.0:7700");
    assert_eq!(
        str_at(&config, "http.token"),
        "<redacted>",
        "HTTP on 0.0.0.0 needs a token"
    );
    let hosts = strings_at(&config, "http.allowed_hosts");
    for h in [
        "tidemark-api".to_owned(),
        format!("tidemark-api.{POD_NAMESPACE}.svc"),
        format!("tidemark-api.{POD_NAMESPACE}.svc.cluster.local"),
    ] {
        assert!(hosts.contains(&h), "allowed_hosts {hosts:?} lacks {h}");
    }
    assert!(
        services.contains("\n  name: tidemark-api\n"),
        "allowed_hosts names a Service that service.yaml does not define"
    );
    assert_eq!(str_at(&config, "peer.listen"), "0.0.0.0:7701");
    assert_eq!(str_at(&config, "peer.advertise"), format!("{POD_IP}:7701"));
    assert_eq!(str_at(&config, "peer.tls"), "/etc/tidemark/tls");
    let joins = strings_at(&config, "peer.join");
    let expected: Vec<String> = (0..replicas)
        .map(|n| format!("tidemark-{n}.{service_name}.{POD_NAMESPACE}.svc:7701"))
        .collect();
    assert_eq!(joins, expected, "--join must name every replica");
    assert_eq!(str_at(&config, "log.format"), "json");

    // Probes on the routes served without the token; container ports match the listeners.
    assert!(
        sts.contains("path: /readyz\n"),
        "no readiness probe on /readyz"
    );
    assert!(
        sts.contains("path: /healthz\n"),
        "no liveness probe on /healthz"
    );
    assert!(sts.contains("containerPort: 7700\n") && sts.contains("containerPort: 7701\n"));

    // Each pod's certificate: the Secret's per-pod keys land in tidemark-N/, and the pod
    // mounts only its own directory (named by POD_NAME = metadata.name) at --tls.
    let (_issued, files) = issued_files(dir.path(), POD_NAME);
    assert!(
        sts.contains("mountPath: /etc/tidemark/tls\n              subPathExpr: $(POD_NAME)\n"),
        "the tls mount must select the pod's own directory with subPathExpr: $(POD_NAME)"
    );
    for n in 0..replicas {
        for f in &files {
            let key = format!("- key: tidemark-{n}.{f}\n");
            let path = format!("  path: tidemark-{n}/{f}\n");
            assert!(
                sts.contains(&key) && sts.contains(&path),
                "tls volume lacks {key:?} -> {path:?}"
            );
        }
    }

    // The PodDisruptionBudget selects the same pods.
    let pdb = read("deploy/kubernetes/pdb.yaml");
    let pdb = yaml::document(&pdb, "PodDisruptionBudget");
    assert_eq!(yaml::only(&pdb, "maxUnavailable"), "1");
    assert!(pdb.contains("app.kubernetes.io/name: tidemark"));
}

/// The `[Service]` directives of the unit, in order (a key may repeat).
fn unit_directives(unit: &str) -> Vec<(String, String)> {
    let mut section = "";
    let mut out = Vec::new();
    for line in unit.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            section = line;
            continue;
        }
        assert!(
            !line.ends_with('\\'),
            "line continuation in the unit: {line}"
        );
        if section == "[Service]" {
            let (k, v) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=VALUE: {line}"));
            out.push((k.to_owned(), v.to_owned()));
        }
    }
    out
}

fn directive<'a>(d: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    d.iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[test]
fn systemd_unit_exec_start_is_accepted_by_the_binary() {
    let unit = read("deploy/systemd/tidemark.service");
    let d = unit_directives(&unit);
    for (key, value) in [
        ("DynamicUser", "yes"),
        ("StateDirectory", "tidemark"),
        ("NoNewPrivileges", "yes"),
        ("LimitNOFILE", "65536"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("Restart", "on-failure"),
        ("KillSignal", "SIGTERM"),
    ] {
        assert_eq!(directive(&d, key), [value], "{key}=");
    }

    let exec = directive(&d, "ExecStart");
    assert_eq!(exec.len(), 1, "one ExecStart");
    let argv: Vec<&str> = exec[0].split_whitespace().collect();
    for a in &argv {
        assert!(
            !a.contains(['"', '\'', '\\', '$']),
            "ExecStart uses quoting or variables, which this test does not expand: {a}"
        );
    }
    assert_eq!(argv[..2], ["/usr/local/bin/tidemark", "serve"]);

    // LoadCredential=NAME:PATH puts each file in the credentials directory, %d: the token
    // and the three files `certs issue` writes, which --tls %d reads.
    let creds = tempfile::tempdir().expect("tempdir");
    let (issued, files) = issued_files(creds.path(), "tidemark-1");
    let cred_dir = creds.path().join("credentials");
    std::fs::create_dir(&cred_dir).expect("mkdir");
    let mut names: Vec<&str> = Vec::new();
    for lc in directive(&d, "LoadCredential") {
        let (name, source) = lc.split_once(':').expect("LoadCredential=NAME:PATH");
        assert!(source.starts_with("/etc/tidemark/"), "{lc}");
        names.push(name);
        let content = if name == "token" {
            "unit-token\n".to_owned()
        } else {
            std::fs::read_to_string(issued.join(name)).unwrap_or_else(|e| {
                panic!("credential {name} is not a file `certs issue` writes: {e}")
            })
        };
        std::fs::write(cred_dir.join(name), content).expect("write credential");
    }
    names.sort_unstable();
    let mut expected: Vec<&str> = files.iter().map(String::as_str).collect();
    expected.push("token");
    expected.sort_unstable();
    assert_eq!(names, expected, "LoadCredential= names");

    // Specifiers as systemd fills them (%d only; any other would go unexpanded here).
    let cred = cred_dir.to_str().expect("utf-8 path");
    let mut args: Vec<String> = Vec::new();
    let mut config_path = None;
    for (i, a) in argv[1..].iter().enumerate() {
        let a = a.replace("%d", cred);
        assert!(!a.contains('%'), "unexpanded specifier in {a}");
        if i > 0 && argv[i] == "--config" {
            config_path = Some(a.clone());
            args.push(
                repo_file("deploy/systemd/tidemark.toml")
                    .to_str()
                    .expect("utf-8 path")
                    .to_owned(),
            );
        } else {
            args.push(a);
        }
    }
    assert_eq!(
        config_path.as_deref(),
        Some("/etc/tidemark/tidemark.toml"),
        "the unit reads the config where docs/deploy.md installs the sample"
    );

    let config = print_config(&args);
    assert_eq!(
        str_at(&config, "data_dir"),
        "/var/lib/tidemark",
        "data_dir must be StateDirectory's /var/lib/tidemark"
    );
    assert_eq!(str_at(&config, "peer.tls"), cred);
    assert_eq!(str_at(&config, "http.token"), "<redacted>");
    assert_eq!(str_at(&config, "http.listen"), "0.0.0.0:7700");
    assert_eq!(str_at(&config, "peer.listen"), "0.0.0.0:7701");
    assert!(
        config["peer"].get("advertise").is_some(),
        "peer.listen on 0.0.0.0 needs peer.advertise"
    );
    assert!(!strings_at(&config, "http.allowed_hosts").is_empty());

    // systemd's SIGKILL must not cut the drain short.
    let grace_ms = at(&config, "http.shutdown_grace_ms")
        .as_integer()
        .expect("an integer");
    let stop = directive(&d, "TimeoutStopSec");
    let stop_s: i64 = stop
        .first()
        .and_then(|s| s.strip_suffix('s'))
        .and_then(|s| s.parse().ok())
        .expect("TimeoutStopSec=Ns");
    assert!(
        stop_s * 1000 > grace_ms + 5000,
        "TimeoutStopSec={stop_s}s leaves no room after http.shutdown_grace_ms={grace_ms}"
    );
}

fn systemd_analyze() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("systemd-analyze"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("TIDEMARK_REQUIRE_SYSTEMD_ANALYZE").as_deref() != Ok("1"),
            "systemd-analyze is required (TIDEMARK_REQUIRE_SYSTEMD_ANALYZE=1) but not on PATH"
        );
        println!("skipped: systemd-analyze is not installed (Debian package `systemd`)");
    }
    found
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    // `verify` checks that ExecStart's binary exists: point it at the binary under test.
    let unit = read("deploy/systemd/tidemark.service");
    assert!(unit.contains("ExecStart=/usr/local/bin/tidemark "));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tidemark.service");
    std::fs::write(
        &path,
        unit.replace(
            "ExecStart=/usr/local/bin/tidemark ",
            &format!("ExecStart={BIN} "),
        ),
    )
    .expect("write unit");
    let out = Command::new(&analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Unknown or misspelt keys are only warnings (exit 0): any line about this unit fails.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("tidemark.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify ({}):\n{stderr}",
        out.status
    );

    // The hardening, as systemd scores it (0 = most confined, 10 = none).
    let out = Command::new(&analyze)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&path)
        .output()
        .expect("run systemd-analyze security");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let score: f64 = text
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for tidemark.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure score in:\n{text}"));
    assert!(score <= 2.0, "exposure {score} > 2.0:\n{text}");
}

#[test]
fn dockerfile_command_is_accepted_by_the_binary() {
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("cargo build --release --locked --bin tidemark"));
    let json_of = |instruction: &str| -> Vec<String> {
        let line = dockerfile
            .lines()
            .find(|l| l.starts_with(&format!("{instruction} [")))
            .unwrap_or_else(|| panic!("no exec-form {instruction} in the Dockerfile"));
        serde_json::from_str(&line[instruction.len() + 1..])
            .unwrap_or_else(|e| panic!("{instruction} is not a JSON array: {e}"))
    };
    assert_eq!(json_of("ENTRYPOINT"), ["/usr/local/bin/tidemark"]);
    let cmd = json_of("CMD");
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "docker-token\n").expect("write token");
    let args: Vec<String> = cmd
        .iter()
        .map(|a| {
            if a == "/run/secrets/tidemark-token" {
                token.to_str().expect("utf-8 path").to_owned()
            } else {
                a.clone()
            }
        })
        .collect();
    let config = print_config(&args);
    assert_eq!(str_at(&config, "data_dir"), "/var/lib/tidemark");
    assert!(dockerfile.contains("VOLUME [\"/var/lib/tidemark\"]"));
    assert_eq!(str_at(&config, "http.listen"), "0.0.0.0:7700");
    assert_eq!(str_at(&config, "http.token"), "<redacted>");
    let ignore = read(".dockerignore");
    for entry in ["target", "fuzz/target", ".git"] {
        assert!(
            ignore.lines().any(|l| l.trim() == entry),
            ".dockerignore lacks {entry}"
        );
    }
}
