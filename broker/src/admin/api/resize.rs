//! `POST /v1/queues/{queue}/resize`: grow a queue to more partitions
//! (`docs/operations.md`, "Growing a queue"), through the broker's own
//! ResizeQueue, so authentication, ACLs (`admin` on the queue) and the
//! audit log apply as they do to the CLI's.

use serde::Deserialize;
use serde_json::{json, Value};
use spool_client::Admin;

use super::error::ApiError;
use super::Gateway;

/// The body of `POST /v1/queues/{q}/resize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resize {
    /// The partition count after the resize (more than the queue has).
    pub partitions: u32,
}

impl Gateway {
    pub(super) async fn resize_queue(&self, queue: &str, body: Resize) -> Result<Value, ApiError> {
        let client = self.client().await?;
        let key_version = Admin::new(client.clone())
            .resize_queue(queue, body.partitions)
            .await
            .map_err(|error| self.fail_on(&client, queue, error))?;
        Ok(json!({ "name": queue, "partitions": body.partitions, "key_version": key_version }))
    }
}
