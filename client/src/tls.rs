//! TLS for the client's shard connections (rustls with the ring provider).
//!
//! A [`TlsConfig`] in [`ConnectionConfig::tls`](crate::ConnectionConfig::tls)
//! (or [`ClientConfig::with_tls`](crate::ClientConfig::with_tls)) makes every
//! connection run a TLS handshake right after the TCP connect; the Spool
//! frames then travel inside TLS, unchanged. The broker's certificate is
//! checked against the CA certificates the config trusts and against the
//! server name: the host part of the address dialled (a DNS name or an IP
//! address, which the certificate must list), or the name set with
//! [`TlsConfig::with_server_name`]. A client certificate and key
//! ([`TlsConfig::with_client_certificate`]) let a broker that verifies them
//! authenticate the connection as the principal its subject CN names.
//!
//! The PEM readers ([`read_certificates`], [`read_private_key`]) are shared
//! with the broker, which loads its own certificate with them. A TLS client
//! on a plain port, and a plain client on a TLS port, fail with an error
//! that says so ([`ClientError::Tls`], [`PLAIN_PORT_HINT`],
//! [`TLS_PORT_HINT`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::error::ClientError;

/// Added to a failed handshake's error: the usual cause of a TLS client's
/// handshake failing on bytes that are not TLS.
pub const PLAIN_PORT_HINT: &str = "is the port plain TCP (a broker without TLS)?";
/// The reason a plain connection gives when the broker answered with a TLS
/// record (an alert): the port speaks TLS.
pub const TLS_PORT_HINT: &str = "the broker answered with a TLS record: the port speaks TLS; \
                                 connect with TLS (spool --tls-ca FILE, or ClientConfig::with_tls)";

/// A PEM file that cannot be used, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{what} file {}: {reason}", path.display())]
pub struct TlsFileError {
    /// What the file should hold ("certificate", "private key", "CA certificate").
    pub what: &'static str,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

impl TlsFileError {
    fn new(what: &'static str, path: &Path, reason: impl Into<String>) -> TlsFileError {
        TlsFileError { what, path: path.to_owned(), reason: reason.into() }
    }
}

fn pem_reason(error: &rustls::pki_types::pem::Error) -> String {
    match error {
        rustls::pki_types::pem::Error::Io(source) => format!("cannot read it: {source}"),
        other => format!("not valid PEM: {other}"),
    }
}

/// Every certificate (`BEGIN CERTIFICATE`) in the PEM file at `path`, in
/// file order (a chain: the end-entity certificate first).
///
/// # Errors
/// The file cannot be read, is not PEM, or holds no certificate; `what`
/// names the file's role in the message.
pub fn read_certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| TlsFileError::new(what, path, pem_reason(&error)))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsFileError::new(what, path, pem_reason(&error)))?;
    if certificates.is_empty() {
        return Err(TlsFileError::new(what, path, "no PEM certificate (BEGIN CERTIFICATE) in it"));
    }
    Ok(certificates)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1 PEM) in the file at `path`.
///
/// # Errors
/// The file cannot be read, is not PEM, or holds no private key.
pub fn read_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    const WHAT: &str = "private key";
    match PrivateKeyDer::from_pem_file(path) {
        Ok(key) => Ok(key),
        Err(rustls::pki_types::pem::Error::NoItemsFound) => Err(TlsFileError::new(
            WHAT,
            path,
            "no PEM private key (BEGIN PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY) in it",
        )),
        Err(error) => Err(TlsFileError::new(WHAT, path, pem_reason(&error))),
    }
}

/// The ring crypto provider, the only one this workspace builds.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How a connection speaks TLS: the rustls client config (trusted CAs,
/// optional client certificate) and an optional server name to check the
/// broker's certificate against instead of the host dialled. Cheap to
/// clone.
#[derive(Clone)]
pub struct TlsConfig {
    config: Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
    /// Kept to add a client certificate later.
    roots: Option<Arc<rustls::RootCertStore>>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TlsConfig")
            .field("server_name", &self.server_name)
            .field("client_certificate", &self.config.client_auth_cert_resolver.has_certs())
            .finish()
    }
}

fn rustls_error(context: &str, error: impl std::fmt::Display) -> ClientError {
    ClientError::Config(format!("{context}: {error}"))
}

