//! The seam between the shard bootstrap and what a shard serves.
//!
//! Owns the [`ShardHooks`] trait: the server (`crate::server`) plugs
//! partitions (log + queue) and the protocol codec in here, without touching executors, channels, timers
//! or shutdown. A [`ShardHooksFactory`] is handed to
//! [`Broker::start`](crate::shard::Broker::start); it is `Send + Sync` and
//! runs once *on each shard's executor thread*, so the hooks it builds may
//! hold `Rc`/`RefCell` state and glommio files that never leave the core.
//!
//! `spoold` serves [`SpoolHooksFactory`](crate::server::SpoolHooksFactory).
//! [`EchoHooks`] serves the length-prefixed echo protocol
//! ([`crate::net::echo`]) and no partitions: the smallest hooks, for running
//! the shard bootstrap without the Spool codec.

use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use crate::control::assignment::{AssignmentChange, AssignmentTable, AssignmentUpdate, ShardId};
use crate::control::config::BrokerConfig;
use crate::control::data_dir::BrokerSecret;
use crate::net::connection::FrameHandler;
use crate::net::echo::EchoHandler;
use crate::shard::alarm::Alarm;
use crate::shard::CoordinatorHandle;

/// What a shard knows about itself when its hooks are built.
#[derive(Debug, Clone)]
pub struct ShardContext {
    pub shard: ShardId,
    pub shard_count: u16,
    /// The CPU this shard's executor is pinned to.
    pub cpu: usize,
    /// This shard's listen address (base port + shard).
    pub listen: SocketAddr,
    pub config: Arc<BrokerConfig>,
    /// Key for delivery-token MACs.
    pub secret: BrokerSecret,
    /// The coordinator: create/delete queues from a frame handler with the
    /// `_async` methods (never the blocking ones on an executor), and
    /// `catalog_snapshot` for ListQueues/Metadata.
    pub coordinator: CoordinatorHandle,
    /// The (empty) table this shard starts from, before the catalog's
    /// replay: hooks that keep their own copy start from a clone of it and
    /// apply each update they are given.
    pub assignment_start: AssignmentTable,
    /// The table after the catalog's replay: every partition this shard
    /// will be given at start (read by [`ShardHooks::start`], before the
    /// replay's updates arrive).
    pub recovered: Arc<AssignmentTable>,
    /// This node's cluster (`[cluster]` in the config); `None` on a single
    /// node. With it, partitions are replicated and `secret` is the
    /// cluster's.
    pub cluster: Option<Arc<crate::control::cluster::ClusterNode>>,
}

/// Per-shard behaviour. Every method runs on the shard's own executor.
pub trait ShardHooks: 'static {
    /// The protocol served on this shard's port.
    type Handler: FrameHandler;
    /// Failures of assignment changes and flushes.
    type Error: std::error::Error + 'static;

    /// Runs once on the shard before any assignment update, connection or
    /// tick: what the shard needs before its partitions open (the journal
    /// layout recovers the shard's journal here). An error stops the shard
    /// and with it the broker's start. The default does nothing.
    fn start(&self) -> impl Future<Output = Result<(), Self::Error>> {
        std::future::ready(Ok(()))
    }

    /// Called once the catalog's replay is applied, before the shard
    /// accepts a connection: an error refuses the broker's start (a
    /// configuration that does not fit what the data directory holds). The
    /// default accepts.
    fn replayed(&self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Whether `error` of [`on_assignment`](Self::on_assignment) refused
    /// the change for a limit it would pass (a create that does not fit),
    /// rather than failed: its creator is told the request asked too much.
    fn refuses(error: &Self::Error) -> bool {
        let _ = error;
        false
    }

    /// The port `error` of [`start`](Self::start) found taken, if that is
    /// why it failed: the broker then exits as for its client port.
    fn port_in_use(error: &Self::Error) -> Option<std::net::SocketAddr> {
        let _ = error;
        None
    }

    /// The frame handler shared by every connection of this shard. Called
    /// once, after the hooks are built and before the first accept.
    fn frame_handler(&self) -> Rc<Self::Handler>;

    /// `update` has just been applied to the shard's copy of the table
    /// (`table` is the result): open partitions this shard now owns, close
    /// ones it lost. Updates arrive one at a time, in version order, before
    /// the next is applied. An error is logged; the shard keeps serving the
    /// rest (an unopenable partition must not take its neighbours down).
    ///
    /// At start the first updates are the catalog's replay: one
    /// `CreateQueue` per persisted queue (same id, config and placement as
    /// before the restart), so opening partitions here also recovers them.
    /// On `DeleteQueue` the hooks remove the owned partitions' directories:
    /// the catalog has already forgotten the queue, and nothing else will.
    /// A crash between the two leaves directories the catalog does not
    /// name; hooks should remove those at start. `table.queue(name)` gives
    /// the queue's id and config; to keep a copy for the frame handler,
    /// apply `update` to a clone of `ShardContext::assignment_start` (pure
    /// and cheap; the copies stay equal by construction). Never
    /// await `CoordinatorHandle::*_async` in here: the shard would wait for
    /// itself.
    fn on_assignment(
        &self,
        update: &AssignmentUpdate,
        table: &AssignmentTable,
    ) -> impl Future<Output = Result<(), Self::Error>>;

    /// Every housekeeping tick: lease expiry, scheduled → ready. Must not
    /// block; spawn a task for anything long.
    fn on_tick(&self);

    /// How long the housekeeping timer may sleep after a tick: the time to
    /// the hooks' next deadline, within `min..=max` (the configured tick and
    /// the idle bound). Hooks that plan their own wake-ups plan on
    /// [`alarm`](ShardHooks::alarm) here. The default ticks every `min`.
    fn next_tick_in(
        &self,
        min: std::time::Duration,
        max: std::time::Duration,
    ) -> std::time::Duration {
        let _ = max;
        min
    }

    /// The alarm a request rings to bring the next tick forward (a deadline
    /// earlier than the planned tick); `None` when the hooks never sleep past
    /// the configured tick.
    fn alarm(&self) -> Option<Rc<Alarm>> {
        None
    }

    /// Adds what the hooks count to `report` (the admin port's metrics and
    /// readiness): open partitions' counters, refused partitions, log
    /// figures. Reads only; must not block. The default adds nothing.
    fn report(&self, report: &mut crate::shard::report::ShardReport) {
        let _ = report;
    }

    /// A reloaded auth policy (`auth::reload`): swap it in for the requests
    /// that come next. Must not block. The default ignores it.
    fn on_policy(&self, update: &crate::auth::reload::CurrentPolicy) {
        let _ = update;
    }

    /// Shutdown, after the listener closed and every connection drained:
    /// make everything acknowledged durable and close files. An error makes
    /// the process exit non-zero.
    fn flush(&self) -> impl Future<Output = Result<(), Self::Error>>;
}

