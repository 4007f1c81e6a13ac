//! The replication peer transport over mutual TLS on 127.0.0.1: a
//! `PeerSender` and a `PeerReceiver` started with a `PeerTls` each, on one
//! glommio executor per test, with a CA and node certificates (DNS name
//! `node-<id>`) generated for the test by rcgen; a hand-made TLS client
//! plays the peers that misbehave. Every wait is bounded (a test deadline,
//! and each wait for a counter), so a broken transport fails its test
//! instead of hanging it.

// Test helpers panic on setup failures by design.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::future::or;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use raft::eraftpb::Message;
use rustls::pki_types::ServerName;
use spool_broker::clock::instant_now;
use spool_broker::net::listener::bind_listener;
use spool_broker::net::peer::tls::certificate_node;
use spool_broker::net::peer::{
    PeerError, PeerReceiver, PeerSender, PeerTls, ReceiverLimits, SenderLimits,
};
use spool_broker::replica::wire::{Frame, FrameBuilder, GroupId};

mod peer_common;
use peer_common::{message, run, wait_for, Received, EVENT_TIMEOUT};

mod pki;
use pki::Pki;

/// A TLS receiver on any port taking frames from `allowed` into the
/// returned list.
fn tls_receiver(
    tls: &PeerTls,
    allowed: &[u64],
    limits: ReceiverLimits,
) -> (PeerReceiver, Received) {
    let listener = bind_listener("127.0.0.1:0".parse().unwrap()).unwrap();
    let received: Received = Rc::default();
    let into = received.clone();
    let sink = Rc::new(move |frame: Frame| {
        let mut into = into.borrow_mut();
        for (group, message) in frame.messages {
            into.push((frame.from, group, message));
        }
    });
    let receiver =
        PeerReceiver::start_tls(listener, allowed.iter().copied(), sink, limits, tls).unwrap();
    (receiver, received)
}

/// The messages of `group` in `received`, in arrival order.
fn of_group(received: &Received, group: GroupId) -> Vec<Message> {
    received.borrow().iter().filter(|(_, g, _)| *g == group).map(|(_, _, m)| m.clone()).collect()
}

/// Waits (bounded) for the other side of `stream` to close it: a read sees
/// end of stream or an error (a reset, a TLS alert as an error).
async fn expect_closed(stream: &mut (impl AsyncRead + Unpin)) {
    let mut sink = [0u8; 64];
    // What arrives before the end (a TLS alert) is read past.
    let until_end = async {
        while let Ok(read) = stream.read(&mut sink).await {
            if read == 0 {
                break;
            }
        }
        true
    };
    let closed = or(until_end, async {
        glommio::timer::sleep(EVENT_TIMEOUT).await;
        false
    })
    .await;
    assert!(closed, "the receiver kept a connection it should have closed");
}

/// A hand-made TLS connection to the receiver of node `to` at `addr` with
/// `config`; `None` when the handshake fails on this side.
async fn hand_made(
    config: Arc<rustls::ClientConfig>,
    to: u64,
    addr: SocketAddr,
) -> Option<futures_rustls::client::TlsStream<TcpStream>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(format!("node-{to}")).unwrap();
    futures_rustls::TlsConnector::from(config).connect(name, stream).await.ok()
}

#[test]
fn messages_over_tls_arrive_complete_and_in_order() {
    // Goal: over a TLS link, every message arrives unchanged and in send
    // order per group, batched into frames, from the certified node; the
    // sender made one connect and no handshake failed; its close is an
    // ordinary one on the receiver's side.
    // Method: 4,000 appends of 6 groups, 300-byte entries, in 20 bursts of
    // 200 from node 1 to node 2's receiver.
    run(async {
        let pki = Pki::new("cluster ca");
        let (receiver, received) = tls_receiver(&pki.node(2), &[1], ReceiverLimits::default());
        let sender =
            PeerSender::start_tls(&pki.node(1), 2, receiver.local_addr(), SenderLimits::default());
        wait_for("the link", || sender.stats().connects == 1).await;
        let groups: Vec<GroupId> =
            (0..6).map(|n| GroupId { queue: 20 + n / 2, partition: n % 2 }).collect();
        let mut sent: Vec<Vec<Message>> = vec![Vec::new(); groups.len()];
        for n in 0..4_000u64 {
            let which = (n * 5 % 6) as usize;
            let message = message(1, 2, sent[which].len() as u64, 300);
            sent[which].push(message.clone());
            sender.send(groups[which], message).unwrap();
            if n % 200 == 199 {
                wait_for("the burst sent", || sender.stats().outbox_messages == 0).await;
            }
        }
        wait_for("4,000 messages", || received.borrow().len() == 4_000).await;
        for (which, group) in groups.iter().enumerate() {
            assert_eq!(of_group(&received, *group), sent[which], "group {group:?}");
        }
        assert!(received.borrow().iter().all(|(from, _, _)| *from == 1));
        let sent_stats = sender.stats();
        let got = receiver.stats();
        assert_eq!(sent_stats.messages_sent, 4_000);
        assert_eq!((sent_stats.connects, sent_stats.connect_failures), (1, 0), "{sent_stats:?}");
        assert_eq!(sent_stats.handshake_failures, 0);
        assert_eq!(got.frames, sent_stats.frames_sent);
        assert_eq!(got.bytes, sent_stats.bytes_sent);
        assert!((20..=400).contains(&sent_stats.frames_sent), "{sent_stats:?}");
        assert_eq!(got.closed_total(), 0, "{got:?}");
        sender.close().await;
        wait_for("the close", || receiver.stats().closed_for("peer_closed") == 1).await;
        receiver.close().await;
    });
}

