//! A shard's snapshot transfers (`docs/design/replication.md` §6): serving
//! the pieces of this node's checkpoints to members that pull them, and
//! installing one this node is offered.
//!
//! - **Serving (leader).** raft-rs sends a member it cannot catch up from
//!   the log a `MsgSnapshot` naming this node's offered checkpoint; the
//!   member pulls its pieces ([`Transfer::Pull`]), one at a time, from
//!   this shard: the first pull reads the checkpoint and its dedupe files
//!   into memory ([`Partition::snapshot_source`]), later ones are answered
//!   from them or by reading a data batch. A member that reports the
//!   install ([`Transfer::Installed`]) is caught up by raft-rs from the
//!   entry after the snapshot; one that pulls nothing for
//!   [`SNAPSHOT_IDLE_TIMEOUT`] (it died, or the offer was lost) is
//!   reported failed, and raft-rs probes it and offers again. At most
//!   [`SNAPSHOT_TRANSFERS_MAX`] transfers are served at once.
//! - **Installing (member).** An offer past what this member's log holds
//!   starts an install (at most [`SNAPSHOT_TRANSFERS_MAX`] at once; an
//!   offer it does not need is stepped, and raft-rs answers it). The
//!   group's raft messages are dropped meanwhile. Phase one, with the old
//!   partition still open: pull every piece, stage the dedupe files, append
//!   the journal's install marker and the record batches as copies, all
//!   durable. Phase two: close the partition, move the staged files into
//!   place, write the install's checkpoint (the install is in effect from
//!   its rename), open the partition again from the install's entries,
//!   and tell the leader. A failure in phase one leaves the old partition
//!   as it was (its journal entries of the install stay out of effect);
//!   one in phase two leaves the partition refused as any failed open.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use raft::eraftpb::{Message, MessageType};

use super::{ShardPartition, ShardState};
use crate::clock::{instant_now, Instant};
use crate::io::DmaStorage;
use crate::log::journal::RecoveredLog;
use crate::partition::snapshot::{
    clear_staged, install_checkpoint, stage_generation, SnapshotFile, SnapshotSource,
};
use crate::partition::PartitionError;
use crate::queue::{PartitionId, QueueId};
use crate::replica::limits::{
    SNAPSHOT_CHUNK_BYTES, SNAPSHOT_FILES_BYTES_MAX, SNAPSHOT_IDLE_TIMEOUT, SNAPSHOT_PIECE_TIMEOUT,
    SNAPSHOT_PULL_WINDOW, SNAPSHOT_TRANSFERS_MAX, SNAPSHOT_WATCH_INTERVAL,
};
use crate::replica::snapshot::{decode, encode, Piece, Transfer};
use crate::replica::wire::GroupId;
use crate::shard::report::SnapshotStats;

/// One piece of a transfer being served.
#[derive(Debug, Clone, Copy)]
enum Planned {
    File { file: usize, at: usize, len: usize, last: bool },
    Batch(u64),
    End,
}

/// A transfer this shard serves to one member.
struct Serving {
    index: u64,
    source: Option<Rc<SnapshotSource>>,
    plan: Rc<Vec<Planned>>,
    /// The last pull (or the offer first seen).
    active: Instant,
    /// The source is being read.
    reading: bool,
}

/// An install this shard runs: where its member's pieces go.
struct Installing {
    from: u64,
    index: u64,
    /// Pieces arrived and not yet taken, by number (at most
    /// [`SNAPSHOT_PULL_WINDOW`] pulled ahead), and the leader's refusal.
    pieces: RefCell<BTreeMap<u64, Piece>>,
    gone: RefCell<Option<String>>,
    arrived: crate::log::wakers::Notify,
}

/// A shard's transfers; see the module docs.
#[derive(Default)]
pub struct Snapshots {
    serving: RefCell<BTreeMap<(GroupId, u64), Serving>>,
    installing: RefCell<BTreeMap<GroupId, Rc<Installing>>>,
    /// Told when a source read ends (pulls that came meanwhile wait).
    read_ended: crate::log::wakers::Notify,
    /// When [`watch`] last looked (it looks at most every
    /// [`SNAPSHOT_WATCH_INTERVAL`]).
    watched: std::cell::Cell<Option<Instant>>,
    stats: std::cell::Cell<SnapshotStats>,
}

impl Snapshots {
    /// What the shard's transfers did since it started.
    pub(super) fn stats(&self) -> SnapshotStats {
        self.stats.get()
    }

    fn count(&self, change: impl FnOnce(&mut SnapshotStats)) {
        let mut stats = self.stats.get();
        change(&mut stats);
        self.stats.set(stats);
    }
}

