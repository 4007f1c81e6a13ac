//! A CA made at test time (rcgen) and the certificates it signs for the
//! peer TLS tests: node certificates name their node by the DNS name
//! `node-<id>`.
// Test helpers panic on setup failures by design; not every test uses all.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use spool_broker::net::peer::PeerTls;

/// A CA, and certificates it signs.
pub struct Pki {
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let ca = params.self_signed(&ca_key).unwrap();
        Pki { ca, ca_key }
    }

    pub fn ca(&self) -> Vec<CertificateDer<'static>> {
        vec![self.ca.der().clone()]
    }

    /// A certificate with the DNS names `names` (and a CN that is not
    /// looked at), and its key.
    pub fn issue(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "node-99");
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![cert.der().clone()], key)
    }

    /// Node `node`'s peer TLS: a certificate naming `node-<node>`.
    pub fn node(&self, node: u64) -> PeerTls {
        let (chain, key) = self.issue(&[&format!("node-{node}"), "localhost"]);
        PeerTls::new(node, &self.ca(), chain, key).unwrap()
    }

    /// A client config trusting this CA, presenting `certificate` (a chain
    /// and key) if any: a peer built by hand.
    pub fn client(
        &self,
        certificate: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        let builder =
            rustls::ClientConfig::builder_with_provider(spool_client::tls::crypto_provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
        let config = match certificate {
            Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
            None => builder.with_no_client_auth(),
        };
        Arc::new(config)
    }
}
