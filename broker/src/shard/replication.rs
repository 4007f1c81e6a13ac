//! `ReplicationHost`: a shard's replicated partitions and its peer links
//! together (`docs/design/replication.md` §5) — what carries raft messages
//! between a partition's [`ReplicaDriver`] here and its members on other
//! nodes, and what keeps every driver's clock.
//!
//! - **Out.** Each driver's messages go to the [`PeerSender`] of the node
//!   they are addressed to (one link per peer node, to that node's peer
//!   port of the same shard index, plain or mutual TLS as the host was
//!   made), tagged with the partition's group. A
//!   message to a node with no link, or one a full outbox refuses, is
//!   dropped and counted: raft resends.
//! - **In.** The shard's [`PeerReceiver`] hands each frame here; its
//!   messages are stepped into the drivers of their groups in frame order
//!   (a message for a group this shard does not host is counted and
//!   dropped: its partition moved or is not created here yet).
//! - **Clock.** One timer per shard ticks every driver every
//!   [`REPLICA_TICK`] ([`ReplicationHost::run_ticks`]).
//!
//! Placement rule of this step: a partition's group lives on the same
//! shard index on every node of its replica set, so one link per peer node
//! per shard suffices and nothing crosses cores. The cluster's placement
//! (the controller) keeps that rule or forwards across cores, and says so.
//!
//! Does not own: the drivers' pumps (the partition that opens a driver
//! spawns its pump), the listener's address or the peers' (the cluster's
//! configuration), the receiving side of its links (the shard starts a
//! `PeerReceiver`, with the same `PeerTls` when the links are TLS).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;

use raft::eraftpb::Message;

use crate::io::Storage;
use crate::net::peer::{PeerSender, PeerTls, SenderLimits};
use crate::replica::limits::REPLICA_TICK;
use crate::replica::wire::{Frame, GroupId};
use crate::replica::ReplicaDriver;

/// What a host moved and dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicationStats {
    /// Messages stepped into a driver.
    pub delivered: u64,
    /// Messages for a group this shard does not host.
    pub unknown_group: u64,
    /// Messages for a group installing a snapshot, dropped (its member
    /// appends nothing to the log the install replaces; raft-rs resends).
    pub installing: u64,
    /// Messages handed to a peer link.
    pub sent: u64,
    /// Messages to a node with no link.
    pub no_link: u64,
    /// Messages a link refused (full outbox, closed, unsendable).
    pub refused: u64,
    /// Ticks given (each to every driver).
    pub ticks: u64,
}

/// A shard's replicated partitions and peer links. See the module docs.
pub struct ReplicationHost<S: Storage> {
    node: u64,
    /// Mutual TLS for the links this host opens (`None`: plain TCP).
    tls: Option<PeerTls>,
    groups: RefCell<BTreeMap<GroupId, Rc<ReplicaDriver<S>>>>,
    links: RefCell<BTreeMap<u64, Rc<PeerSender>>>,
    stats: Cell<ReplicationStats>,
    stopped: Cell<bool>,
    /// When each peer node's last frame arrived here (`peers`).
    heard: RefCell<BTreeMap<u64, crate::clock::Instant>>,
    started: crate::clock::Instant,
    /// Where snapshot offers (`MsgSnapshot`) and transfer messages go
    /// instead of a driver (`replica/snapshot.rs`); without one they are
    /// stepped (raft-rs answers an offer from the log it has).
    snapshots: RefCell<Option<SnapshotHook>>,
    /// Groups installing a snapshot: their raft messages are dropped (the
    /// member appends nothing to the log the install replaces).
    paused: RefCell<std::collections::BTreeSet<GroupId>>,
}

/// What takes a group's snapshot offers and transfer messages.
pub type SnapshotHook = Rc<dyn Fn(GroupId, Message)>;

