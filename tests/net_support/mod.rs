//! Shared helpers of the network tests: a cluster of embedded nodes in one process, each with
//! its own QUIC endpoint on 127.0.0.1 (mutual TLS, one cluster CA) and a fault-injecting socket.
#![allow(dead_code)]

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tidemark::net::{ClusterCa, Faults, NetOptions, TlsDir};
use tidemark::{Key, KeyKind, Node, NodeConfig, Value};

/// `SEED=<n>` or a time-derived seed, printed for replay.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("{test}: seed = {seed} (replay with SEED={seed})");
    seed
}

/// `SOAK=1` multiplies the work.
pub fn soak() -> bool {
    std::env::var("SOAK").is_ok_and(|v| v == "1")
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Short timeouts so tests notice lost peers and reconnect quickly.
pub fn test_options(faults: &Faults) -> NetOptions {
    let mut o = NetOptions::new(4 * 1024 * 1024);
    o.keep_alive = Duration::from_millis(200);
    o.idle_timeout = Duration::from_millis(1500);
    o.handshake_timeout = Duration::from_secs(2);
    o.redial_min = Duration::from_millis(50);
    o.redial_max = Duration::from_millis(400);
    o.faults = Some(faults.clone());
    o.swim.probe_period = Duration::from_millis(200);
    o.swim.probe_rtt = Duration::from_millis(100);
    o.swim.suspect_to_down = Duration::from_millis(800);
    o
}

pub fn localhost() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Every key of a node with its value, in order.
pub fn all_keys(node: &Node) -> Vec<(Key, Value)> {
    KeyKind::ALL
        .iter()
        .flat_map(|k| node.list(*k, "", None, 100_000).expect("list"))
        .collect()
}

pub struct Member {
    pub node: Node,
    pub addr: SocketAddr,
    pub faults: Faults,
    pub tls: TlsDir,
    pub dir: PathBuf,
}

/// Nodes `n0..` of one cluster CA, all joined to each other.
pub struct Cluster {
    pub ca: ClusterCa,
    pub members: Vec<Member>,
    /// The partition in force, if any.
    pub cut: Option<(Vec<usize>, Vec<usize>)>,
    _root: tempfile::TempDir,
}

impl Cluster {
    pub async fn start(n: usize, seed: u64) -> Cluster {
        let ca = ClusterCa::generate().expect("ca");
        let root = tempfile::tempdir().expect("tempdir");
        let mut members = Vec::new();
        for i in 0..n {
            let dir = root.path().join(format!("n{i}"));
            let tls = ca.issue(&format!("n{i}")).expect("issue");
            let faults = Faults::new(seed.wrapping_add(i as u64));
            let node = Node::open(NodeConfig::new(&dir)).await.expect("open");
            let addr = node
                .listen_with(localhost(), tls.clone(), test_options(&faults))
                .await
                .expect("listen");
            members.push(Member {
                node,
                addr,
                faults,
                tls,
                dir,
            });
        }
        let c = Cluster {
            ca,
            members,
            cut: None,
            _root: root,
        };
        for i in 0..n {
            c.join_all(i);
        }
        c
    }

    pub fn nodes(&self) -> Vec<Node> {
        self.members.iter().map(|m| m.node.clone()).collect()
    }

    /// Member `i` dials every other member.
    pub fn join_all(&self, i: usize) {
        for (j, m) in self.members.iter().enumerate() {
            if j != i {
                self.members[i].node.join_peer(m.addr).expect("join");
            }
        }
    }

    /// Shuts member `i` down and reopens it on the same directory (emptied first if `wipe`).
    /// It listens on a new port (quinn keeps a closed endpoint's port while its connections
    /// drain, so an in-process restart cannot rebind at once; a restarted daemon process
    /// can): every member dials the new address, and an active partition is applied to it.
    pub async fn restart(&mut self, i: usize, wipe: bool) {
        let m = &self.members[i];
        m.node.shutdown().await.expect("shutdown");
        if wipe {
            std::fs::remove_dir_all(&m.dir).expect("wipe");
        }
        let node = Node::open(NodeConfig::new(&m.dir)).await.expect("reopen");
        let addr = node
            .listen_with(localhost(), m.tls.clone(), test_options(&m.faults))
            .await
            .expect("listen");
        self.members[i].node = node;
        self.members[i].addr = addr;
        self.join_all(i);
        for (j, other) in self.members.iter().enumerate() {
            if j != i {
                other.node.join_peer(addr).expect("join");
            }
        }
        if let Some((a, b)) = self.cut.clone() {
            self.partition(&a, &b);
        }
    }

    /// Drops every datagram between the two groups (both directions).
    pub fn partition(&mut self, a: &[usize], b: &[usize]) {
        self.cut = Some((a.to_vec(), b.to_vec()));
        for &i in a {
            for &j in b {
                self.members[i].faults.block(self.members[j].addr);
                self.members[j].faults.block(self.members[i].addr);
            }
        }
    }

    pub fn heal(&mut self) {
        self.cut = None;
        for m in &self.members {
            m.faults.heal();
        }
    }

    /// Waits until every member holds the same context and the same values; returns the time.
    pub async fn converge(&self, limit: Duration) -> Duration {
        converge(&self.nodes(), limit).await
    }

    pub async fn shutdown(self) {
        for m in &self.members {
            m.node.shutdown().await.expect("shutdown");
        }
    }
}

/// Waits (bounded polling) until `nodes` hold the same context and values.
pub async fn converge(nodes: &[Node], limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let ctxs: Vec<_> = nodes.iter().map(|n| n.context().expect("ctx")).collect();
        if ctxs.windows(2).all(|w| w[0] == w[1]) {
            let values: Vec<_> = nodes.iter().map(all_keys).collect();
            if values.windows(2).all(|w| w[0] == w[1]) {
                return started.elapsed();
            }
        }
        if started.elapsed() > limit {
            let status: Vec<_> = nodes.iter().map(|n| n.net_status()).collect();
            panic!("no convergence within {limit:?}: {status:#?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A hand-driven QUIC client for refusal and hostile-peer tests: it presents `cert` (or none),
/// accepts any server certificate, and speaks the wire format directly.
pub mod raw {
    use rustls::DigitallySignedStruct;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use std::net::SocketAddr;
    use std::sync::Arc;
    use tidemark::net::TlsDir;

    #[derive(Debug)]
    struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    /// Dials `addr` presenting `cert` (none if `None`); the handshake result as quinn gives it.
    pub async fn connect(
        addr: SocketAddr,
        cert: Option<&TlsDir>,
    ) -> Result<quinn::Connection, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)));
        let mut cfg = match cert {
            Some(t) => {
                let c = CertificateDer::from_pem_slice(t.cert_pem().as_bytes())
                    .map_err(|e| e.to_string())?;
                let k = PrivateKeyDer::from_pem_slice(t.key_pem().as_bytes())
                    .map_err(|e| e.to_string())?;
                builder
                    .with_client_auth_cert(vec![c], k)
                    .map_err(|e| e.to_string())?
            }
            None => builder.with_no_client_auth(),
        };
        cfg.alpn_protocols = vec![b"tidemark/1".to_vec()];
        let quic =
            quinn::crypto::rustls::QuicClientConfig::try_from(cfg).map_err(|e| e.to_string())?;
        let endpoint = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0)))
            .map_err(|e| e.to_string())?;
        let conn = endpoint
            .connect_with(
                quinn::ClientConfig::new(Arc::new(quic)),
                addr,
                "tidemark-peer",
            )
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        Ok(conn)
    }

    /// The first frame's content: who the sender claims to be.
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Hello {
        pub name: String,
        pub instance: u64,
    }

    /// Writes one raw frame: 4-byte little-endian length, then `body`.
    pub async fn frame(send: &mut quinn::SendStream, body: &[u8]) -> Result<(), String> {
        send.write_all(&(body.len() as u32).to_le_bytes())
            .await
            .map_err(|e| e.to_string())?;
        send.write_all(body).await.map_err(|e| e.to_string())
    }

    /// Opens the stream and claims `name`; then waits for the node's hello. `Err` when the node
    /// refuses or closes.
    pub async fn hello(
        conn: &quinn::Connection,
        name: &str,
    ) -> Result<(quinn::SendStream, quinn::RecvStream), String> {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        let bytes = tidemark::codec::encode(
            "hello",
            &Hello {
                name: name.to_owned(),
                instance: 7,
            },
        )
        .map_err(|e| e.to_string())?;
        frame(&mut send, &bytes).await?;
        let mut len = [0u8; 4];
        recv.read_exact(&mut len).await.map_err(|e| e.to_string())?;
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        recv.read_exact(&mut body)
            .await
            .map_err(|e| e.to_string())?;
        Ok((send, recv))
    }
}
