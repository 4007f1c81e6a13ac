//! TLS on the admin port, and for the API gateway's own connections to the
//! shard ports.
//!
//! With TLS configured the admin port speaks HTTPS only: each accepted
//! connection runs the rustls handshake (tokio-rustls, the same shared
//! `ServerConfig` as the shards, so the same certificate), bounded by
//! [`TLS_HANDSHAKE_TIMEOUT`], before hyper sees it. A failed handshake
//! closes the connection and is logged (debug: an operator's mistyped
//! `http://` is not an incident).
//!
//! The gateway reaches the shards over loopback TLS with
//! [`gateway_client_tls`]: it trusts exactly the broker's own certificate
//! (the bytes it loaded, with the handshake's signature checked against its
//! key), whatever the host name, so the broker's certificate need not list
//! the loopback address.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use spool_client::TlsConfig;

use crate::limits::TLS_HANDSHAKE_TIMEOUT;
use crate::net::tls::TlsServer;

/// Runs the server side of the handshake on an accepted admin connection;
/// `None` (logged) when it fails or takes longer than
/// [`TLS_HANDSHAKE_TIMEOUT`].
pub async fn accept(
    acceptor: &tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let peer = stream.peer_addr().ok();
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            tracing::debug!(?peer, %error, "admin port: TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(?peer, "admin port: no TLS handshake in time");
            None
        }
    }
}

/// Accepts the one certificate the broker serves.
#[derive(Debug)]
struct OwnCertificate {
    own: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for OwnCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.own.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "the shard port presented a certificate other than the broker's own".to_owned(),
            ))
        }
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

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS the gateway's client uses towards the shards: only the broker's
/// own certificate is trusted.
///
/// # Errors
/// rustls refuses the protocol versions (never with the ring provider).
pub fn gateway_client_tls(server: &TlsServer) -> Result<TlsConfig, rustls::Error> {
    let provider = spool_client::tls::crypto_provider();
    let own = server.chain().first().cloned().ok_or(rustls::Error::NoCertificatesPresented)?;
    let verifier = OwnCertificate { own, provider: provider.clone() };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(TlsConfig::from_rustls(Arc::new(config)))
}