#[test]
fn frames_from_another_node_than_the_certificate_names_are_closed_as_identity() {
    // Goal: a peer whose certificate names node 2 but whose frame says it is
    // from node 3 (an allowed node) is closed and counted under `identity`,
    // as is a CA-signed certificate that names no node (one naming a node
    // not allowed is `unknown_node`); nothing of theirs reaches the sink, and honest peers 2 and 3 on their own links get
    // through.
    run(async {
        let pki = Pki::new("cluster ca");
        let (receiver, received) = tls_receiver(&pki.node(1), &[2, 3], ReceiverLimits::default());
        let addr = receiver.local_addr();
        let group = GroupId { queue: 7, partition: 0 };

        let node_2 = pki.client(Some(pki.issue(&["node-2"])));
        let mut impostor = hand_made(node_2, 1, addr).await.expect("the impostor's handshake");
        let mut frame = FrameBuilder::new(3);
        frame.push(group, &message(3, 1, 0, 50)).unwrap();
        impostor.write_all(&frame.finish()).await.unwrap();
        impostor.flush().await.unwrap();
        expect_closed(&mut impostor).await;
        wait_for("the impostor counted", || receiver.stats().closed_for("identity") == 1).await;

        let nameless = pki.client(Some(pki.issue(&["localhost"])));
        if let Some(mut nameless) = hand_made(nameless, 1, addr).await {
            expect_closed(&mut nameless).await;
        }
        wait_for("the nameless counted", || receiver.stats().closed_for("identity") == 2).await;
        // A certificate naming a node this receiver does not serve.
        let node_4 = pki.client(Some(pki.issue(&["node-4"])));
        if let Some(mut node_4) = hand_made(node_4, 1, addr).await {
            expect_closed(&mut node_4).await;
        }
        wait_for("node 4 counted", || receiver.stats().closed_for("unknown_node") == 1).await;
        assert!(received.borrow().is_empty());

        let honest_2 = PeerSender::start_tls(&pki.node(2), 1, addr, SenderLimits::default());
        let honest_3 = PeerSender::start_tls(&pki.node(3), 1, addr, SenderLimits::default());
        for index in 0..100 {
            honest_2.send(group, message(2, 1, index, 50)).unwrap();
            honest_3.send(GroupId { queue: 8, partition: 0 }, message(3, 1, index, 50)).unwrap();
        }
        wait_for("the honest messages", || received.borrow().len() == 200).await;
        for (node, queue) in [(2, 7), (3, 8)] {
            let got = of_group(&received, GroupId { queue, partition: 0 });
            assert!(got.iter().all(|m| m.from == node), "node {node}");
            assert_eq!(
                got.iter().map(|m| m.index).collect::<Vec<_>>(),
                (0..100).collect::<Vec<_>>()
            );
        }
        let stats = receiver.stats();
        assert_eq!(stats.closed_for("identity"), 2, "{stats:?}");
        assert_eq!(stats.closed_total(), 3, "{stats:?}");
        honest_2.close().await;
        honest_3.close().await;
        receiver.close().await;
    });
}

#[test]
fn client_certificates_of_another_ca_or_none_are_refused_at_the_handshake() {
    // Goal: a client certificate naming an allowed node but signed by
    // another CA, and no client certificate at all, each fail the
    // handshake and are counted (`handshake_failed`); the listener keeps
    // serving, and a peer with the cluster's certificate gets through.
    // So does plain TCP on the TLS port.
    run(async {
        let pki = Pki::new("cluster ca");
        let other = Pki::new("another ca");
        let (receiver, received) = tls_receiver(&pki.node(1), &[2], ReceiverLimits::default());
        let addr = receiver.local_addr();

        // TLS 1.3: the client's side may finish before the receiver checks
        // its certificate; the receiver's refusal then ends the link.
        let foreign = pki.client(Some(other.issue(&["node-2"])));
        if let Some(mut foreign) = hand_made(foreign, 1, addr).await {
            expect_closed(&mut foreign).await;
        }
        let anonymous = pki.client(None);
        if let Some(mut anonymous) = hand_made(anonymous, 1, addr).await {
            expect_closed(&mut anonymous).await;
        }
        wait_for("both refusals counted", || receiver.stats().closed_for("handshake_failed") == 2)
            .await;
        let mut plain = TcpStream::connect(addr).await.unwrap();
        let mut stranger = FrameBuilder::new(2);
        stranger.push(GroupId { queue: 1, partition: 0 }, &message(2, 1, 0, 10)).unwrap();
        plain.write_all(&stranger.finish()).await.unwrap();
        expect_closed(&mut plain).await;
        wait_for("the plain peer counted", || receiver.stats().closed_for("handshake_failed") == 3)
            .await;
        assert!(received.borrow().is_empty());

        let group = GroupId { queue: 4, partition: 1 };
        let good = PeerSender::start_tls(&pki.node(2), 1, addr, SenderLimits::default());
        for index in 0..50 {
            good.send(group, message(2, 1, index, 20)).unwrap();
        }
        wait_for("the good messages", || received.borrow().len() == 50).await;
        assert_eq!(good.stats().connects, 1);
        let stats = receiver.stats();
        assert_eq!(stats.closed_total(), 3, "{stats:?}");
        assert_eq!(stats.accepted, 4, "{stats:?}");
        good.close().await;
        receiver.close().await;
    });
}

