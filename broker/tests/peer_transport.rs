//! The replication peer transport over real TCP on 127.0.0.1: a
//! `PeerSender` and a `PeerReceiver` on one glommio executor per test.
//! Every wait is bounded (a test deadline, and each wait for a counter), so
//! a broken transport fails its test instead of hanging it.

// Test helpers panic on setup failures by design.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future::or;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use raft::eraftpb::Message;
use spool_broker::clock::instant_now;
use spool_broker::net::listener::bind_listener;
use spool_broker::net::peer::limits::{PEER_OUTBOX_BYTES_MAX, PEER_READ_CHUNK_BYTES};
use spool_broker::net::peer::{
    PeerError, PeerReceiver, PeerSender, ReceiverLimits, ReceiverStats, SenderLimits,
};
use spool_broker::replica::limits::{FRAME_HEADER_BYTES, REPLICA_FRAME_BYTES_MAX};
use spool_broker::replica::wire::{Frame, FrameBuilder, GroupId};

mod peer_common;
use peer_common::{run, wait_for, Received, EVENT_TIMEOUT};

/// An append from `from` to 2 whose `index` numbers it in its group, with
/// one entry of `data_len` bytes.
fn message(from: u64, index: u64, data_len: usize) -> Message {
    peer_common::message(from, 2, index, data_len)
}

/// A receiver on `addr` (port 0: any) taking frames from `allowed` into
/// the returned list.
fn receiver_on(
    addr: SocketAddr,
    allowed: &[u64],
    limits: ReceiverLimits,
) -> (PeerReceiver, Received) {
    let listener = bind_listener(addr).unwrap();
    start_receiver(listener, allowed, limits)
}

