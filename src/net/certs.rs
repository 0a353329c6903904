//! Cluster identity (docs/design/principles.md, "Authenticated peers"): a cluster CA and node
//! certificates that name their node.
//!
//! A node certificate carries its node name as its only DNS subject-alternative name, is issued
//! by the cluster CA, and is valid for both TLS server and client authentication. Private keys
//! are written with mode 0600. The daemon's `tidemark certs init --out DIR` is [`init_ca`] and
//! `tidemark certs issue --ca DIR --name NODE --out DIR` is [`issue_node`]; a node is then given
//! the output directory, loaded with [`TlsDir::load`].

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// File name of the CA certificate (in a CA directory and in every node directory).
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA private key (only in the CA directory; mode 0600).
pub const CA_KEY_FILE: &str = "ca.key";
/// File name of the node certificate.
pub const NODE_CERT_FILE: &str = "node.pem";
/// File name of the node private key (mode 0600).
pub const NODE_KEY_FILE: &str = "node.key";

/// Default validity of a node certificate (10 years; rotate by issuing a new one).
const NODE_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Default validity of a CA certificate (20 years).
const CA_VALIDITY: Duration = Duration::from_secs(20 * 365 * 24 * 3600);
/// Certificates are valid from slightly before their creation (clock skew between nodes).
const BACKDATE: Duration = Duration::from_secs(3600);

/// Why certificates could not be created, read or written. Nothing was written unless the
/// variant says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// A file could not be read or written (a partial directory may remain on write).
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error (in the message, not a separate cause: a chain of causes would print
        /// it twice).
        error: std::io::Error,
    },
    /// A file is not the PEM certificate or key it should be.
    #[error("{path}: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The node name is not usable as a DNS name (1–63 of `a-z`, `0-9`, `-`, not starting or
    /// ending with `-`).
    #[error("invalid node name {0:?}: use 1-63 characters of a-z, 0-9 and '-'")]
    InvalidName(String),
    /// Key or certificate generation failed.
    #[error("certificate generation failed: {0}")]
    Generate(String),
}

fn gen_err(e: rcgen::Error) -> CertError {
    CertError::Generate(e.to_string())
}

/// Checks that `name` is a valid node name (usable as a DNS SAN).
///
/// # Errors
/// [`CertError::InvalidName`].
pub fn validate_node_name(name: &str) -> Result<(), CertError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(CertError::InvalidName(name.to_owned()))
    }
}