impl std::fmt::Debug for Snapshots {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Snapshots")
            .field("serving", &self.serving.borrow().len())
            .field("installing", &self.installing.borrow().len())
            .finish()
    }
}

fn plan_of(source: &SnapshotSource) -> Vec<Planned> {
    let mut plan = Vec::new();
    for (file, shipped) in source.files.iter().enumerate() {
        let len = shipped.payload.len();
        let mut at = 0;
        loop {
            let piece = (len - at).min(SNAPSHOT_CHUNK_BYTES);
            let last = at + piece == len;
            plan.push(Planned::File { file, at, len: piece, last });
            at += piece;
            if last {
                break;
            }
        }
    }
    plan.extend(source.batches.iter().map(|first| Planned::Batch(*first)));
    plan.push(Planned::End);
    plan
}

/// Takes a snapshot offer or transfer message for `group` (the host's
/// hook).
pub(super) fn on_message(state: &Rc<ShardState>, group: GroupId, message: Message) {
    if message.get_msg_type() == MessageType::MsgSnapshot {
        offered(state, group, message);
        return;
    }
    let transfer = match decode(message.get_context()) {
        Ok(transfer) => transfer,
        Err(error) => {
            tracing::warn!(node = message.from, ?group, %error, "snapshot transfer message dropped");
            return;
        }
    };
    let from = message.from;
    match transfer {
        Transfer::Pull { index, piece } => {
            let state = state.clone();
            glommio::spawn_local(
                async move { serve_pull(&state, group, from, index, piece).await },
            )
            .detach();
        }
        Transfer::Declined { index } => {
            let served = state.snapshots.serving.borrow_mut().remove(&(group, from));
            if let Some(driver) = host_driver(state, group) {
                driver.report_snapshot(from, false);
            }
            tracing::debug!(
                ?group,
                member = from,
                index,
                known = served.is_some(),
                "snapshot offer declined for now"
            );
        }
        Transfer::Installed { index } => {
            let served = state.snapshots.serving.borrow_mut().remove(&(group, from));
            if served.is_some_and(|served| served.index == index) {
                if let Some(driver) = host_driver(state, group) {
                    driver.report_snapshot(from, true);
                }
                tracing::info!(?group, member = from, index, "snapshot installed by a member");
            }
        }
        Transfer::Piece { index, .. } | Transfer::Gone { index, .. } => {
            let installing = state.snapshots.installing.borrow().get(&group).cloned();
            if let Some(installing) = installing.filter(|i| i.from == from && i.index == index) {
                match transfer {
                    Transfer::Piece { piece, body, .. } => {
                        let mut pieces = installing.pieces.borrow_mut();
                        if pieces.len() < SNAPSHOT_PULL_WINDOW {
                            pieces.insert(piece, body);
                        }
                    }
                    Transfer::Gone { reason, .. } => *installing.gone.borrow_mut() = Some(reason),
                    _ => {}
                }
                installing.arrived.notify_all();
            }
        }
    }
}

fn host_driver(
    state: &ShardState,
    group: GroupId,
) -> Option<Rc<crate::replica::ReplicaDriver<DmaStorage>>> {
    state.cluster.as_ref()?.host.driver(group)
}

fn send(state: &ShardState, group: GroupId, to: u64, transfer: &Transfer) {
    let Some(cluster) = &state.cluster else { return };
    let message = encode(cluster.node.node_id(), to, transfer);
    (cluster.host.sender(group))(message);
}

/// Tells member `to` its transfer is refused, and raft-rs it failed.
fn refused(state: &ShardState, group: GroupId, to: u64, gone: &Transfer) {
    send(state, group, to, gone);
    state.snapshots.count(|stats| stats.offers_failed += 1);
    if let Some(driver) = host_driver(state, group) {
        driver.report_snapshot(to, false);
    }
}

