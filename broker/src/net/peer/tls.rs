//! TLS on peer links: mutual TLS 1.3 against the cluster's CA, with a
//! node's identity in its certificate.
//!
//! **How a certificate names its node.** A peer certificate carries the
//! DNS subject alternative name `node-<id>` (the id in decimal, no leading
//! zeros: [`node_name`]), exactly one such name; its other names (IP
//! addresses, host names) and its subject CN are not looked at. A
//! certificate naming no node, or several, names none
//! ([`certificate_node`]).
//!
//! [`PeerTls`] holds one node's side of it: its certificate chain and key
//! (whose certificate must name the node itself) and the cluster's CA, as
//! a rustls client config (for its senders) and a server config (for its
//! receiver), both TLS 1.3 only, without session resumption or tickets, so
//! every connection verifies both certificates in full.
//!
//! - `connect` (a sender's side) verifies the receiver's certificate
//!   against the CA and against the name `node-<to>` of the node it meant
//!   to reach (rustls' own name check), then that the certificate names
//!   that node only.
//! - `accept` (a receiver's side) requires a client certificate the CA
//!   signed (none, or another CA's, fails the handshake) and returns the
//!   node it names; the receiver then refuses any frame whose header is
//!   from another node.
//!
//! Both bound the handshake by a deadline (`PEER_HANDSHAKE_TIMEOUT`) and
//! the stop, and cap what rustls holds unsent
//! ([`PEER_TLS_SEND_BUFFER_BYTES`]). Revocation (CRLs) and reloading
//! certificates without a restart are not done here.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::future::or;
use glommio::net::TcpStream;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use spool_client::tls::{crypto_provider, read_certificates, read_private_key};

use super::limits::PEER_TLS_SEND_BUFFER_BYTES;
use super::PeerError;
use crate::net::stop::StopSignal;

/// A sender's TLS stream to a peer shard.
pub(super) type ClientStream = futures_rustls::client::TlsStream<TcpStream>;
/// A receiver's TLS stream from a peer.
pub(super) type ServerStream = futures_rustls::server::TlsStream<TcpStream>;

/// What a DNS name of a peer certificate starts with to name a node.
pub const NODE_NAME_PREFIX: &str = "node-";

/// The DNS name that names `node` in a peer certificate: `node-<id>`.
pub fn node_name(node: u64) -> String {
    format!("{NODE_NAME_PREFIX}{node}")
}

/// The node a peer certificate names: its one DNS subject alternative name
/// `node-<id>` (see the module docs).
///
/// # Errors
/// The certificate does not parse, or names no node, or several.
pub fn certificate_node(certificate: &CertificateDer<'_>) -> Result<u64, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref())
        .map_err(|error| format!("the certificate does not parse: {error}"))?;
    let names = parsed
        .subject_alternative_name()
        .map_err(|error| format!("the certificate's subject alternative names: {error}"))?;
    let mut nodes = names
        .iter()
        .flat_map(|names| names.value.general_names.iter())
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(name) => Some(*name),
            _ => None,
        })
        .filter_map(|name| {
            let id = name.strip_prefix(NODE_NAME_PREFIX)?.parse::<u64>().ok()?;
            // `node-02` or `node-+2` is not the name of node 2.
            (node_name(id) == name).then_some(id)
        });
    let Some(node) = nodes.next() else {
        return Err(format!("the certificate names no node (no DNS name {NODE_NAME_PREFIX}<id>)"));
    };
    if let Some(other) = nodes.next() {
        return Err(format!("the certificate names several nodes ({node}, {other}, ...)"));
    }
    Ok(node)
}

/// The PEM files a node's peer TLS is loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTlsFiles {
    /// The node's certificate chain, its own certificate (naming the node)
    /// first.
    pub cert_file: PathBuf,
    /// That certificate's private key.
    pub key_file: PathBuf,
    /// The cluster's CA certificates: every peer certificate must chain to
    /// one of them.
    pub ca_file: PathBuf,
}

/// One node's TLS on its peer links (see the module docs). Cheap to clone:
/// its configs are shared.
#[derive(Clone)]
pub struct PeerTls {
    node: u64,
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("PeerTls").field("node", &self.node).finish()
    }
}

fn setup(what: &str, error: impl std::fmt::Display) -> PeerError {
    PeerError::TlsSetup(format!("{what}: {error}"))
}

impl PeerTls {
    /// Node `node`'s peer TLS: it presents `chain` (its own certificate
    /// first, which must name `node`) with `key`, and trusts the CA
    /// certificates `ca` for every peer.
    ///
    /// # Errors
    /// [`PeerError::TlsSetup`] when the certificate names another node or
    /// none, a CA certificate is refused, or the key does not fit.
    pub fn new(
        node: u64,
        ca: &[CertificateDer<'static>],
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<PeerTls, PeerError> {
        let own = chain.first().ok_or_else(|| setup("certificate", "the chain is empty"))?;
        let named = certificate_node(own).map_err(|error| setup("certificate", error))?;
        if named != node {
            return Err(setup(
                "certificate",
                format!("it names node {named}, but this is node {node}"),
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        for certificate in ca {
            roots.add(certificate.clone()).map_err(|error| setup("CA certificate", error))?;
        }
        let roots = Arc::new(roots);
        let provider = crypto_provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|error| setup("CA certificates", error))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|error| setup("TLS", error))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|error| setup("key", error))?;
        server.send_tls13_tickets = 0;
        server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|error| setup("TLS", error))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|error| setup("key", error))?;
        client.resumption = rustls::client::Resumption::disabled();
        Ok(PeerTls { node, client: Arc::new(client), server: Arc::new(server) })
    }