#[test]
fn the_sender_refuses_a_receiver_whose_certificate_names_another_node() {
    // Goal: a sender meant for node 2 that reaches a receiver whose
    // (CA-signed) certificate names node 3 refuses it at the handshake:
    // counted as a failed connect and a handshake failure, retried with a
    // growing backoff, and nothing is sent; the receiver sees the
    // handshakes fail. The sender's own certificate, and the CA, are good.
    run(async {
        let pki = Pki::new("cluster ca");
        let (receiver, received) = tls_receiver(&pki.node(3), &[1], ReceiverLimits::default());
        let started = instant_now();
        let sender =
            PeerSender::start_tls(&pki.node(1), 2, receiver.local_addr(), SenderLimits::default());
        sender.send(GroupId { queue: 1, partition: 0 }, message(1, 2, 0, 10)).unwrap();
        wait_for("three refused handshakes", || sender.stats().handshake_failures >= 3).await;
        // Three attempts wait two backoffs: 50 ms, then 100 ms.
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(150), "no backoff: {elapsed:?}");
        let stats = sender.stats();
        assert_eq!(stats.connects, 0, "{stats:?}");
        assert_eq!(stats.connect_failures, stats.handshake_failures, "{stats:?}");
        assert_eq!((stats.messages_sent, stats.outbox_messages), (0, 1), "{stats:?}");
        wait_for("the receiver's side", || receiver.stats().closed_for("handshake_failed") >= 3)
            .await;
        assert!(received.borrow().is_empty());
        assert_eq!(receiver.stats().frames, 0);
        sender.close().await;
        receiver.close().await;
    });
}

#[test]
fn a_handshake_that_never_finishes_is_ended_at_the_deadline() {
    // Goal: a peer that connects and never starts (or finishes) its
    // handshake is closed at the receiver's handshake deadline and counted
    // (`handshake_timeout`); a sender whose receiver never answers gives up
    // at its own deadline and counts a handshake failure.
    // Time is what is under test here: both deadlines are 300 ms.
    run(async {
        let pki = Pki::new("cluster ca");
        let deadline = Duration::from_millis(300);
        let limits = ReceiverLimits { handshake_timeout: deadline, ..ReceiverLimits::default() };
        let (receiver, _received) = tls_receiver(&pki.node(1), &[2], limits);
        let started = instant_now();
        let mut silent = TcpStream::connect(receiver.local_addr()).await.unwrap();
        expect_closed(&mut silent).await;
        let waited = started.elapsed();
        assert!(waited >= deadline, "closed before the deadline: {waited:?}");
        wait_for("the timeout counted", || receiver.stats().closed_for("handshake_timeout") == 1)
            .await;
        assert_eq!(receiver.stats().active, 0);

        // A listener that accepts (the kernel's backlog) and never answers.
        let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let limits = SenderLimits { handshake_timeout: deadline, ..SenderLimits::default() };
        let started = instant_now();
        let sender = PeerSender::start_tls(&pki.node(2), 1, mute.local_addr().unwrap(), limits);
        wait_for("the sender's timeout", || sender.stats().handshake_failures == 1).await;
        assert!(started.elapsed() >= deadline, "{:?}", started.elapsed());
        assert_eq!(sender.stats().connects, 0);
        sender.close().await;
        receiver.close().await;
        drop(mute);
    });
}

#[test]
fn a_certificate_names_exactly_one_node_by_its_dns_name() {
    // Goal: the node a certificate names is its one DNS name `node-<id>`;
    // a certificate with none, with two, or with a near miss names none,
    // and a node's own certificate must name it.
    let pki = Pki::new("cluster ca");
    let node_of = |names: &[&str]| certificate_node(&pki.issue(names).0[0]);
    assert_eq!(node_of(&["localhost", "node-7", "10.0.0.1"]), Ok(7));
    assert!(node_of(&["localhost"]).unwrap_err().contains("names no node"));
    assert!(node_of(&["node-02", "node-", "node-x", "xnode-2"]).is_err());
    assert!(node_of(&["node-2", "node-3"]).unwrap_err().contains("several"));
    let (chain, key) = pki.issue(&["node-2"]);
    let error = PeerTls::new(3, &pki.ca(), chain, key).unwrap_err();
    assert!(matches!(error, PeerError::TlsSetup(_)), "{error}");
    assert!(error.to_string().contains("names node 2"), "{error}");
}
