//! The Spool client for tokio, and the `spool` CLI built on it.
//!
//! The crate depends on `spool-wire` (the codec) and tokio, never on the
//! broker: it speaks only the protocol in `docs/design/protocol.md`.
//!
//! - [`Connection`]: one pipelined TCP connection; responses are matched by
//!   correlation id and complete out of order; bounded in flight
//!   ([`limits::IN_FLIGHT_REQUESTS_MAX`]); per-request timeout; a liveness
//!   probe ([`Liveness`]: a Ping after a silence while requests are
//!   outstanding) that closes a connection whose broker answers nothing, so
//!   a hung broker costs seconds rather than the request timeout.
//! - [`Client`]: metadata and one connection per shard; routes each data
//!   request to the owning shard and follows `NOT_OWNER`. Its data calls
//!   are the protocol's, one partition at a time, except
//!   [`Client::claim_any`], which claims from whichever partition of a
//!   queue has messages (one long-poll over all of them, one deadline).
//!   [`ClaimOptions::new`] fills in a claim's defaults; [`Client::ack`]
//!   fails with [`ClientError::AckRefused`] when any token was refused.
//! - [`Producer`]: batching (linger, `max_batch_bytes`, and a per-partition
//!   in-flight limit under which a zero-linger producer — the default —
//!   sends at once and batches whatever arrives meanwhile), routing by key,
//!   retries that
//!   resend the same bytes (same message ids, so the broker's dedupe keeps
//!   a retry from duplicating).
//! - [`Consumer`]: claims only free room (execution slots plus an optional
//!   prefetch) as credits, with several claims in flight, runs an async
//!   handler per [`Delivery`], extends leases while deliveries wait and run,
//!   frees a slot as soon as its handler returns and acks `Ok`s in batches
//!   (one Ack request for many tokens, a bounded pipeline of its own),
//!   releases with the error text on `Err`, drains and flushes its acks on
//!   shutdown.
//! - [`Admin`]: queues, peek, purge, dead letters, redrive.
//!
//! Errors are one enum, [`ClientError`]; [`ClientError::code`] gives the
//! broker's stable [`ErrorCode`](spool_wire::ErrorCode) where there is one.
//!
//! # Example
//!
//! A producer, a consumer, and the same work by hand with
//! [`Client::claim_any`] and [`Client::ack`]:
//!
//! ```no_run
//! use spool_client::{default_queue_config, Admin, Client, Consumer, ConsumerConfig, Delivery};
//! use spool_client::{Message, PayloadView, Producer, ProducerConfig};
//!
//! # async fn demo() -> Result<(), spool_client::ClientError> {
//! let client = Client::connect("127.0.0.1:7400").await?;
//! Admin::new(client.clone()).create_queue("emails", default_queue_config(4)).await?;
//!
//! let producer = Producer::new(client.clone(), ProducerConfig::default())?;
//! let offset = producer
//!     .send("emails", Message::new("welcome alice@example.com").key("alice"))
//!     .await?;
//! println!("enqueued at offset {}", offset.0);
//!
//! let consumer = Consumer::start(client.clone(), ConsumerConfig::new("emails", 8), |delivery: Delivery| async move {
//!     if let PayloadView::Inline(body) = delivery.payload() {
//!         println!("sending {}", String::from_utf8_lossy(body));
//!     }
//!     Ok::<(), String>(()) // Err("smtp down".into()) would release with that reason
//! })?;
//! tokio::time::sleep(std::time::Duration::from_secs(1)).await;
//! let stats = consumer.shutdown().await;
//! assert!(stats.outstanding_max <= 8);
//!
//! // By hand: claim up to 10 from any partition (waiting at most 1 s in
//! // all), ack each; a refused ack is an error, never a quiet success.
//! let options = spool_client::ClaimOptions::new(10).wait_ms(1_000);
//! for delivery in client.claim_any("emails", &options).await? {
//!     println!("partition {} offset {}", delivery.partition().0, delivery.offset().0);
//!     client.ack("emails", delivery.partition(), &[delivery.token()]).await?;
//! }
//! # Ok(()) }
//! ```

mod admin;
pub mod auth;
mod client;
mod clock;
mod connection;
mod consumer;
mod delivery;
mod error;
pub mod limits;
mod liveness;
mod producer;
pub mod routing;
pub mod tls;
mod versions;

pub use admin::{default_queue_config, Admin};
pub use auth::Credentials;
pub use client::{
    process_worker, shard_address, ClaimBatch, ClaimOptions, Client, ClientConfig, Session,
};
pub use connection::{Connection, ConnectionConfig, ResponseBytes};
pub use consumer::{
    AckObserver, ClaimObserver, Consumer, ConsumerConfig, ConsumerStats, PANIC_REASON,
    SHUTDOWN_REASON,
};
pub use delivery::{Delivery, PayloadView};
pub use error::{ClientError, RefusedAck};
pub use liveness::Liveness;
pub use producer::{Message, Producer, ProducerConfig, SendFuture};
pub use routing::partition_for_key;
pub use spool_wire;
/// What [`Admin::create_subscription`] and [`Admin::describe_queue`] take and
/// list, from the codec.
pub use spool_wire::proto::{SubscriptionStart, SubscriptionStats};
pub use tls::TlsConfig;
pub use versions::request_version;