/// Builds one shard's hooks on that shard's thread.
pub trait ShardHooksFactory: Send + Sync + 'static {
    type Hooks: ShardHooks;
    fn make(&self, context: &ShardContext) -> Self::Hooks;
}

/// Hooks of the bootstrap broker: the echo protocol, no partitions.
#[derive(Debug)]
pub struct EchoHooks {
    shard: ShardId,
    handler: Rc<EchoHandler>,
}

/// Factory for [`EchoHooks`].
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoHooksFactory;

impl ShardHooksFactory for EchoHooksFactory {
    type Hooks = EchoHooks;
    fn make(&self, context: &ShardContext) -> EchoHooks {
        let frame_bytes_max = context.config.frame_bytes_max as usize;
        EchoHooks { shard: context.shard, handler: Rc::new(EchoHandler { frame_bytes_max }) }
    }
}

impl ShardHooks for EchoHooks {
    type Handler = EchoHandler;
    type Error = std::convert::Infallible;

    fn frame_handler(&self) -> Rc<EchoHandler> {
        self.handler.clone()
    }

    fn on_assignment(
        &self,
        update: &AssignmentUpdate,
        table: &AssignmentTable,
    ) -> impl Future<Output = Result<(), Self::Error>> {
        let owned = table.owned_by(self.shard).count();
        let (change, queue, queue_id) = match &update.change {
            AssignmentChange::CreateQueue { queue, queue_id, .. } => {
                ("create", queue.as_str(), Some(queue_id.0))
            }
            AssignmentChange::DeleteQueue { queue } => ("delete", queue.as_str(), None),
            AssignmentChange::GrowQueue { queue, .. } => ("grow", queue.as_str(), None),
            AssignmentChange::KeysDrained { queue, .. } => ("keys drained", queue.as_str(), None),
            AssignmentChange::SetReplicas { queue, .. } => ("replicas", queue.as_str(), None),
            AssignmentChange::ReplicasSettled { queue, .. } => {
                ("replicas settled", queue.as_str(), None)
            }
            AssignmentChange::Subscribe { queue, .. } => ("subscribe", queue.as_str(), None),
            AssignmentChange::Unsubscribe { queue, .. } => ("unsubscribe", queue.as_str(), None),
            AssignmentChange::Reseek { queue, .. } => ("reseek", queue.as_str(), None),
        };
        tracing::info!(
            shard = self.shard.0,
            version = update.version.0,
            change,
            queue,
            queue_id,
            owned_partitions = owned,
            "assignment applied (echo broker: no partitions to open)"
        );
        std::future::ready(Ok(()))
    }

    fn on_tick(&self) {}

    fn flush(&self) -> impl Future<Output = Result<(), Self::Error>> {
        std::future::ready(Ok(()))
    }
}