/// Reports failed the transfers no member pulled from for
/// [`SNAPSHOT_IDLE_TIMEOUT`], and notes offers raft-rs waits on (call
/// every housekeeping tick: it looks every [`SNAPSHOT_WATCH_INTERVAL`]).
pub(super) fn watch(state: &Rc<ShardState>) {
    let Some(cluster) = &state.cluster else { return };
    let now = instant_now();
    let watched = state.snapshots.watched.get();
    if watched.is_some_and(|at| now.duration_since(at) < SNAPSHOT_WATCH_INTERVAL) {
        return;
    }
    state.snapshots.watched.set(Some(now));
    let mut serving = state.snapshots.serving.borrow_mut();
    for (group, driver) in cluster.host.drivers() {
        for (member, index) in driver.snapshots_pending() {
            let entry = serving.entry((group, member)).or_insert_with(|| Serving {
                index,
                source: None,
                plan: Rc::default(),
                active: now,
                reading: false,
            });
            if entry.index != index {
                *entry = Serving {
                    index,
                    source: None,
                    plan: Rc::default(),
                    active: now,
                    reading: false,
                };
            }
            if now.duration_since(entry.active) >= SNAPSHOT_IDLE_TIMEOUT && !entry.reading {
                tracing::info!(
                    ?group,
                    member,
                    index,
                    "snapshot offer not pulled in time; raft-rs offers again later"
                );
                driver.report_snapshot(member, false);
                state.snapshots.count(|stats| stats.offers_failed += 1);
                entry.active = now;
                entry.source = None;
                entry.plan = Rc::default();
            }
        }
    }
    // Transfers whose group left this shard or stopped leading.
    serving.retain(|(group, member), served| {
        let pending = cluster
            .host
            .driver(*group)
            .is_some_and(|driver| driver.snapshots_pending().contains(&(*member, served.index)));
        pending || now.duration_since(served.active) < SNAPSHOT_IDLE_TIMEOUT
    });
}

/// The source and plan of the transfer to member `to` of the snapshot at
/// `index`: read once per transfer (pulls that come while it is read wait
/// for it). `None` when it was refused (the member was told).
async fn source_of(
    state: &Rc<ShardState>,
    partition: &ShardPartition,
    group: GroupId,
    to: u64,
    index: u64,
) -> Option<(Rc<SnapshotSource>, Rc<Vec<Planned>>)> {
    let gone = |reason: String| Transfer::Gone { index, reason };
    let key = (group, to);
    loop {
        let read_ended = state.snapshots.read_ended.wait();
        {
            let mut serving = state.snapshots.serving.borrow_mut();
            let busy = serving.values().filter(|served| served.source.is_some() || served.reading);
            let others = busy.count();
            let fresh = || Serving {
                index,
                source: None,
                plan: Rc::default(),
                active: instant_now(),
                reading: false,
            };
            let entry = serving.entry(key).or_insert_with(fresh);
            if entry.index != index {
                *entry = fresh();
            }
            entry.active = instant_now();
            match &entry.source {
                Some(source) => return Some((source.clone(), entry.plan.clone())),
                None if entry.reading => {}
                None if others >= SNAPSHOT_TRANSFERS_MAX => {
                    drop(serving);
                    let reason = "this node serves as many transfers as it may".to_owned();
                    refused(state, group, to, &gone(reason));
                    return None;
                }
                None => {
                    entry.reading = true;
                    break;
                }
            }
        }
        read_ended.await;
    }
    let read = partition.snapshot_source().await;
    let mut serving = state.snapshots.serving.borrow_mut();
    state.snapshots.read_ended.notify_all();
    let entry = serving.get_mut(&key)?;
    entry.reading = false;
    match read {
        Ok(source) if source.index == index => {
            state.snapshots.count(|stats| stats.served += 1);
            let plan = Rc::new(plan_of(&source));
            let source = Rc::new(source);
            entry.source = Some(source.clone());
            entry.plan = plan.clone();
            Some((source, plan))
        }
        // A newer checkpoint landed since the offer (or none can be read):
        // raft-rs is told at once, so its next offer names the one now in
        // place.
        Ok(source) => {
            serving.remove(&key);
            drop(serving);
            let reason = format!("the checkpoint offered now is at entry {}", source.index);
            refused(state, group, to, &gone(reason));
            None
        }
        Err(error) => {
            serving.remove(&key);
            drop(serving);
            tracing::warn!(?group, member = to, index, %error, "snapshot not served");
            refused(state, group, to, &gone(error.to_string()));
            None
        }
    }
}

