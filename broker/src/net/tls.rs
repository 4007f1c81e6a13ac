//! TLS on the shard ports (rustls with the ring provider).
//!
//! Owns the server side of TLS: [`TlsServer::load`] reads the PEM
//! certificate chain and key (`tls_cert_file`, `tls_key_file`) and, when
//! `tls_client_ca_file` is set, the CA that client certificates are
//! verified against, into one rustls `ServerConfig` that every shard (and
//! the admin port) shares through an `Arc`. A bad or missing file fails
//! start-up with an error naming the setting and the file.
//!
//! [`serve_tls`] runs one accepted connection: the handshake, bounded by
//! [`TLS_HANDSHAKE_TIMEOUT`](crate::limits::TLS_HANDSHAKE_TIMEOUT) and by
//! the shard's stop, then the ordinary connection loop
//! ([`serve`](crate::net::connection::serve)) over the TLS stream: the
//! frames inside are unchanged. A handshake that fails (a plain client on
//! the port, a certificate the CA did not sign, a peer that stalls) closes
//! the connection and is counted per shard (`AcceptStats`,
//! `spool_shard_tls_handshake_failures_total`) and as the rejection
//! [`REJECT_TLS_HANDSHAKE`] (logged at most once a second).
//!
//! Client certificates are optional: a connection without one
//! authenticates with the Authenticate handshake as before. One verified
//! against `tls_client_ca_file` names the connection's principal in its
//! subject CN ([`certificate_principal`]); the handler decides what that
//! means ([`FrameHandler::certificate_principal`]: the broker's
//! authenticates the connection as that principal of the auth file).

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use futures_lite::future::or;
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use glommio::timer::Timer;
use rustls::pki_types::CertificateDer;
use spool_client::tls::{crypto_provider, read_certificates, read_private_key, TlsFileError};
use thiserror::Error;

use crate::limits::{REFUSAL_LINGER, TLS_CONNECTION_MEMORY_BYTES, TLS_HANDSHAKE_TIMEOUT};
use crate::net::accept_stats::AcceptStats;
use crate::net::connection::{serve, Connection, ConnectionEnd, ConnectionLimits, FrameHandler};
use crate::net::stop::StopSignal;

/// Rejection reason: a TLS handshake that failed or timed out.
pub const REJECT_TLS_HANDSHAKE: &str = "tls_handshake_failed";
/// Rejection reason: a verified client certificate the handler refused
/// (its principal is unknown) or whose subject names no principal.
pub const REJECT_CERTIFICATE_PRINCIPAL: &str = "client_certificate_refused";

/// Why TLS could not be set up. Each names the setting and its file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("{setting}: {source}")]
    File { setting: &'static str, source: TlsFileError },
    #[error("{setting} = {}: {reason}", path.display())]
    Refused { setting: &'static str, path: PathBuf, reason: String },
}

/// The files TLS is configured from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the broker's own certificate first.
    pub cert_file: PathBuf,
    /// PEM private key of that certificate.
    pub key_file: PathBuf,
    /// PEM CA certificates that client certificates are verified against;
    /// `None`: no client certificates are asked for.
    pub client_ca_file: Option<PathBuf>,
}

/// The loaded TLS settings: one rustls server config, shared.
#[derive(Clone)]
pub struct TlsServer {
    files: TlsFiles,
    config: Arc<rustls::ServerConfig>,
    chain: Arc<Vec<CertificateDer<'static>>>,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("TlsServer").field("files", &self.files).finish()
    }
}

/// Two settings are the same when they came from the same files.
impl PartialEq for TlsServer {
    fn eq(&self, other: &Self) -> bool {
        self.files == other.files
    }
}

impl Eq for TlsServer {}

impl TlsServer {
    /// Reads the files and builds the server config.
    ///
    /// # Errors
    /// [`TlsError`] naming the setting and file that cannot be used (missing,
    /// not PEM, no certificate or key in it, a key that does not match the
    /// certificate, a CA file rustls refuses).
    pub fn load(files: TlsFiles) -> Result<TlsServer, TlsError> {
        let chain = read_certificates("certificate", &files.cert_file)
            .map_err(|source| TlsError::File { setting: "tls_cert_file", source })?;
        let key = read_private_key(&files.key_file)
            .map_err(|source| TlsError::File { setting: "tls_key_file", source })?;
        let provider = crypto_provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Refused {
                setting: "tls_cert_file",
                path: files.cert_file.clone(),
                reason: error.to_string(),
            })?;
        let builder = match &files.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let refused = |reason: String| TlsError::Refused {
                    setting: "tls_client_ca_file",
                    path: path.clone(),
                    reason,
                };
                let mut roots = rustls::RootCertStore::empty();
                for certificate in read_certificates("CA certificate", path)
                    .map_err(|source| TlsError::File { setting: "tls_client_ca_file", source })?
                {
                    roots.add(certificate).map_err(|error| refused(error.to_string()))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .allow_unauthenticated()
                .build()
                .map_err(|error| refused(error.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config =
            builder.with_single_cert(chain.clone(), key).map_err(|error| TlsError::Refused {
                setting: "tls_key_file",
                path: files.key_file.clone(),
                reason: format!(
                    "does not fit the certificate of {}: {error}",
                    files.cert_file.display()
                ),
            })?;
        Ok(TlsServer { files, config: Arc::new(config), chain: Arc::new(chain) })
    }

    /// The files it came from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Whether client certificates are asked for (and verified).
    pub fn verifies_clients(&self) -> bool {
        self.files.client_ca_file.is_some()
    }

    /// The shared rustls server config.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.config.clone()
    }

    /// The broker's certificate chain (its own certificate first).
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }
}

