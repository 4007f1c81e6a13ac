//! [`Node`]: a broker with its admin port — what `spoold` runs. It owns
//! the order of the two: the admin port is bound before the shards start
//! (a taken port is a start error, like a taken shard port) and served once
//! they are up (no probe comes in before there is something to report),
//! and its thread is joined after the executors stopped. The broker itself
//! (`shard::Broker`) knows nothing of the admin port: the admin port sits
//! above it and reaches it only through its [`CoordinatorHandle`].
//!
//! It must not hold broker state or start executors itself.

use std::net::SocketAddr;

use thiserror::Error;

use super::{AdminError, AdminServer};
use crate::control::config::BrokerConfig;
use crate::fatal::FatalReason;
use crate::net::listener::NetError;
use crate::shard::hooks::ShardHooksFactory;
use crate::shard::{Broker, CoordinatorHandle, RunError, StartError};

/// Why a node did not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error(transparent)]
    Broker(#[from] StartError),
    #[error(transparent)]
    Admin(#[from] AdminError),
}

impl NodeError {
    /// The exit reason for `spoold`.
    pub fn fatal_reason(&self) -> FatalReason {
        match self {
            NodeError::Broker(error) => error.fatal_reason(),
            NodeError::Admin(AdminError::Bind(NetError::PortInUse { .. })) => {
                FatalReason::PortInUse
            }
            NodeError::Admin(_) => FatalReason::Startup,
        }
    }
}

/// A running broker and its admin port (unless `admin_listen` is off).
#[derive(Debug)]
pub struct Node {
    broker: Broker,
    admin: Option<AdminServer>,
}

impl Node {
    /// Binds the admin port, starts the broker, then serves the admin port.
    ///
    /// # Errors
    /// [`NodeError::Admin`] when the admin port cannot be bound or its
    /// thread not started (the broker is stopped again first);
    /// [`NodeError::Broker`] when the broker does not start.
    pub fn start<F: ShardHooksFactory>(
        config: BrokerConfig,
        factory: F,
    ) -> Result<Node, NodeError> {
        let listener = config.admin_listen.map(super::bind).transpose()?;
        let shard_listen = config.shard_listen(0);
        let (auth, tls) = (config.auth.clone(), config.tls.clone());
        let admin_memory = config.admin_memory_bytes();
        let broker = Broker::start(config, factory)?;
        let admin = match listener {
            None => None,
            Some(listener) => {
                let coordinator = broker.coordinator();
                match AdminServer::spawn(
                    listener,
                    coordinator,
                    shard_listen,
                    auth,
                    tls,
                    admin_memory,
                ) {
                    Ok(admin) => Some(admin),
                    Err(error) => {
                        broker.request_stop();
                        if let Err(stop) = broker.wait() {
                            tracing::error!(%stop, "stopping after the admin port failed");
                        }
                        return Err(error.into());
                    }
                }
            }
        };
        tracing::info!(
            admin = %admin.as_ref().map_or("off".to_owned(), |admin| admin.addr().to_string()),
            "admin port"
        );
        Ok(Node { broker, admin })
    }

    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    pub fn coordinator(&self) -> CoordinatorHandle {
        self.broker.coordinator()
    }

    /// Where the admin port listens (`None`: turned off).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(AdminServer::addr)
    }

    /// Blocks until the broker has stopped ([`Broker::wait`]), then until
    /// the admin thread has: it ends within `ADMIN_STOP_POLL` of the stop
    /// flag, which is set by then (set here too, for an executor that
    /// stopped on its own).
    ///
    /// # Errors
    /// What [`Broker::wait`] returns.
    pub fn wait(self) -> Result<(), RunError> {
        let stop = self.broker.stop_flag();
        let result = self.broker.wait();
        stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(admin) = self.admin {
            admin.join();
        }
        result
    }
}