/// A receiver on `listener`, as [`receiver_on`].
fn start_receiver(
    listener: glommio::net::TcpListener,
    allowed: &[u64],
    limits: ReceiverLimits,
) -> (PeerReceiver, Received) {
    let received: Received = Rc::default();
    let into = received.clone();
    let sink = Rc::new(move |frame: Frame| {
        let mut into = into.borrow_mut();
        for (group, message) in frame.messages {
            into.push((frame.from, group, message));
        }
    });
    let receiver = PeerReceiver::start(listener, allowed.iter().copied(), sink, limits).unwrap();
    (receiver, received)
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// The messages of `group` in `received`, in arrival order.
fn of_group(received: &Received, group: GroupId) -> Vec<Message> {
    received.borrow().iter().filter(|(_, g, _)| *g == group).map(|(_, _, m)| m.clone()).collect()
}

#[test]
fn ten_thousand_messages_arrive_in_order_per_group_in_few_frames() {
    // Goal: every message arrives, unchanged and in send order per group,
    // and the sender batched them (far fewer frames than messages).
    // Method: 10,000 appends of 8 groups, 300-byte entries, sent in 40
    // bursts of 250 once the link is up, each sent before the next.
    run(async {
        let (receiver, received) = receiver_on(any_port(), &[1], ReceiverLimits::default());
        let sender = PeerSender::start(1, receiver.local_addr(), SenderLimits::default());
        wait_for("the link", || sender.stats().connects == 1).await;
        let groups: Vec<GroupId> =
            (0..8).map(|n| GroupId { queue: 10 + n / 2, partition: n % 2 }).collect();
        let mut sent: Vec<Vec<Message>> = vec![Vec::new(); groups.len()];
        for n in 0..10_000u64 {
            let which = (n * 7 % 8) as usize;
            let message = message(1, sent[which].len() as u64, 300);
            sent[which].push(message.clone());
            sender.send(groups[which], message).unwrap();
            if n % 250 == 249 {
                // Let the link drain the burst: each burst is its own
                // frames, as a shard's turns are.
                wait_for("the burst sent", || sender.stats().outbox_messages == 0).await;
            }
        }
        wait_for("10,000 messages", || received.borrow().len() == 10_000).await;
        for (which, group) in groups.iter().enumerate() {
            assert_eq!(of_group(&received, *group), sent[which], "group {group:?}");
        }
        assert!(received.borrow().iter().all(|(from, _, _)| *from == 1));
        let sent_stats = sender.stats();
        let got = receiver.stats();
        assert_eq!(sent_stats.messages_sent, 10_000);
        assert_eq!(sent_stats.connects, 1);
        assert_eq!(sent_stats.outbox_bytes, 0);
        assert_eq!(got.frames, sent_stats.frames_sent);
        assert_eq!(got.messages, 10_000);
        assert_eq!(got.bytes, sent_stats.bytes_sent);
        assert!(
            (40..=1_000).contains(&sent_stats.frames_sent),
            "batching: {} frames for 10,000 messages",
            sent_stats.frames_sent
        );
        sender.close().await;
        receiver.close().await;
    });
}

#[test]
fn the_sender_reconnects_to_a_restarted_receiver() {
    // Goal: a receiver that stops and starts again on the same port gets
    // the messages sent after its restart; the sender reconnected.
    run(async {
        let (first, received) = receiver_on(any_port(), &[1], ReceiverLimits::default());
        let addr = first.local_addr();
        let sender = PeerSender::start(1, addr, SenderLimits::default());
        let group = GroupId { queue: 1, partition: 0 };
        for index in 0..100 {
            sender.send(group, message(1, index, 100)).unwrap();
        }
        wait_for("the first 100", || received.borrow().len() == 100).await;
        first.close().await;
        drop(first);
        // The sender keeps sending while nobody listens.
        for index in 100..150 {
            sender.send(group, message(1, index, 100)).unwrap();
        }
        // The closed listener's socket is released once glommio has
        // cancelled its pending accept (a reactor turn): bind again, bounded.
        let started = instant_now();
        let listener = loop {
            match bind_listener(addr) {
                Ok(listener) => break listener,
                Err(error) => {
                    assert!(started.elapsed() < EVENT_TIMEOUT, "port not free: {error}");
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let (second, again) = start_receiver(listener, &[1], ReceiverLimits::default());
        // Send one at a time until one arrives at the new receiver.
        let mut index = 150;
        let started = instant_now();
        while again.borrow().is_empty() {
            assert!(started.elapsed() < EVENT_TIMEOUT, "nothing reached the restarted receiver");
            sender.send(group, message(1, index, 100)).unwrap();
            index += 1;
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        assert!(sender.stats().connects >= 2, "{:?}", sender.stats());
        let stats = sender.stats();
        assert!(stats.links_lost + stats.write_failures >= 1, "{stats:?}");
        // The link is up again: everything sent from now on arrives, in order.
        let from = index;
        for next in from..from + 200 {
            sender.send(group, message(1, next, 100)).unwrap();
        }
        wait_for("the last 200", || {
            again.borrow().last().is_some_and(|(_, _, m)| m.index == from + 199)
        })
        .await;
        let tail: Vec<u64> = of_group(&again, group)
            .iter()
            .map(|m| m.index)
            .filter(|index| *index >= from)
            .collect();
        assert_eq!(tail, (from..from + 200).collect::<Vec<_>>());
        let indexes: Vec<u64> = of_group(&again, group).iter().map(|m| m.index).collect();
        assert!(indexes.windows(2).all(|pair| pair[0] < pair[1]), "order: {indexes:?}");
        sender.close().await;
        second.close().await;
    });
}

#[test]
fn with_no_receiver_the_outbox_stays_bounded_and_is_sent_once_one_listens() {
    // Goal: sending past the outbox bound drops the excess and counts it,
    // the outbox never passes its bound, failed connects keep what is
    // queued, and once a receiver listens the queued messages arrive.
    run(async {
        // A port nobody listens on (bound, read, released).
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let sender = PeerSender::start(1, addr, SenderLimits::default());
        let group = GroupId { queue: 3, partition: 1 };
        let mut dropped = 0u64;
        let mut peak = 0usize;
        for index in 0..20_000u64 {
            match sender.send(group, message(1, index, 1000)) {
                Ok(()) => {}
                Err(PeerError::OutboxFull { .. }) => dropped += 1,
                Err(other) => panic!("unexpected refusal: {other}"),
            }
            peak = peak.max(sender.stats().outbox_bytes);
        }
        let stats = sender.stats();
        assert!(dropped > 0, "{stats:?}");
        assert_eq!(stats.messages_dropped, dropped);
        assert_eq!(stats.messages_queued + dropped, 20_000);
        assert!(peak <= PEER_OUTBOX_BYTES_MAX, "outbox at {peak} bytes");
        assert!(stats.outbox_bytes + 2048 > PEER_OUTBOX_BYTES_MAX, "not full: {stats:?}");
        wait_for("two failed connects", || sender.stats().connect_failures >= 2).await;
        assert_eq!(sender.stats().outbox_messages as u64, stats.messages_queued);
        // The message bound holds too, whatever the bytes.
        let small = PeerSender::start(
            1,
            addr,
            SenderLimits { outbox_messages_max: 100, ..SenderLimits::default() },
        );
        let refused =
            (0..150).filter(|index| small.send(group, message(1, *index, 0)).is_err()).count();
        assert_eq!(refused, 50);
        assert_eq!(small.stats().outbox_messages, 100);
        small.close().await;
        // A receiver appears: what was kept is delivered, in order.
        let (receiver, received) = receiver_on(addr, &[1], ReceiverLimits::default());
        let queued = stats.messages_queued as usize;
        wait_for("the kept messages", || received.borrow().len() == queued).await;
        let indexes: Vec<u64> = of_group(&received, group).iter().map(|m| m.index).collect();
        assert_eq!(indexes, (0..queued as u64).collect::<Vec<_>>());
        assert_eq!(sender.stats().outbox_bytes, 0);
        // 16 MiB kept: more than one frame holds.
        assert!(receiver.stats().frames >= 2, "{:?}", receiver.stats());
        assert_eq!(receiver.stats().frames, sender.stats().frames_sent);
        sender.close().await;
        receiver.close().await;
    });
}

/// Connects to `addr`, writes `bytes` and waits (bounded) for the other
/// side to close: the read sees end of stream or a reset.
async fn write_and_expect_close(addr: SocketAddr, bytes: &[u8]) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut sink = [0u8; 64];
    let closed = or(async { matches!(stream.read(&mut sink).await, Ok(0) | Err(_)) }, async {
        glommio::timer::sleep(EVENT_TIMEOUT).await;
        false
    })
    .await;
    assert!(closed, "the receiver kept a connection it should have closed");
}

#[test]
fn garbage_and_unknown_nodes_are_closed_and_a_good_peer_gets_through() {
    // Goal: a connection sending garbage, and one sending a valid frame from
    // a node not allowed, are each closed and counted by reason; nothing of
    // theirs reaches the sink; a good sender on its own connection does.
    run(async {
        let (receiver, received) = receiver_on(any_port(), &[1], ReceiverLimits::default());
        let addr = receiver.local_addr();
        let good = PeerSender::start(1, addr, SenderLimits::default());
        let group = GroupId { queue: 7, partition: 0 };
        good.send(group, message(1, 0, 50)).unwrap();
        wait_for("the first good message", || received.borrow().len() == 1).await;

        write_and_expect_close(addr, &[0xAB; 100]).await;
        let mut stranger = FrameBuilder::new(9);
        stranger.push(group, &message(9, 0, 50)).unwrap();
        write_and_expect_close(addr, &stranger.finish()).await;
        wait_for("both closes counted", || receiver.stats().closed_total() >= 2).await;
        let stats: ReceiverStats = receiver.stats();
        assert_eq!(stats.closed_for("bad_frame"), 1, "{stats:?}");
        assert_eq!(stats.closed_for("unknown_node"), 1, "{stats:?}");

        for index in 1..100 {
            good.send(group, message(1, index, 50)).unwrap();
        }
        wait_for("the good messages", || received.borrow().len() == 100).await;
        assert!(received.borrow().iter().all(|(from, _, m)| *from == 1 && m.from == 1));
        let indexes: Vec<u64> = of_group(&received, group).iter().map(|m| m.index).collect();
        assert_eq!(indexes, (0..100).collect::<Vec<_>>());
        assert_eq!(good.stats().connects, 1);
        assert_eq!(receiver.stats().frames, good.stats().frames_sent);
        good.close().await;
        receiver.close().await;
    });
}

/// A valid frame's header from node 1 made to declare `len` bytes (its crc
/// made right again).
fn header_declaring(len: u32) -> Vec<u8> {
    let mut builder = FrameBuilder::new(1);
    builder.push(GroupId { queue: 1, partition: 1 }, &message(1, 0, 10)).unwrap();
    let mut header = builder.finish()[..FRAME_HEADER_BYTES].to_vec();
    header[8..12].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&header[..28]);
    header[28..32].copy_from_slice(&crc.to_le_bytes());
    header
}

#[test]
fn an_oversized_frame_header_is_refused_before_anything_is_allocated() {
    // Goal: a header declaring more than the frame bound closes the
    // connection as `frame_too_large` at once — without waiting for the
    // body and without growing the read buffer beyond its first chunk.
    run(async {
        let (receiver, received) = receiver_on(any_port(), &[1], ReceiverLimits::default());
        let header = header_declaring(REPLICA_FRAME_BYTES_MAX as u32 + 1);
        write_and_expect_close(receiver.local_addr(), &header).await;
        wait_for("the close counted", || receiver.stats().closed_total() == 1).await;
        let stats = receiver.stats();
        assert_eq!(stats.closed_for("frame_too_large"), 1, "{stats:?}");
        assert!(stats.read_buffer_bytes_peak <= PEER_READ_CHUNK_BYTES, "{stats:?}");
        assert!(received.borrow().is_empty());
        receiver.close().await;
    });
}

#[test]
fn a_slow_frame_times_out_and_connections_are_bounded() {
    // Goal: a frame whose body does not follow its header within the frame
    // timeout closes the connection (`frame_timeout`), after the read
    // buffer grew to that frame (a valid header, within the bound); a
    // connection over the bound is closed at once and counted.
    run(async {
        let limits = ReceiverLimits {
            connections_max: 1,
            frame_timeout: Duration::from_millis(300),
            ..ReceiverLimits::default()
        };
        let (receiver, _received) = receiver_on(any_port(), &[1], limits);
        let addr = receiver.local_addr();
        let declared = 1 << 20;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(&header_declaring(declared)).await.unwrap();
        wait_for("the slow connection accepted", || receiver.stats().accepted == 1).await;
        // The bound is one: the next connection is refused.
        write_and_expect_close(addr, &[]).await;
        assert_eq!(receiver.stats().refused, 1);
        let mut sink = [0u8; 8];
        let read = or(async { Some(slow.read(&mut sink).await) }, async {
            glommio::timer::sleep(EVENT_TIMEOUT).await;
            None
        })
        .await;
        assert!(matches!(read, Some(Ok(0) | Err(_))), "not closed: {read:?}");
        wait_for("the timeout counted", || receiver.stats().closed_for("frame_timeout") == 1).await;
        let stats = receiver.stats();
        assert_eq!(stats.read_buffer_bytes_peak, declared as usize, "{stats:?}");
        assert_eq!(stats.active, 0);
        receiver.close().await;
    });
}

#[test]
fn an_idle_link_is_closed_and_the_sender_reconnects_when_it_has_more() {
    // Goal: a connection with no frame for the idle timeout is closed
    // (`idle`), the sender notices the close while idle (not by losing the
    // next frame in it), and its next message goes over a new connection.
    // Time is what is under test here: the idle timeout is 200 ms.
    run(async {
        let limits = ReceiverLimits {
            idle_timeout: Duration::from_millis(200),
            ..ReceiverLimits::default()
        };
        let (receiver, received) = receiver_on(any_port(), &[1], limits);
        let sender = PeerSender::start(1, receiver.local_addr(), SenderLimits::default());
        let group = GroupId { queue: 2, partition: 0 };
        sender.send(group, message(1, 0, 10)).unwrap();
        wait_for("the first message", || received.borrow().len() == 1).await;
        wait_for("the idle close", || receiver.stats().closed_for("idle") == 1).await;
        wait_for("the sender to see it", || sender.stats().links_lost == 1).await;
        wait_for("the reconnect", || sender.stats().connects == 2).await;
        sender.send(group, message(1, 1, 10)).unwrap();
        wait_for("the second message", || received.borrow().len() == 2).await;
        let stats = sender.stats();
        assert_eq!((stats.messages_lost, stats.write_failures), (0, 0), "{stats:?}");
        sender.close().await;
        receiver.close().await;
    });
}