    /// [`PeerTls::new`] from PEM files.
    ///
    /// # Errors
    /// [`PeerError::TlsSetup`] naming the file that cannot be used, or as
    /// [`PeerTls::new`].
    pub fn load(node: u64, files: &PeerTlsFiles) -> Result<PeerTls, PeerError> {
        let file = |error: spool_client::tls::TlsFileError| PeerError::TlsSetup(error.to_string());
        let ca = read_certificates("CA certificate", &files.ca_file).map_err(file)?;
        let chain = read_certificates("certificate", &files.cert_file).map_err(file)?;
        let key = read_private_key(&files.key_file).map_err(file)?;
        PeerTls::new(node, &ca, chain, key)
    }

    /// The node its certificate names (this node).
    pub fn node(&self) -> u64 {
        self.node
    }

    /// The rustls config its senders connect with.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.client.clone()
    }

    /// The rustls config its receiver accepts with.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server.clone()
    }
}

/// The node the verified certificate of the other side names.
fn peer_node(chain: Option<&[CertificateDer<'static>]>) -> Result<u64, PeerError> {
    let certificate = chain.and_then(|chain| chain.first()).ok_or_else(|| {
        PeerError::Certificate { reason: "the peer presented no certificate".to_owned() }
    })?;
    certificate_node(certificate).map_err(|reason| PeerError::Certificate { reason })
}

/// `handshake`'s outcome, or [`PeerError::HandshakeTimeout`] after
/// `timeout`, or [`PeerError::Stopped`] once `stop` trips.
async fn bounded<T>(
    handshake: impl Future<Output = std::io::Result<T>>,
    timeout: Duration,
    stop: &StopSignal,
) -> Result<T, PeerError> {
    let done = or(async { Some(handshake.await) }, async {
        or(glommio::timer::sleep(timeout), stop.wait()).await;
        None
    })
    .await;
    match done {
        Some(Ok(stream)) => Ok(stream),
        Some(Err(error)) => Err(PeerError::Handshake(error)),
        None if stop.is_stopped() => Err(PeerError::Stopped),
        None => Err(PeerError::HandshakeTimeout),
    }
}

/// A sender's handshake on a connected `stream` to node `to`: the
/// receiver's certificate verified against the CA and the name of `to`,
/// and naming no other node.
///
/// # Errors
/// [`PeerError::Handshake`] (a certificate refused, for one),
/// [`PeerError::HandshakeTimeout`], [`PeerError::Certificate`] for a
/// certificate naming several nodes, [`PeerError::Stopped`].
pub(super) async fn connect(
    tls: &PeerTls,
    to: u64,
    stream: TcpStream,
    timeout: Duration,
    stop: &StopSignal,
) -> Result<ClientStream, PeerError> {
    let name = ServerName::try_from(node_name(to))
        .map_err(|error| PeerError::TlsSetup(format!("server name of node {to}: {error}")))?;
    let connector = futures_rustls::TlsConnector::from(tls.client_config());
    let handshake = connector.connect_with(name, stream, |connection| {
        connection.set_buffer_limit(Some(PEER_TLS_SEND_BUFFER_BYTES));
    });
    let stream = bounded(handshake, timeout, stop).await?;
    let named = peer_node(stream.get_ref().1.peer_certificates())?;
    if named != to {
        return Err(PeerError::Certificate {
            reason: format!("the receiver's certificate names node {named}, not node {to}"),
        });
    }
    Ok(stream)
}

/// A receiver's handshake on an accepted `stream`: the peer's certificate
/// verified against the CA. Returns the stream and the node the
/// certificate names.
///
/// # Errors
/// [`PeerError::Handshake`] (no certificate, or one the CA did not sign),
/// [`PeerError::HandshakeTimeout`], [`PeerError::Certificate`] when the
/// certificate names no node or several, [`PeerError::Stopped`].
pub(super) async fn accept(
    tls: &PeerTls,
    stream: TcpStream,
    timeout: Duration,
    stop: &StopSignal,
) -> Result<(ServerStream, u64), PeerError> {
    let acceptor = futures_rustls::TlsAcceptor::from(tls.server_config());
    let handshake = acceptor.accept_with(stream, |connection| {
        connection.set_buffer_limit(Some(PEER_TLS_SEND_BUFFER_BYTES));
    });
    let stream = bounded(handshake, timeout, stop).await?;
    let node = peer_node(stream.get_ref().1.peer_certificates())?;
    Ok((stream, node))
}
