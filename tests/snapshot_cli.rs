//! `tidemark snapshot` and `tidemark serve --restore`: a stopped node's data directory is
//! snapshotted (verified, never overwritten, refused while the node runs), and a daemon served
//! from the snapshot holds the same values under a new replica id; restoring into a non-empty
//! directory fails with a clear message.

mod daemon_support;

use daemon_support::spawn_serve;
use std::ffi::OsStr;
use std::process::{Child, Command, Output};
use tidemark::{Key, KeyKind, Node, NodeConfig, Op, Value};

const BIN: &str = env!("CARGO_BIN_EXE_tidemark");

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout {}\nstderr {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(BIN).args(args).output().expect("run")
}

/// `serve --restore FILE` on free ports; returns the child and its HTTP URL.
fn serve(data: &std::path::Path, restore: &std::path::Path) -> (Child, String) {
    let http: &OsStr = "127.0.0.1:0".as_ref();
    let (child, url, _) = spawn_serve(&[
        "--http".as_ref(),
        http,
        "--peer-listen".as_ref(),
        http,
        "--data".as_ref(),
        data.as_os_str(),
        "--restore".as_ref(),
        restore.as_os_str(),
    ]);
    (child, url)
}

#[test]
fn snapshot_command_and_serve_restore() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let snap = tmp.path().join("backup.tmsnap");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let source = rt.block_on(async {
        let node = Node::open(NodeConfig::new(&data)).await.expect("open");
        node.apply_batch(vec![Op::inc_gcounter("visits", 42), Op::add("tags", "a")])
            .await
            .expect("write");
        // While the node runs, its directory is locked: the command says so.
        let o = run(&[
            "snapshot".as_ref(),
            "--data".as_ref(),
            data.as_os_str(),
            "--out".as_ref(),
            snap.as_os_str(),
        ]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            text(&o).contains("is the node still running"),
            "{}",
            text(&o)
        );
        assert!(!snap.exists());
        let id = node.replica_id();
        node.shutdown().await.expect("shutdown");
        id
    });
    let o = run(&[
        "--json".as_ref(),
        "snapshot".as_ref(),
        "--data".as_ref(),
        data.as_os_str(),
        "--out".as_ref(),
        snap.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let header: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json header");
    assert_eq!(header["source_replica"], source.to_string());
    // Never overwritten; --verify reads it back.
    let o = run(&[
        "snapshot".as_ref(),
        "--data".as_ref(),
        data.as_os_str(),
        "--out".as_ref(),
        snap.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("already exists"), "{}", text(&o));
    let o = run(&["snapshot".as_ref(), "--verify".as_ref(), snap.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("verified"), "{}", text(&o));
    // A data directory's database is not a snapshot.
    let db = data.join(tidemark::store::DB_FILE);
    let o = run(&["snapshot".as_ref(), "--verify".as_ref(), db.as_os_str()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // serve --restore into a non-empty directory: refused, clearly.
    let o = Command::new(BIN)
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            "127.0.0.1:0",
            "--data",
        ])
        .arg(&data)
        .arg("--restore")
        .arg(&snap)
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("not empty"), "{}", text(&o));
    // serve --restore into a new directory: the same values, a new replica id.
    let restored = tmp.path().join("restored");
    let (mut child, url) = serve(&restored, &snap);
    let get = |key: &str| {
        let o = Command::new(BIN)
            .args(["--url", &url, "--json", "get", key])
            .output()
            .expect("get");
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("json")["value"].clone()
    };
    assert_eq!(get("gcounter/visits"), 42);
    assert_eq!(get("orset/tags"), serde_json::json!(["a"]));
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    assert_eq!(child.wait().expect("wait").code(), Some(0));
    let node = rt
        .block_on(Node::open(NodeConfig::new(&restored)))
        .expect("open");
    assert_ne!(
        node.replica_id(),
        source,
        "the restored daemon took a new replica id"
    );
    assert_eq!(
        node.get(&Key::new(KeyKind::GCounter, "visits"))
            .expect("get"),
        Value::GCounter(42)
    );
    rt.block_on(node.shutdown()).expect("shutdown");
}