async fn serve_pull(state: &Rc<ShardState>, group: GroupId, to: u64, index: u64, piece: u64) {
    let gone = |reason: String| Transfer::Gone { index, reason };
    let Some(partition) = state.partition_by_id(QueueId(group.queue), PartitionId(group.partition))
    else {
        send(state, group, to, &gone("the partition is not open on this node".into()));
        return;
    };
    let Some((source, plan)) = source_of(state, &partition, group, to, index).await else {
        return;
    };
    // A pull past the last piece (pulled ahead) is answered with the last.
    let at = usize::try_from(piece).ok().and_then(|at| plan.get(at)).or(plan.last());
    let Some(planned) = at.copied() else {
        send(state, group, to, &gone(format!("no piece {piece}")));
        return;
    };
    let body = match planned {
        Planned::File { file, at, len, last } => {
            let shipped = &source.files[file];
            let bytes = shipped.payload[at..at + len].to_vec();
            let (name, value, at) = (shipped.name.clone(), shipped.value, at as u64);
            Piece::File { name, value, at, last, bytes }
        }
        Planned::Batch(first) => match partition.snapshot_batch(first).await {
            // Let go of meanwhile: an empty batch says so.
            Ok(bytes) => Piece::Batch { bytes: bytes.unwrap_or_default() },
            Err(error) => {
                send(state, group, to, &gone(format!("batch at offset {first}: {error}")));
                return;
            }
        },
        Planned::End => Piece::End { covers: source.covers },
    };
    let bytes = match &body {
        Piece::File { bytes, .. } | Piece::Batch { bytes } => bytes.len() as u64,
        Piece::End { .. } => 0,
    };
    state.snapshots.count(|stats| {
        stats.served_pieces += 1;
        stats.served_bytes += bytes;
    });
    send(state, group, to, &Transfer::Piece { index, piece, body });
}

/// An offer: installs it, or steps it when this member does not need it
/// (module docs).
fn offered(state: &Rc<ShardState>, group: GroupId, message: Message) {
    let Some(cluster) = &state.cluster else { return };
    let Some(driver) = cluster.host.driver(group) else { return };
    let metadata = message.get_snapshot().get_metadata();
    let (index, term, from) = (metadata.index, metadata.term, message.from);
    let installing_from = state.snapshots.installing.borrow().get(&group).map(|i| i.from);
    if let Some(installing_from) = installing_from {
        // Another leader's offer (a new term) while one installs: declined,
        // so it offers again rather than wait for a transfer never pulled.
        if installing_from != from {
            send(state, group, from, &Transfer::Declined { index });
        }
        return;
    }
    if !driver.needs_install(index, term) {
        driver.step(message);
        return;
    }
    if state.snapshots.installing.borrow().len() >= SNAPSHOT_TRANSFERS_MAX {
        // The leader offers again at once rather than after its wait.
        send(state, group, from, &Transfer::Declined { index });
        return;
    }
    let installing = Rc::new(Installing {
        from,
        index,
        pieces: RefCell::default(),
        gone: RefCell::new(None),
        arrived: crate::log::wakers::Notify::default(),
    });
    state.snapshots.installing.borrow_mut().insert(group, installing.clone());
    cluster.host.pause(group);
    tracing::info!(?group, leader = from, index, term, "installing a snapshot");
    let state = state.clone();
    glommio::spawn_local(async move {
        let result = install(&state, group, &installing, term).await;
        state.snapshots.installing.borrow_mut().remove(&group);
        if let Some(cluster) = &state.cluster {
            cluster.host.resume(group);
        }
        match result {
            Ok(installed) => {
                state.snapshots.count(|stats| {
                    stats.installed += 1;
                    stats.installed_bytes += installed.batch_bytes + installed.file_bytes;
                });
                send(&state, group, from, &Transfer::Installed { index });
                tracing::info!(
                    ?group,
                    index,
                    batches = installed.batches,
                    batch_bytes = installed.batch_bytes,
                    file_bytes = installed.file_bytes,
                    "snapshot installed"
                );
            }
            Err(error) => {
                state.snapshots.count(|stats| stats.install_failures += 1);
                tracing::warn!(?group, leader = from, index, %error,
                    "snapshot not installed; the leader offers one again later");
            }
        }
    })
    .detach();
}

/// Pieces pulled ahead of the one being installed: up to
/// [`SNAPSHOT_PULL_WINDOW`] in flight (a pull past the last piece is
/// answered with the last, `End`).
struct Puller<'a> {
    state: &'a ShardState,
    group: GroupId,
    installing: &'a Installing,
    /// The next piece to pull.
    pulled: u64,
}

impl Puller<'_> {
    /// Piece `piece` (every piece below it taken), pulling ahead first.
    async fn take(&mut self, piece: u64) -> Result<Piece, String> {
        let window = SNAPSHOT_PULL_WINDOW as u64;
        while self.pulled < piece + window {
            let pull = Transfer::Pull { index: self.installing.index, piece: self.pulled };
            send(self.state, self.group, self.installing.from, &pull);
            self.pulled += 1;
        }
        pull(self.installing, piece).await
    }
}