/// The principal a client certificate names: its subject's first common
/// name (CN).
///
/// # Errors
/// The certificate does not parse or its subject has no UTF-8 CN.
pub fn certificate_principal(certificate: &CertificateDer<'_>) -> Result<String, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref())
        .map_err(|error| format!("the client certificate does not parse: {error}"))?;
    let common_name = parsed
        .subject()
        .iter_common_name()
        .next()
        .ok_or_else(|| "the client certificate's subject has no common name (CN)".to_owned())?;
    let name = common_name
        .as_str()
        .map_err(|error| format!("the client certificate's CN is not text: {error}"))?;
    Ok(name.to_owned())
}

/// Serves one accepted connection over TLS: the handshake (at most
/// [`TLS_HANDSHAKE_TIMEOUT`], and not past the shard's stop), the client
/// certificate's principal if one was verified, then the connection loop.
pub async fn serve_tls<H: FrameHandler>(
    stream: TcpStream,
    tls: &TlsServer,
    handler: Rc<H>,
    limits: ConnectionLimits,
    stop: StopSignal,
    connection: Rc<Connection>,
    stats: &AcceptStats,
) -> ConnectionEnd {
    let peer = stream.peer_addr().ok();
    // rustls' buffers for this connection draw from the shard's requests
    // pool, held for the connection's life: while the pool is spent, a new
    // TLS connection waits here (within the handshake's deadline) instead
    // of allocating.
    let memory = crate::net::memory::ShardMemory::of_this_shard();
    let buffers = or(
        async { Some(memory.requests.take(connection.id(), TLS_CONNECTION_MEMORY_BYTES).await) },
        async {
            let timeout = async {
                Timer::new(TLS_HANDSHAKE_TIMEOUT).await;
            };
            or(timeout, stop.wait()).await;
            None
        },
    )
    .await;
    let Some(_buffers) = buffers else {
        if stop.is_stopped() {
            return ConnectionEnd::Stopped;
        }
        let timeout_ms = TLS_HANDSHAKE_TIMEOUT.as_millis();
        return handshake_failed(
            stats,
            peer,
            format!("no memory for its TLS buffers within {timeout_ms} ms (memory_bytes)"),
        );
    };
    let acceptor = futures_rustls::TlsAcceptor::from(tls.config());
    let handshake = or(async { Some(acceptor.accept(stream).await) }, async {
        let timeout = async {
            Timer::new(TLS_HANDSHAKE_TIMEOUT).await;
        };
        or(timeout, stop.wait()).await;
        None
    })
    .await;
    let mut stream = match handshake {
        Some(Ok(stream)) => stream,
        Some(Err(error)) => {
            // rustls calls bytes that are not TLS corrupt (InvalidData).
            let hint = if error.kind() == std::io::ErrorKind::InvalidData
                && !error.to_string().contains("certificate")
            {
                " (not TLS: a plain client on a TLS port?)"
            } else {
                ""
            };
            return handshake_failed(stats, peer, format!("{error}{hint}"));
        }
        None if stop.is_stopped() => return ConnectionEnd::Stopped,
        None => {
            let timeout_ms = TLS_HANDSHAKE_TIMEOUT.as_millis();
            return handshake_failed(stats, peer, format!("no handshake within {timeout_ms} ms"));
        }
    };
    let verified = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first().cloned());
    if let Some(certificate) = verified {
        let accepted = match certificate_principal(&certificate) {
            Ok(principal) => handler
                .certificate_principal(&principal, &connection)
                .map_err(|response| (format!("principal {principal:?}"), response)),
            // No principal to tell the handler of: closed without a word.
            Err(reason) => Err((reason, None)),
        };
        if let Err((what, response)) = accepted {
            stats.rejections.record(
                REJECT_CERTIFICATE_PRINCIPAL,
                &format_args!("client certificate of {peer:?} refused: {what}"),
            );
            if let Some(response) = response {
                let told = async {
                    stream.write_all(response.as_ref()).await?;
                    stream.flush().await?;
                    stream.close().await
                };
                let _ = or(told, async {
                    Timer::new(REFUSAL_LINGER).await;
                    Ok(())
                })
                .await;
            }
            return ConnectionEnd::Tls(format!("client certificate refused: {what}"));
        }
    }
    serve(stream, handler, limits, stop, connection).await
}

