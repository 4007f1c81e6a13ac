//! TLS against a real `spoold` over real TCP, with a CA and certificates
//! generated for the test (rcgen, in a temporary directory; no key is kept
//! anywhere): the binary protocol (client library and CLI) and the admin
//! port (health, metrics and the API gateway over https) through TLS; a
//! plain client on a TLS port and a TLS client on a plain port fail with an
//! error that says so, on both sides, while the broker goes on serving;
//! client certificates signed by the configured CA authenticate as their CN
//! principal (whose ACL applies), and one from another CA is refused.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use spool_client::spool_wire::proto::{ListQueuesRequest, PartitionId, Request};
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    Admin, ClaimOptions, Client, ClientConfig, ClientError, Connection, ConnectionConfig,
    Credentials, Message, TlsConfig,
};
use spool_tests::admin::{parse_answer, Exposition, HttpAnswer};
use spool_tests::auth::{write_auth_file, Principal, OPS, OPS_SECRET, WORKER, WORKER_SECRET};
use spool_tests::{json_lines_stdout, success_stdout, test_queue_config, Spoold, SpooldOptions};

/// How long a condition the broker reports is polled for.
const POLL_LIMIT: Duration = Duration::from_secs(20);

/// A CA, and the files of certificates it (or another CA) signed.
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let ca = params.self_signed(&ca_key).unwrap();
        let pki = Pki { dir: tempfile::tempdir().unwrap(), ca, ca_key };
        std::fs::write(pki.ca_file(), pki.ca.pem()).unwrap();
        pki
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A certificate for `names` (SANs) with subject CN `cn`, signed by
    /// this CA: its PEM file and its key's.
    fn issue(&self, file: &str, cn: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let cert_path = self.dir.path().join(format!("{file}.pem"));
        let key_path = self.dir.path().join(format!("{file}.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// The broker's certificate: valid for 127.0.0.1 and localhost.
    fn server(&self) -> (PathBuf, PathBuf) {
        self.issue("server", "spoold", &["127.0.0.1", "localhost"])
    }
}

fn tls_options(pki: &Pki, cores: u16) -> SpooldOptions {
    let (cert, key) = pki.server();
    let mut options = SpooldOptions::new(cores);
    options.args.push(format!("--tls-cert-file={}", cert.display()));
    options.args.push(format!("--tls-key-file={}", key.display()));
    options
}

fn client_config(tls: Option<TlsConfig>) -> ClientConfig {
    ClientConfig {
        connection: ConnectionConfig {
            request_timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(5),
            tls,
            ..ConnectionConfig::default()
        },
    }
}

fn trusting(pki: &Pki) -> TlsConfig {
    TlsConfig::trusting(&pki.ca_file()).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A TLS client connection to 127.0.0.1 trusting only `ca`.
fn client_connection(ca: &Path) -> rustls::ClientConnection {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in spool_client::tls::read_certificates("CA", ca).unwrap() {
        roots.add(certificate).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(spool_client::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    rustls::ClientConnection::new(Arc::new(config), name).unwrap()
}

/// `GET path` over https, trusting `ca`: the whole answer.
fn https_get(addr: &str, path: &str, ca: &Path) -> HttpAnswer {
    let connection = client_connection(ca);
    let socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, socket);
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    match stream.read_to_end(&mut raw) {
        Ok(_) => {}
        // A peer that closes without close_notify after the whole answer.
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(error) => panic!("https {path}: {error}"),
    }
    parse_answer(raw)
}

/// The sum over shards of a metric on the https admin port.
fn metric(broker: &Spoold, ca: &Path, name: &str) -> f64 {
    let page = https_get(&broker.admin_addr(), "/metrics", ca);
    assert_eq!(page.status, 200, "{page:?}");
    Exposition::parse(&page.body).unwrap().sum(name)
}

/// Polls `metric` until it exceeds `above`.
fn wait_metric_above(broker: &Spoold, ca: &Path, name: &str, above: f64) -> f64 {
    let started = spool_tests::now();
    loop {
        let value = metric(broker, ca, name);
        if value > above {
            return value;
        }
        assert!(started.elapsed() < POLL_LIMIT, "{name} stayed at {value}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// Goal: with TLS on, the binary protocol works through it (the library
// across two shards, and `spool send`/`recv` with --tls-ca), the admin port
// answers health, metrics and the API (its gateway reaching the shards over
// TLS) over https, and the start-up log says TLS is on. Method: a 2-shard
// broker with a generated certificate; create, send, claim and ack; then
// the CLI; then https requests.
#[test]
fn tls_carries_the_binary_protocol_and_the_admin_port() {
    let pki = Pki::new("spool test ca");
    let broker = Spoold::start_with(tls_options(&pki, 2));
    assert!(broker.log().contains("TLS ON"), "{}", broker.log());

    runtime().block_on(async {
        let client = Client::connect_with(&broker.addr(), client_config(Some(trusting(&pki))))
            .await
            .unwrap();
        let admin = Admin::new(client.clone());
        admin.create_queue("secure", test_queue_config(2, 30_000, 5)).await.unwrap();
        let producer = spool_client::Producer::new(client.clone(), Default::default()).unwrap();
        for index in 0..10u32 {
            let payload = format!("message {index}").into_bytes();
            producer.send("secure", Message::new(payload).key(index.to_string())).await.unwrap();
        }
        let mut received = 0;
        let started = spool_tests::now();
        while received < 10 {
            let deliveries =
                client.claim_any("secure", &ClaimOptions::new(10).wait_ms(1_000)).await.unwrap();
            received += deliveries.len();
            for delivery in &deliveries {
                client
                    .ack(delivery.queue(), delivery.partition(), &[delivery.token()])
                    .await
                    .unwrap();
            }
            assert!(started.elapsed() < POLL_LIMIT, "claimed {received} of 10");
        }
    });

    let ca = pki.ca_file().display().to_string();
    let sent = broker.cli(&["--tls-ca", &ca, "--json", "send", "secure", "over-tls"]);
    success_stdout(&sent);
    let received = broker.cli(&["--tls-ca", &ca, "--json", "recv", "secure", "--count", "1"]);
    let lines = json_lines_stdout(&received);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].to_string().contains("over-tls"), "{lines:?}");

    let live = https_get(&broker.admin_addr(), "/health/live", &pki.ca_file());
    assert_eq!(live.status, 200, "{live:?}");
    let metrics = https_get(&broker.admin_addr(), "/metrics", &pki.ca_file());
    assert_eq!(metrics.status, 200, "{metrics:?}");
    let exposition = Exposition::parse(&metrics.body).unwrap();
    assert!(exposition.sum("spool_shard_connections_accepted_total") >= 2.0);
    let queues = https_get(&broker.admin_addr(), "/v1/queues", &pki.ca_file());
    assert_eq!(queues.status, 200, "{queues:?}");
    assert!(queues.body.contains("secure"), "{queues:?}");
    // The CLI's admin-port commands speak HTTPS with the same --tls-ca
    // (and fail without it).
    let admin = broker.admin_addr();
    let figures = broker.cli(&[
        "--tls-ca",
        &ca,
        "--json",
        "metrics",
        "secure",
        "--admin",
        &admin,
        "--interval-ms",
        "0",
    ]);
    let figures = success_stdout(&figures);
    assert!(figures.contains("\"partitions\""), "{figures}");
    let quotas = broker.cli(&["--tls-ca", &ca, "--json", "quota", "list", "--admin", &admin]);
    success_stdout(&quotas);
    let without = broker.cli(&["metrics", "secure", "--admin", &admin, "--interval-ms", "0"]);
    assert!(!without.status.success(), "plain HTTP to the https admin port: {without:?}");

    // A plain HTTP request to the https port gets no answer.
    let mut plain = TcpStream::connect(broker.admin_addr()).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    plain.write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&answer));
}

// Goal: a plain client on a TLS port fails cleanly on both sides: the
// client's error says the port speaks TLS (library and CLI), the broker
// counts the failed handshake and logs it, and it goes on serving TLS
// clients. Method: a plain request, then the counter, the log, a TLS client.
#[test]
fn a_plain_client_on_a_tls_port_is_told_and_counted() {
    let pki = Pki::new("spool test ca");
    let broker = Spoold::start_with(tls_options(&pki, 1));
    let before = metric(&broker, &pki.ca_file(), "spool_shard_tls_handshake_failures_total");

    runtime().block_on(async {
        let plain =
            Connection::connect(&broker.addr(), client_config(None).connection).await.unwrap();
        let error = plain.call(&Request::ListQueues(ListQueuesRequest {})).await.unwrap_err();
        assert!(matches!(error, ClientError::ConnectionClosed { .. }), "{error:?}");
        assert!(
            error.to_string().contains(spool_client::tls::TLS_PORT_HINT),
            "the error says the port speaks TLS: {error}"
        );
    });
    let output = broker.cli(&["queue", "list"]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("the port speaks TLS"), "{stderr}");

    let after = wait_metric_above(
        &broker,
        &pki.ca_file(),
        "spool_shard_tls_handshake_failures_total",
        before,
    );
    assert!(after >= before + 1.0);
    let log = broker.log();
    assert!(log.contains("tls_handshake_failed"), "{log}");
    assert!(log.contains("a plain client on a TLS port?"), "{log}");

    runtime().block_on(async {
        let client = Client::connect_with(&broker.addr(), client_config(Some(trusting(&pki))))
            .await
            .unwrap();
        Admin::new(client).list_queues().await.unwrap();
    });
}

// Goal: a TLS client on a plain port fails at connect with a TLS error
// that suggests the port is plain, and the broker goes on serving plain
// clients. Method: connect with TLS to a broker without it.
#[test]
fn a_tls_client_on_a_plain_port_fails_cleanly() {
    let pki = Pki::new("spool test ca");
    let broker = Spoold::start(1);
    runtime().block_on(async {
        let error = Client::connect_with(&broker.addr(), client_config(Some(trusting(&pki))))
            .await
            .unwrap_err();
        assert!(matches!(error, ClientError::Tls { .. }), "{error:?}");
        assert!(error.to_string().contains(spool_client::tls::PLAIN_PORT_HINT), "{error}");
        Admin::new(broker.client().await).list_queues().await.unwrap();
    });
    let ca = pki.ca_file().display().to_string();
    let output = broker.cli(&["--tls-ca", &ca, "queue", "list"]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("TLS handshake") && stderr.contains("plain TCP"), "{stderr}");
}

/// The auth file: `worker` may enqueue and claim `jobs`, nothing else;
/// `ops` administers, describes and purges.
fn auth_file(dir: &Path) -> PathBuf {
    let path = dir.join("auth.toml");
    write_auth_file(
        &path,
        &[
            Principal::new(WORKER, WORKER_SECRET, &["jobs"], &["enqueue", "claim"]),
            Principal::new(OPS, OPS_SECRET, &["*"], &["admin", "describe", "purge"]),
        ],
    );
    path
}

// Goal: with `tls_client_ca_file`, a client certificate signed by that CA
// authenticates the connection as its CN principal without a handshake,
// and that principal's ACL applies (enqueue allowed, purge denied); a
// certificate naming an unknown principal is refused UNAUTHENTICATED; one
// from another CA is refused by the TLS handshake (counted); a client
// without a certificate still authenticates with its secret. Method: one
// broker, a client per certificate.
#[test]
fn client_certificates_authenticate_as_their_cn_principal() {
    let pki = Pki::new("spool test ca");
    let stranger = Pki::new("another ca");
    let mut options = tls_options(&pki, 1);
    options.args.push(format!("--tls-client-ca-file={}", pki.ca_file().display()));
    options.args.push(format!("--auth-file={}", auth_file(pki.dir.path()).display()));
    let broker = Spoold::start_with(options);
    let (worker_cert, worker_key) = pki.issue("worker", WORKER, &[]);
    let (nobody_cert, nobody_key) = pki.issue("nobody", "nobody", &[]);
    let (foreign_cert, foreign_key) = stranger.issue("foreign", WORKER, &[]);
    let with_cert = |cert: &Path, key: &Path| {
        client_config(Some(trusting(&pki).with_client_certificate(cert, key).unwrap()))
    };

    runtime().block_on(async {
        // Set up with a secret: a client without a certificate.
        let ops = Client::connect_with(
            &broker.addr(),
            client_config(Some(trusting(&pki))).with_credentials(Credentials::new(OPS, OPS_SECRET)),
        )
        .await
        .unwrap();
        Admin::new(ops).create_queue("jobs", test_queue_config(1, 30_000, 5)).await.unwrap();

        let worker = Client::connect_with(&broker.addr(), with_cert(&worker_cert, &worker_key))
            .await
            .unwrap();
        let producer = spool_client::Producer::new(worker.clone(), Default::default()).unwrap();
        producer.send("jobs", Message::new(b"by certificate".to_vec())).await.unwrap();
        let denied =
            Admin::new(worker.clone()).purge("jobs", PartitionId(0), true).await.unwrap_err();
        assert_eq!(denied.code(), Some(ErrorCode::PermissionDenied), "{denied}");
        assert!(denied.to_string().contains("principal worker"), "{denied}");

        let nobody =
            Connection::connect(&broker.addr(), with_cert(&nobody_cert, &nobody_key).connection)
                .await
                .unwrap();
        let refused = nobody.call(&Request::ListQueues(ListQueuesRequest {})).await.unwrap_err();
        assert!(refused.to_string().contains("UNAUTHENTICATED"), "{refused}");
        assert!(refused.to_string().contains("\"nobody\""), "{refused}");
    });

    let before = metric(&broker, &pki.ca_file(), "spool_shard_tls_handshake_failures_total");
    runtime().block_on(async {
        // TLS 1.3: the client's side of the handshake ends before the
        // broker checks its certificate; the refusal arrives as an alert.
        let outcome = async {
            let foreign = Connection::connect(
                &broker.addr(),
                with_cert(&foreign_cert, &foreign_key).connection,
            )
            .await?;
            foreign.call(&Request::ListQueues(ListQueuesRequest {})).await
        }
        .await;
        let error = outcome.unwrap_err();
        let text = error.to_string();
        assert!(text.contains("UnknownCA") || text.contains("BadCertificate"), "{text}");
    });
    wait_metric_above(&broker, &pki.ca_file(), "spool_shard_tls_handshake_failures_total", before);
}

/// TLS connections this test holds open at once.
const TLS_HELD: usize = 8;
/// `TLS_CONNECTION_MEMORY_BYTES` of the broker's limits.
const TLS_CONNECTION_MEMORY_BYTES: f64 = (128 << 10) as f64;

/// A finished TLS handshake with shard port `addr`, trusting `ca`.
fn tls_handshake(
    addr: &str,
    ca: &Path,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut connection = client_connection(ca);
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    while connection.is_handshaking() {
        connection.complete_io(&mut socket).unwrap();
    }
    rustls::StreamOwned::new(connection, socket)
}

/// `spool_shard_memory_used_bytes{pool="requests"}` of shard 0.
fn requests_used(broker: &Spoold, ca: &Path) -> f64 {
    let page = https_get(&broker.admin_addr(), "/metrics", ca);
    assert_eq!(page.status, 200, "{page:?}");
    Exposition::parse(&page.body)
        .unwrap()
        .value("spool_shard_memory_used_bytes", &[("shard", "0"), ("pool", "requests")])
        .expect("the requests pool's use in /metrics")
}

// Goal: a TLS connection's buffers draw from the shard's requests pool for
// the connection's life and come back when it ends. Method: one shard with
// TLS; 8 connections finish their handshake and stay open; the pool's use
// from /metrics, then again after they close. How it can fail: without the
// take in `serve_tls` the use stays near 0 while they are open (seen); a
// grant not given back keeps it up after they close.
#[test]
fn tls_connections_draw_their_buffers_from_the_requests_pool() {
    let pki = Pki::new("spool test ca");
    let broker = Spoold::start_with(tls_options(&pki, 1));
    let before = requests_used(&broker, &pki.ca_file());
    let held: Vec<_> =
        (0..TLS_HELD).map(|_| tls_handshake(&broker.shard_addr(0), &pki.ca_file())).collect();
    let during = requests_used(&broker, &pki.ca_file());
    assert!(
        during - before >= TLS_HELD as f64 * TLS_CONNECTION_MEMORY_BYTES,
        "{TLS_HELD} TLS connections hold {} bytes of the requests pool",
        during - before
    );
    drop(held);
    let started = spool_tests::now();
    loop {
        let after = requests_used(&broker, &pki.ca_file());
        if after < TLS_CONNECTION_MEMORY_BYTES {
            break;
        }
        assert!(started.elapsed() < POLL_LIMIT, "{after} bytes still held after the close");
        std::thread::sleep(Duration::from_millis(50));
    }
}
