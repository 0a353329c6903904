//! Mutual TLS over the cluster CA (docs/design/principles.md, "Authenticated peers").
//!
//! Both sides present a certificate and verify the other's chain to the cluster CA (validity
//! period included). The server name used to dial is not checked here, because a node dials
//! addresses, not names: the peer's node name is checked instead against the name it claims in
//! its first protocol message ([`cert_names_node`]), on both sides.

use super::NetError;
use super::certs::TlsDir;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use std::sync::Arc;

/// The ALPN protocol of the peer protocol.
pub(crate) const ALPN: &[u8] = b"tidemark/1";
/// The server name a dialer puts in its ClientHello (not verified; see the module doc).
pub(crate) const DIAL_NAME: &str = "tidemark-peer";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(e: impl std::fmt::Display) -> NetError {
    NetError::Tls(e.to_string())
}

fn roots(ca: CertificateDer<'static>) -> Result<Arc<rustls::RootCertStore>, NetError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).map_err(tls_err)?;
    Ok(Arc::new(roots))
}

/// Verifies the server's chain to the cluster CA, but not its name (checked after the
/// handshake against the claimed node name).
#[derive(Debug)]
struct ClusterServerVerifier {
    roots: Arc<rustls::RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ClusterServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The quinn server configuration: requires a client certificate issued by the cluster CA.
pub(crate) fn server_crypto(
    tls: &TlsDir,
) -> Result<quinn::crypto::rustls::QuicServerConfig, NetError> {
    let (ca, cert, key) = tls.parts().map_err(NetError::Tls)?;
    let provider = provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, Arc::clone(&provider))
        .build()
        .map_err(tls_err)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert], key)
        .map_err(tls_err)?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    quinn::crypto::rustls::QuicServerConfig::try_from(cfg).map_err(tls_err)
}

/// Checks a cluster identity before anything is started with it: the node key belongs to the
/// node certificate, and the certificate is issued by the directory's CA (what every peer
/// will check). The messages say which file is wrong.
pub(crate) fn check(tls: &TlsDir) -> Result<(), NetError> {
    let plain = |e: NetError| match e {
        NetError::Tls(m) if m.contains("keys may not be consistent") => NetError::Tls(
            "node.key is not the key of node.pem (a certificate and a key of different nodes?)"
                .into(),
        ),
        other => other,
    };
    server_crypto(tls).map_err(plain)?;
    client_crypto(tls).map_err(plain)?;
    let (ca, cert, _) = tls.parts().map_err(NetError::Tls)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
        .build()
        .map_err(tls_err)?;
    verifier
        .verify_client_cert(&cert, &[], UnixTime::now())
        .map_err(|e| {
            NetError::Tls(format!(
                "node.pem is not issued by the ca.pem beside it, or is not valid now ({e}): \
                 every peer would refuse it"
            ))
        })?;
    Ok(())
}

/// The quinn client configuration: presents our certificate, verifies the server's chain.
pub(crate) fn client_crypto(
    tls: &TlsDir,
) -> Result<quinn::crypto::rustls::QuicClientConfig, NetError> {
    let (ca, cert, key) = tls.parts().map_err(NetError::Tls)?;
    let provider = provider();
    let verifier = ClusterServerVerifier {
        roots: roots(ca)?,
        provider: Arc::clone(&provider),
    };
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(vec![cert], key)
        .map_err(tls_err)?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    quinn::crypto::rustls::QuicClientConfig::try_from(cfg).map_err(tls_err)
}

/// Does the (already chain-verified) end-entity certificate name node `name`?
pub(crate) fn cert_names_node(end_entity: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(cert) = ParsedCertificate::try_from(end_entity) else {
        return false;
    };
    let Ok(server_name) = ServerName::try_from(name) else {
        return false;
    };
    rustls::client::verify_server_name(&cert, &server_name).is_ok()
}

/// The verified certificate chain of a connection's peer (`None` if it presented none).
pub(crate) fn peer_end_entity(conn: &quinn::Connection) -> Option<CertificateDer<'static>> {
    let identity = conn.peer_identity()?;
    let certs = identity.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    certs.first().cloned()
}