fn handshake_failed(
    stats: &AcceptStats,
    peer: Option<std::net::SocketAddr>,
    reason: String,
) -> ConnectionEnd {
    stats.tls_handshake_failures.set(stats.tls_handshake_failures.get() + 1);
    stats.rejections.record(
        REJECT_TLS_HANDSHAKE,
        &format_args!("TLS handshake with {peer:?} failed: {reason}"),
    );
    ConnectionEnd::Tls(reason)
}

/// Whether `path` is set, for the start-up line.
pub fn describe(files: &TlsFiles) -> String {
    let show = |path: &Path| path.display().to_string();
    match &files.client_ca_file {
        None => format!("certificate {}, no client certificates", show(&files.cert_file)),
        Some(ca) => format!(
            "certificate {}, client certificates verified against {} (optional)",
            show(&files.cert_file),
            show(ca)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        dir: tempfile::TempDir,
        ca: rcgen::Certificate,
        ca_key: rcgen::KeyPair,
    }

    impl Pki {
        fn new() -> Pki {
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.distinguished_name.push(rcgen::DnType::CommonName, "test ca");
            let ca = params.self_signed(&ca_key).unwrap();
            Pki { dir: tempfile::tempdir().unwrap(), ca, ca_key }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        /// Writes a leaf certificate with `cn` and SANs, and its key.
        fn leaf(&self, name: &str, cn: Option<&str>) -> (PathBuf, PathBuf) {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
            // rcgen's default subject has a CN of its own.
            params.distinguished_name = rcgen::DistinguishedName::new();
            if let Some(cn) = cn {
                params.distinguished_name.push(rcgen::DnType::CommonName, cn);
            }
            let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
            let cert_path = self.path(&format!("{name}.pem"));
            let key_path = self.path(&format!("{name}.key"));
            std::fs::write(&cert_path, cert.pem()).unwrap();
            std::fs::write(&key_path, key.serialize_pem()).unwrap();
            (cert_path, key_path)
        }

        fn ca_file(&self) -> PathBuf {
            let path = self.path("ca.pem");
            std::fs::write(&path, self.ca.pem()).unwrap();
            path
        }
    }

    // Goal: good files load, with and without a client CA; each kind of bad
    // file fails naming its setting and file. Method: generate a CA and
    // certificates, then break one file at a time.
    #[test]
    fn load_names_the_setting_and_file_that_cannot_be_used() {
        let pki = Pki::new();
        let (cert, key) = pki.leaf("server", Some("localhost"));
        let files =
            TlsFiles { cert_file: cert.clone(), key_file: key.clone(), client_ca_file: None };
        let plain = TlsServer::load(files.clone()).unwrap();
        assert!(!plain.verifies_clients());
        assert_eq!(plain.chain().len(), 1);
        let with_ca =
            TlsServer::load(TlsFiles { client_ca_file: Some(pki.ca_file()), ..files.clone() })
                .unwrap();
        assert!(with_ca.verifies_clients());

        let missing = pki.path("missing.pem");
        let error = TlsServer::load(TlsFiles { cert_file: missing.clone(), ..files.clone() })
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("tls_cert_file: "), "{error}");
        assert!(error.contains("missing.pem") && error.contains("cannot read"), "{error}");

        let error = TlsServer::load(TlsFiles { key_file: cert.clone(), ..files.clone() })
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("tls_key_file: "), "{error}");
        assert!(error.contains("no PEM private key"), "{error}");

        let (_, other_key) = pki.leaf("other", Some("other"));
        let error = TlsServer::load(TlsFiles { key_file: other_key, ..files.clone() })
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("tls_key_file = "), "{error}");
        assert!(error.contains("does not fit the certificate"), "{error}");

        let error = TlsServer::load(TlsFiles { client_ca_file: Some(key), ..files })
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("tls_client_ca_file: "), "{error}");
        assert!(error.contains("no PEM certificate"), "{error}");
    }

    // Goal: the principal is the subject's CN; a certificate without one
    // names none. Method: parse two generated certificates.
    #[test]
    fn the_principal_is_the_subject_common_name() {
        let pki = Pki::new();
        let (with_cn, _) = pki.leaf("worker", Some("worker-7"));
        let chain = read_certificates("certificate", &with_cn).unwrap();
        assert_eq!(certificate_principal(&chain[0]).unwrap(), "worker-7");
        let (without, _) = pki.leaf("nameless", None);
        let chain = read_certificates("certificate", &without).unwrap();
        let error = certificate_principal(&chain[0]).unwrap_err();
        assert!(error.contains("no common name"), "{error}");
        assert!(certificate_principal(&CertificateDer::from(vec![1, 2, 3])).is_err());
    }
}
