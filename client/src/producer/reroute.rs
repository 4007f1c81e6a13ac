//! A producer's records refused with `KEY_MOVED`: their queue was resized
//! and their keys map to another partition now. They are routed again,
//! each into its new partition's open batch, after the queue's metadata
//! is fetched again; the same bytes (same message id) go out, and the old
//! partition took none of them, so a route never duplicates.

use spool_wire::batch::Record;
use spool_wire::ErrorCode;
use tokio::sync::oneshot;

use super::{Producer, Waiter};
use crate::error::ClientError;
use crate::limits::PRODUCER_REROUTES_MAX;

/// A record the broker refused with `KEY_MOVED`, to route again.
pub(super) struct Moved {
    pub(super) record: Record,
    pub(super) waiter: Waiter,
}

impl Producer {
    /// Routes again what the broker refused with `KEY_MOVED` (the queue
    /// was resized): the queue's metadata is fetched again first, so each
    /// record goes where its key maps now. A record moved more than
    /// [`PRODUCER_REROUTES_MAX`] times fails with the broker's answer.
    pub(super) async fn reroute(&self, queue: &str, moved: Vec<Moved>) {
        self.inner.client.forget_queue(queue);
        for Moved { record, mut waiter } in moved {
            waiter.reroutes += 1;
            if waiter.reroutes > PRODUCER_REROUTES_MAX {
                let _ = waiter.sender.send(Err(ClientError::Server {
                    code: ErrorCode::KeyMoved,
                    message: format!(
                        "the record's key kept moving ({PRODUCER_REROUTES_MAX} routes): is the \
                         queue being resized again and again?"
                    ),
                }));
                continue;
            }
            // A failed placement ends the waiter (dropped sender: the
            // caller sees the producer shut down), so report it.
            let (sender, receiver) = oneshot::channel();
            let original = std::mem::replace(&mut waiter.sender, sender);
            match self.place(queue, record, waiter).await {
                Ok(_) => {
                    tokio::spawn(async move {
                        let outcome = receiver.await.unwrap_or(Err(ClientError::Shutdown));
                        let _ = original.send(outcome);
                    });
                }
                Err(error) => {
                    let _ = original.send(Err(error));
                }
            }
        }
    }
}

/// Record `index` of the batch `bytes` the producer built.
pub(super) fn batch_record(bytes: &[u8], index: usize) -> Result<Record, ClientError> {
    let view = spool_wire::batch::BatchView::validate(bytes)?;
    if index >= view.len() {
        return Err(ClientError::Protocol(format!(
            "record {index} of a {}-record batch",
            view.len()
        )));
    }
    Ok(view.record(index).to_record()?)
}