/// A cluster certificate authority: its certificate and private key, in PEM.
#[derive(Clone)]
pub struct ClusterCa {
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new CA with a fresh key (ECDSA P-256), valid from an hour ago for 20 years.
    ///
    /// # Errors
    /// [`CertError::Generate`].
    pub fn generate() -> Result<Self, CertError> {
        let key = KeyPair::generate().map_err(gen_err)?;
        let params = ca_params()?;
        let cert = params.self_signed(&key).map_err(gen_err)?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Loads `ca.pem` and `ca.key` from `dir`.
    ///
    /// # Errors
    /// [`CertError::Io`] or [`CertError::Parse`].
    pub fn load(dir: &Path) -> Result<Self, CertError> {
        let cert_pem = read(&dir.join(CA_CERT_FILE))?;
        let key_pem = read(&dir.join(CA_KEY_FILE))?;
        let ca = Self { cert_pem, key_pem };
        ca.signer().map_err(|e| CertError::Parse {
            path: dir.to_path_buf(),
            detail: e.to_string(),
        })?;
        Ok(ca)
    }

    /// Writes `ca.pem` and `ca.key` (mode 0600) into `dir`, creating it.
    ///
    /// # Errors
    /// [`CertError::Io`].
    pub fn save(&self, dir: &Path) -> Result<(), CertError> {
        create_dir(dir)?;
        write(&dir.join(CA_CERT_FILE), &self.cert_pem, false)?;
        write(&dir.join(CA_KEY_FILE), &self.key_pem, true)
    }

    /// The CA certificate in PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a certificate for node `name`, valid from an hour ago for 10 years.
    ///
    /// # Errors
    /// [`CertError::InvalidName`], [`CertError::Generate`].
    pub fn issue(&self, name: &str) -> Result<TlsDir, CertError> {
        let now = SystemTime::now();
        self.issue_valid(name, now - BACKDATE, now + NODE_VALIDITY)
    }

    /// Issues a certificate for node `name` valid in `[not_before, not_after]` (tests use
    /// this for expired and not-yet-valid certificates).
    ///
    /// # Errors
    /// [`CertError::InvalidName`], [`CertError::Generate`].
    pub fn issue_valid(
        &self,
        name: &str,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<TlsDir, CertError> {
        validate_node_name(name)?;
        let (ca_cert, ca_key) = self.signer()?;
        let key = KeyPair::generate().map_err(gen_err)?;
        let params = node_params(name, not_before, not_after)?;
        let cert = params.signed_by(&key, &ca_cert, &ca_key).map_err(gen_err)?;
        Ok(TlsDir {
            name: name.to_owned(),
            ca_pem: self.cert_pem.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA as rcgen needs it to sign.
    fn signer(&self) -> Result<(rcgen::Certificate, KeyPair), CertError> {
        let key = KeyPair::from_pem(&self.key_pem).map_err(gen_err)?;
        let params = CertificateParams::from_ca_cert_pem(&self.cert_pem).map_err(gen_err)?;
        let cert = params.self_signed(&key).map_err(gen_err)?;
        Ok((cert, key))
    }
}

fn ca_params() -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Tidemark cluster CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = SystemTime::now();
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + CA_VALIDITY).into();
    Ok(params)
}

fn node_params(
    name: &str,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::new(vec![name.to_owned()]).map_err(gen_err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    Ok(params)
}

/// A node's TLS material: the cluster CA certificate, the node certificate (naming the node)
/// and its private key, in PEM. What `--tls DIR` points at.
#[derive(Clone)]
pub struct TlsDir {
    name: String,
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for TlsDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsDir")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TlsDir {
    /// Loads `ca.pem`, `node.pem` and `node.key` from `dir`; the node name is the certificate's
    /// DNS subject-alternative name.
    ///
    /// # Errors
    /// [`CertError::Io`] or [`CertError::Parse`] (no or several DNS names, invalid PEM).
    pub fn load(dir: &Path) -> Result<Self, CertError> {
        let ca_pem = read(&dir.join(CA_CERT_FILE))?;
        let cert_path = dir.join(NODE_CERT_FILE);
        let cert_pem = read(&cert_path)?;
        let key_pem = read(&dir.join(NODE_KEY_FILE))?;
        let name = name_in_cert(&cert_pem).map_err(|detail| CertError::Parse {
            path: cert_path,
            detail,
        })?;
        let tls = Self {
            name,
            ca_pem,
            cert_pem,
            key_pem,
        };
        tls.parts().map_err(|detail| {
            // Name the file at fault: the detail says which part it is.
            let file = if detail.starts_with("CA certificate") {
                CA_CERT_FILE
            } else if detail.starts_with("node certificate") {
                NODE_CERT_FILE
            } else {
                NODE_KEY_FILE
            };
            CertError::Parse {
                path: dir.join(file),
                detail,
            }
        })?;
        Ok(tls)
    }

    /// Writes `ca.pem`, `node.pem` and `node.key` (mode 0600) into `dir`, creating it.
    ///
    /// # Errors
    /// [`CertError::Io`].
    pub fn save(&self, dir: &Path) -> Result<(), CertError> {
        create_dir(dir)?;
        write(&dir.join(CA_CERT_FILE), &self.ca_pem, false)?;
        write(&dir.join(NODE_CERT_FILE), &self.cert_pem, false)?;
        write(&dir.join(NODE_KEY_FILE), &self.key_pem, true)
    }

    /// A self-signed certificate naming `name` that trusts only itself (for tests of what a
    /// node must refuse: it is not issued by any cluster CA).
    ///
    /// # Errors
    /// [`CertError::InvalidName`], [`CertError::Generate`].
    pub fn self_signed(name: &str) -> Result<Self, CertError> {
        validate_node_name(name)?;
        let key = KeyPair::generate().map_err(gen_err)?;
        let now = SystemTime::now();
        let cert = node_params(name, now - BACKDATE, now + NODE_VALIDITY)?
            .self_signed(&key)
            .map_err(gen_err)?;
        Ok(Self {
            name: name.to_owned(),
            ca_pem: cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The node name this certificate is for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cluster CA certificate this node trusts, in PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The node certificate, in PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The node's private key, in PEM (keep it secret).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The same certificate and key, trusting another CA (tests: a node of one cluster that
    /// presents its certificate to another).
    pub fn with_ca(&self, ca: &ClusterCa) -> Self {
        Self {
            ca_pem: ca.cert_pem.clone(),
            ..self.clone()
        }
    }

    /// The DER forms rustls needs: (CA certificate, node certificate, node key).
    pub(crate) fn parts(&self) -> Result<DerParts, String> {
        use rustls_pki_types::pem::PemObject;
        let ca = rustls_pki_types::CertificateDer::from_pem_slice(self.ca_pem.as_bytes())
            .map_err(|e| format!("CA certificate: {e}"))?;
        let cert = rustls_pki_types::CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| format!("node certificate: {e}"))?;
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| format!("node key: {e}"))?;
        Ok((ca, cert, key))
    }
}

/// (CA certificate, node certificate, node key) in DER.
pub(crate) type DerParts = (
    rustls_pki_types::CertificateDer<'static>,
    rustls_pki_types::CertificateDer<'static>,
    rustls_pki_types::PrivateKeyDer<'static>,
);

/// The single DNS SAN of a PEM certificate.
fn name_in_cert(pem: &str) -> Result<String, String> {
    let params = CertificateParams::from_ca_cert_pem(pem).map_err(|e| e.to_string())?;
    let names: Vec<String> = params
        .subject_alt_names
        .iter()
        .filter_map(|s| match s {
            SanType::DnsName(n) => Some(n.as_str().to_owned()),
            _ => None,
        })
        .collect();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "a node certificate names exactly one node (DNS name), found {names:?}"
        )),
    }
}

/// `tidemark certs init --out DIR`: creates a new cluster CA and writes `ca.pem` and `ca.key`
/// (mode 0600) into `out`. Refuses to overwrite an existing CA key.
///
/// # Errors
/// [`CertError::Io`] (including an existing `ca.key`), [`CertError::Generate`].
pub fn init_ca(out: &Path) -> Result<ClusterCa, CertError> {
    let key_path = out.join(CA_KEY_FILE);
    if key_path.exists() {
        return Err(CertError::Io {
            path: key_path,
            error: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a CA key already exists here; refusing to overwrite it",
            ),
        });
    }
    let ca = ClusterCa::generate()?;
    ca.save(out)?;
    Ok(ca)
}

/// `tidemark certs issue --ca DIR --name NODE --out DIR`: issues a certificate for node `name`
/// with the CA in `ca_dir` and writes `ca.pem`, `node.pem` and `node.key` (mode 0600) into
/// `out`, ready for `--tls out`.
///
/// # Errors
/// [`CertError::InvalidName`], [`CertError::Io`], [`CertError::Parse`], [`CertError::Generate`].
pub fn issue_node(ca_dir: &Path, name: &str, out: &Path) -> Result<TlsDir, CertError> {
    validate_node_name(name)?;
    let ca = ClusterCa::load(ca_dir)?;
    let tls = ca.issue(name)?;
    tls.save(out)?;
    Ok(tls)
}

/// Zero-config identity: the TLS material in `dir` if present, else a new local CA and a
/// certificate for `name`, written there (the CA key stays in `dir/ca` so more local nodes can
/// be issued). The caller binds such a node to loopback only.
///
/// # Errors
/// As [`TlsDir::load`] and [`init_ca`].
pub fn ensure_local(dir: &Path, name: &str) -> Result<TlsDir, CertError> {
    if dir.join(NODE_CERT_FILE).exists() {
        return TlsDir::load(dir);
    }
    let ca = ClusterCa::generate()?;
    ca.save(&dir.join("ca"))?;
    let tls = ca.issue(name)?;
    tls.save(dir)?;
    Ok(tls)
}

fn read(path: &Path) -> Result<String, CertError> {
    std::fs::read_to_string(path).map_err(|error| CertError::Io {
        path: path.to_path_buf(),
        error,
    })
}

fn create_dir(dir: &Path) -> Result<(), CertError> {
    std::fs::create_dir_all(dir).map_err(|error| CertError::Io {
        path: dir.to_path_buf(),
        error,
    })
}

fn write(path: &Path, contents: &str, secret: bool) -> Result<(), CertError> {
    use std::io::Write;
    let io = |error| CertError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if secret { 0o600 } else { 0o644 });
    }
    let _ = secret;
    let mut f = opts.open(path).map_err(io)?;
    #[cfg(unix)]
    if secret {
        // An existing file keeps its mode on open: force it.
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io)?;
    }
    f.write_all(contents.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_issue_load_roundtrip_with_private_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_dir = dir.path().join("ca");
        let node_dir = dir.path().join("n1");
        init_ca(&ca_dir).expect("init");
        assert!(init_ca(&ca_dir).is_err(), "never overwrites a CA key");
        let issued = issue_node(&ca_dir, "node-1", &node_dir).expect("issue");
        let loaded = TlsDir::load(&node_dir).expect("load");
        assert_eq!(loaded.name(), "node-1");
        assert_eq!(loaded.cert_pem, issued.cert_pem);
        assert!(loaded.parts().is_ok());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for f in [ca_dir.join(CA_KEY_FILE), node_dir.join(NODE_KEY_FILE)] {
                let mode = std::fs::metadata(&f).expect("meta").permissions().mode();
                assert_eq!(mode & 0o777, 0o600, "{}", f.display());
            }
        }
        assert!(matches!(
            issue_node(&ca_dir, "Bad_Name", &node_dir),
            Err(CertError::InvalidName(_))
        ));
    }
}