/// Waits for piece `piece` of the install's snapshot (pulled already).
async fn pull(installing: &Installing, piece: u64) -> Result<Piece, String> {
    let deadline = instant_now() + SNAPSHOT_PIECE_TIMEOUT;
    loop {
        let arrived = installing.arrived.wait();
        if let Some(body) = installing.pieces.borrow_mut().remove(&piece) {
            return Ok(body);
        }
        if let Some(reason) = installing.gone.borrow_mut().take() {
            return Err(format!("the leader: {reason}"));
        }
        let left = deadline.saturating_duration_since(instant_now());
        if left.is_zero() {
            return Err(format!("piece {piece} did not arrive in {SNAPSHOT_PIECE_TIMEOUT:?}"));
        }
        let timer = async {
            glommio::timer::Timer::new(left).await;
        };
        futures_lite::future::or(arrived, timer).await;
    }
}

/// What an install brought: record batches and their bytes, side file
/// bytes.
#[derive(Debug, Default, Clone, Copy)]
struct Installed {
    batches: u64,
    batch_bytes: u64,
    file_bytes: u64,
}

async fn install(
    state: &Rc<ShardState>,
    group: GroupId,
    installing: &Installing,
    term: u64,
) -> Result<Installed, PartitionError> {
    let refuse = |reason: String| PartitionError::Snapshot {
        dir: std::path::PathBuf::from(format!(
            "queue {} partition {}",
            group.queue, group.partition
        )),
        reason,
    };
    let (queue_id, partition_id) = (QueueId(group.queue), PartitionId(group.partition));
    let served = state
        .served_by_id(queue_id, partition_id)
        .ok_or_else(|| refuse("the partition is not open here".into()))?;
    let (queue, config) = {
        let table = state.table.borrow();
        let (name, entry) =
            table.queue_by_id(queue_id).ok_or_else(|| refuse("the queue is deleted".into()))?;
        (name.clone(), entry.config.clone())
    };
    let journal =
        state.journal.borrow().clone().ok_or_else(|| refuse("the journal is not open".into()))?;
    let dir = super::partition_dir(&state.config.data_dir, queue_id, partition_id);
    let handle = served.partition.log().journal().handle();
    clear_staged(&DmaStorage, &dir).await?;
    // Phase one: every piece, the old partition still open.
    let mut writer = journal.shard.begin_install(handle, installing.index, term)?;
    let mut checkpoint: Option<Vec<u8>> = None;
    let mut file: Option<SnapshotFile> = None;
    let mut held = 0usize;
    let mut piece = 0u64;
    let mut installed = Installed::default();
    let mut puller = Puller { state, group, installing, pulled: 0 };
    loop {
        match puller.take(piece).await.map_err(refuse)? {
            Piece::File { name, value, at, last, bytes } => {
                let mut current = file.take().unwrap_or(SnapshotFile {
                    name: name.clone(),
                    value,
                    payload: Vec::new(),
                });
                if current.name != name || current.payload.len() as u64 != at {
                    return Err(refuse(format!("piece {piece} of {name} out of order")));
                }
                held += bytes.len();
                if held > SNAPSHOT_FILES_BYTES_MAX {
                    return Err(refuse(format!("files pass {SNAPSHOT_FILES_BYTES_MAX} bytes")));
                }
                current.payload.extend_from_slice(&bytes);
                installed.file_bytes += bytes.len() as u64;
                if !last {
                    file = Some(current);
                } else if current.name == crate::partition::files::CHECKPOINT_FILE {
                    checkpoint = Some(current.payload);
                } else {
                    stage_generation(&DmaStorage, &dir, &current).await?;
                    held -= current.payload.len();
                }
            }
            Piece::Batch { bytes } if bytes.is_empty() => {}
            Piece::Batch { bytes } => {
                writer.copy(&bytes).await?;
                installed.batches += 1;
                installed.batch_bytes += bytes.len() as u64;
            }
            Piece::End { .. } => break,
        }
        piece += 1;
    }
    let state_bytes = checkpoint.ok_or_else(|| refuse("no checkpoint was shipped".into()))?;
    let (log_start, routed) = writer.finish().await?;
    // Phase two: the old partition closes, the install takes effect.
    if let Some(cluster) = &state.cluster {
        if let Some(driver) = cluster.host.remove(group) {
            driver.close();
        }
    }
    ShardState::close_served(&served).await?;
    let at = (installing.index, term);
    install_checkpoint(&DmaStorage, &dir, at, log_start, &state_bytes).await?;
    journal.routed.borrow_mut().insert(handle, routed);
    let log = RecoveredLog { committed: installing.index, ..RecoveredLog::default() };
    journal.logs.borrow_mut().insert(handle, log);
    state
        .open_partition(&queue, queue_id, partition_id, &config, Some((handle, 0)))
        .await
        .map_err(|error| refuse(format!("the installed partition did not open: {error}")))?;
    Ok(installed)
}