impl TlsConfig {
    /// Trusts the CA certificates of the PEM file `ca_file` (and nothing
    /// else); no client certificate.
    ///
    /// # Errors
    /// [`ClientError::Config`] naming the file when it cannot be used.
    pub fn trusting(ca_file: &Path) -> Result<TlsConfig, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        for certificate in read_certificates("CA certificate", ca_file)
            .map_err(|error| ClientError::Config(error.to_string()))?
        {
            roots.add(certificate).map_err(|error| {
                ClientError::Config(format!("CA certificate file {}: {error}", ca_file.display()))
            })?;
        }
        let roots = Arc::new(roots);
        let config = Self::builder()?.with_root_certificates(roots.clone()).with_no_client_auth();
        Ok(TlsConfig { config: Arc::new(config), server_name: None, roots: Some(roots) })
    }

    fn builder(
    ) -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>, ClientError>
    {
        rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| rustls_error("TLS", error))
    }

    /// Presents the certificate chain of `cert_file` with the key of
    /// `key_file` (PEM) when the broker asks for a client certificate.
    ///
    /// # Errors
    /// [`ClientError::Config`] naming the file when it cannot be used, or
    /// when the key does not match the certificate; also for a config made
    /// with [`TlsConfig::from_rustls`] (set the certificate there).
    pub fn with_client_certificate(
        self,
        cert_file: &Path,
        key_file: &Path,
    ) -> Result<TlsConfig, ClientError> {
        let Some(roots) = self.roots.clone() else {
            return Err(ClientError::Config(
                "a client certificate goes into a rustls config built with TlsConfig::trusting"
                    .to_owned(),
            ));
        };
        let chain = read_certificates("client certificate", cert_file)
            .map_err(|error| ClientError::Config(error.to_string()))?;
        let key =
            read_private_key(key_file).map_err(|error| ClientError::Config(error.to_string()))?;
        let config = Self::builder()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|error| {
                rustls_error(
                    &format!(
                        "client certificate {} with key {}",
                        cert_file.display(),
                        key_file.display()
                    ),
                    error,
                )
            })?;
        Ok(TlsConfig { config: Arc::new(config), ..self })
    }

    /// Checks the broker's certificate against `name` (a DNS name or an IP
    /// address) instead of the host part of the address dialled.
    ///
    /// # Errors
    /// [`ClientError::Config`] when `name` is neither.
    pub fn with_server_name(self, name: &str) -> Result<TlsConfig, ClientError> {
        let server_name = ServerName::try_from(name.to_owned())
            .map_err(|error| rustls_error(&format!("TLS server name {name:?}"), error))?;
        Ok(TlsConfig { server_name: Some(server_name), ..self })
    }

    /// A config made by the caller (its own verifier, say).
    pub fn from_rustls(config: Arc<rustls::ClientConfig>) -> TlsConfig {
        TlsConfig { config, server_name: None, roots: None }
    }

    /// The name the broker's certificate is checked against when dialling
    /// `addr` (`host:port`, `[v6]:port`).
    ///
    /// # Errors
    /// [`ClientError::Config`] when the host is neither a DNS name nor an
    /// IP address.
    pub fn server_name_for(&self, addr: &str) -> Result<ServerName<'static>, ClientError> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        let host = addr.rsplit_once(':').map_or(addr, |(host, _port)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_owned()).map_err(|error| {
            rustls_error(
                &format!("TLS server name from {addr:?} (set one with --tls-server-name)"),
                error,
            )
        })
    }

    /// A tokio-rustls connector with this config (the client connections
    /// use it; so does the CLI's admin-port client).
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.config.clone())
    }
}

/// The TLS settings of a command line (`spool`, `spool-bench`): TLS is on
/// when a CA file is given; the server name and the client certificate
/// (both files) are optional.
///
/// # Errors
/// [`ClientError::Config`] for an option without the CA, a certificate
/// without its key (or the reverse), or a file that cannot be used.
pub fn from_options(
    ca_file: Option<&Path>,
    server_name: Option<&str>,
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
) -> Result<Option<TlsConfig>, ClientError> {
    let Some(ca_file) = ca_file else {
        if server_name.is_some() || cert_file.is_some() || key_file.is_some() {
            return Err(ClientError::Config(
                "TLS options need the CA to trust: --tls-ca FILE (SPOOL_TLS_CA)".to_owned(),
            ));
        }
        return Ok(None);
    };
    let mut tls = TlsConfig::trusting(ca_file)?;
    match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => {
            tls = tls.with_client_certificate(cert_file, key_file)?;
        }
        (None, None) => {}
        _ => {
            return Err(ClientError::Config(
                "a client certificate needs both --tls-cert and --tls-key".to_owned(),
            ))
        }
    }
    if let Some(name) = server_name {
        tls = tls.with_server_name(name)?;
    }
    Ok(Some(tls))
}

/// The first bytes of a TLS record that carries an alert (content type 21,
/// major version 3): what a TLS broker sends a plain client before closing.
pub(crate) fn looks_like_tls_alert(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15, 0x03, ..])
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the name checked defaults to the host dialled, IPv6 included,
    // and an override wins. Method: ask for a few addresses.
    #[test]
    fn server_name_is_the_host_dialled_or_the_override() {
        let dir = tempfile_dir();
        let ca = dir.join("ca.pem");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
        let config = TlsConfig::trusting(&ca).unwrap();
        assert_eq!(
            config.server_name_for("localhost:7400").unwrap(),
            ServerName::try_from("localhost").unwrap()
        );
        assert_eq!(
            config.server_name_for("127.0.0.1:7400").unwrap(),
            ServerName::try_from("127.0.0.1").unwrap()
        );
        assert_eq!(
            config.server_name_for("[::1]:7400").unwrap(),
            ServerName::try_from("::1").unwrap()
        );
        let named = config.with_server_name("broker.example").unwrap();
        assert_eq!(
            named.server_name_for("127.0.0.1:7400").unwrap(),
            ServerName::try_from("broker.example").unwrap()
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    // Goal: a file that is missing or holds no certificate is refused with
    // its name in the message. Method: point at both.
    #[test]
    fn unusable_files_are_named() {
        let dir = tempfile_dir();
        let missing = dir.join("missing.pem");
        let error = TlsConfig::trusting(&missing).unwrap_err().to_string();
        assert!(error.contains("missing.pem") && error.contains("cannot read"), "{error}");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not pem at all\n").unwrap();
        let error = TlsConfig::trusting(&empty).unwrap_err().to_string();
        assert!(error.contains("empty.pem") && error.contains("no PEM certificate"), "{error}");
        let error = read_private_key(&empty).unwrap_err().to_string();
        assert!(error.contains("empty.pem") && error.contains("no PEM private key"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_tls_alert_record_is_recognised() {
        assert!(looks_like_tls_alert(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]));
        assert!(!looks_like_tls_alert(&[0x00, 0x00, 0x00, 0x18]));
        assert!(!looks_like_tls_alert(&[0x15]));
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "spool-client-tls-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