/// What a shard heard from one peer node it links to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerHeard {
    pub node: u64,
    /// Milliseconds since its last replication frame arrived here, or
    /// since the shard started when none has (`heard` false).
    pub silent_ms: u64,
    pub heard: bool,
    /// Groups hosted here that it is a member of: with none, silence is
    /// normal (nothing to send either way).
    pub shared_groups: u64,
}

impl<S: Storage> std::fmt::Debug for ReplicationHost<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationHost")
            .field("node", &self.node)
            .field("groups", &self.groups.borrow().len())
            .field("stats", &self.stats.get())
            .finish_non_exhaustive()
    }
}

impl<S: Storage + 'static> ReplicationHost<S> {
    /// The host of node `node`'s shard, with no links or groups yet; its
    /// links are plain TCP.
    pub fn new(node: u64) -> Rc<Self> {
        ReplicationHost::with_security(node, None)
    }

    /// [`new`](Self::new) whose links are mutual TLS with `tls` (the node
    /// its certificate names is this host's node).
    pub fn new_tls(tls: PeerTls) -> Rc<Self> {
        ReplicationHost::with_security(tls.node(), Some(tls))
    }

    fn with_security(node: u64, tls: Option<PeerTls>) -> Rc<Self> {
        Rc::new(ReplicationHost {
            node,
            tls,
            groups: RefCell::default(),
            links: RefCell::default(),
            stats: Cell::default(),
            stopped: Cell::new(false),
            heard: RefCell::default(),
            started: crate::clock::instant_now(),
            snapshots: RefCell::new(None),
            paused: RefCell::default(),
        })
    }

    /// Drops `group`'s raft messages until [`resume`](Self::resume) (its
    /// member installs a snapshot).
    pub fn pause(&self, group: GroupId) {
        self.paused.borrow_mut().insert(group);
    }

    /// Steps `group`'s raft messages again.
    pub fn resume(&self, group: GroupId) {
        self.paused.borrow_mut().remove(&group);
    }

    /// Sends snapshot offers and transfer messages to `hook` from now on.
    pub fn set_snapshot_hook(&self, hook: SnapshotHook) {
        *self.snapshots.borrow_mut() = Some(hook);
    }

    pub fn node(&self) -> u64 {
        self.node
    }

    pub fn stats(&self) -> ReplicationStats {
        self.stats.get()
    }

    fn count(&self, change: impl FnOnce(&mut ReplicationStats)) {
        let mut stats = self.stats.get();
        change(&mut stats);
        self.stats.set(stats);
    }

    /// Opens the link to node `peer`'s shard at `addr` (its task spawned on
    /// the current executor); replaces an earlier link to it.
    pub fn connect(&self, peer: u64, addr: SocketAddr, limits: SenderLimits) {
        let link = Rc::new(match &self.tls {
            Some(tls) => PeerSender::start_tls(tls, peer, addr, limits),
            None => PeerSender::start(self.node, addr, limits),
        });
        if let Some(old) = self.links.borrow_mut().insert(peer, link) {
            glommio::spawn_local(async move { old.close().await }).detach();
        }
    }

    /// The callback a driver of `group` sends through (give it to
    /// [`ReplicaDriver::open`]). It only queues: it never calls back into
    /// a driver.
    pub fn sender(self: &Rc<Self>, group: GroupId) -> Rc<dyn Fn(Message)> {
        let host = Rc::downgrade(self);
        Rc::new(move |message: Message| {
            let Some(host) = host.upgrade() else { return };
            let link = host.links.borrow().get(&message.to).cloned();
            match link {
                Some(link) => match link.send(group, message) {
                    Ok(()) => host.count(|stats| stats.sent += 1),
                    // Dropped and counted by the link too: raft resends.
                    Err(_) => host.count(|stats| stats.refused += 1),
                },
                None => host.count(|stats| stats.no_link += 1),
            }
        })
    }

    /// Hosts `driver` as the member of `group` here (replacing one hosted
    /// before, which is returned).
    pub fn add(
        &self,
        group: GroupId,
        driver: Rc<ReplicaDriver<S>>,
    ) -> Option<Rc<ReplicaDriver<S>>> {
        self.groups.borrow_mut().insert(group, driver)
    }

    /// Stops hosting `group`; returns its driver.
    pub fn remove(&self, group: GroupId) -> Option<Rc<ReplicaDriver<S>>> {
        self.groups.borrow_mut().remove(&group)
    }

    /// Every group hosted here and its driver.
    pub fn drivers(&self) -> Vec<(GroupId, Rc<ReplicaDriver<S>>)> {
        self.groups.borrow().iter().map(|(group, driver)| (*group, driver.clone())).collect()
    }

    /// The driver hosted for `group`.
    pub fn driver(&self, group: GroupId) -> Option<Rc<ReplicaDriver<S>>> {
        self.groups.borrow().get(&group).cloned()
    }

    /// Steps a received frame's messages into their drivers, in order (the
    /// receiver's sink).
    pub fn deliver(&self, frame: Frame) {
        // Every frame is a sign of life, heartbeats included (a leader
        // sends one per group every `REPLICA_HEARTBEAT_TICKS` ticks).
        self.heard.borrow_mut().insert(frame.from, crate::clock::instant_now());
        let hook = self.snapshots.borrow().clone();
        for (group, message) in frame.messages {
            if let Some(hook) = &hook {
                if message.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot
                    || crate::replica::snapshot::is_transfer(&message)
                    || crate::replica::snapshot::is_forward(&message)
                {
                    self.count(|stats| stats.delivered += 1);
                    hook(group, message);
                    continue;
                }
            }
            if self.paused.borrow().contains(&group) {
                self.count(|stats| stats.installing += 1);
                continue;
            }
            let driver = self.groups.borrow().get(&group).cloned();
            match driver {
                Some(driver) => {
                    driver.step(message);
                    self.count(|stats| stats.delivered += 1);
                }
                None => self.count(|stats| stats.unknown_group += 1),
            }
        }
    }

    /// What this shard heard from each peer node it links to: the health
    /// `spool cluster status` reads (`spool_peer_silence_seconds`).
    pub fn peers(&self) -> Vec<PeerHeard> {
        let now = crate::clock::instant_now();
        let heard = self.heard.borrow();
        let mut shared: BTreeMap<u64, u64> = BTreeMap::new();
        for driver in self.groups.borrow().values() {
            for member in driver.members() {
                *shared.entry(member).or_default() += 1;
            }
        }
        self.links
            .borrow()
            .keys()
            .map(|&node| {
                let last = heard.get(&node).copied();
                let since = now.saturating_duration_since(last.unwrap_or(self.started));
                PeerHeard {
                    node,
                    silent_ms: u64::try_from(since.as_millis()).unwrap_or(u64::MAX),
                    heard: last.is_some(),
                    shared_groups: shared.get(&node).copied().unwrap_or(0),
                }
            })
            .collect()
    }

    /// Ticks every hosted driver once.
    pub fn tick(&self) {
        let drivers: Vec<Rc<ReplicaDriver<S>>> = self.groups.borrow().values().cloned().collect();
        for driver in drivers {
            driver.tick();
        }
        self.count(|stats| stats.ticks += 1);
    }

    /// Ticks every driver every [`REPLICA_TICK`] until [`stop`](Self::stop).
    pub async fn run_ticks(self: Rc<Self>) {
        while !self.stopped.get() {
            glommio::timer::sleep(REPLICA_TICK).await;
            if !self.stopped.get() {
                self.tick();
            }
        }
    }

    /// Ends the ticks, closes every link and every hosted driver.
    pub async fn stop(&self) {
        self.stopped.set(true);
        let drivers: Vec<_> =
            std::mem::take(&mut *self.groups.borrow_mut()).into_values().collect();
        for driver in drivers {
            driver.close();
        }
        let links: Vec<_> = std::mem::take(&mut *self.links.borrow_mut()).into_values().collect();
        for link in links {
            link.close().await;
        }
    }
}
