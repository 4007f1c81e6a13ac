//! The dead-letter listing, redrive and purge of the admin port, over the
//! shards' binary protocol, each for a queue's default subscription or the
//! one named (`subscription`: a query parameter of the listing, a body
//! field of the others; Peek, DeadLetters, Purge and Redrive v2 on the
//! wire).

use serde_json::{json, Value};
use spool_client::spool_wire::proto::{
    validate_subscription_name, Offset, RedriveTarget, DEFAULT_SUBSCRIPTION,
};
use spool_client::Admin;

use super::error::ApiError;
use super::json::{dead_letter, Purge, Redrive};
use super::limits::{DEAD_LETTERS_DEFAULT_HTTP, DEAD_LETTERS_MAX_HTTP};
use super::Gateway;

/// The subscription as an answer names it.
fn subscription_name(name: &str) -> &str {
    if name.is_empty() {
        DEFAULT_SUBSCRIPTION
    } else {
        name
    }
}

impl Gateway {
    pub(super) async fn dead_letters(
        &self,
        queue: &str,
        query: Option<&str>,
    ) -> Result<Value, ApiError> {
        let query = DeadLetterQuery::parse(query)?;
        let client = self.client().await?;
        let partitions = self.partitions_of(&client, queue, query.partition).await?;
        let admin = Admin::new(client.clone());
        let mut listed = Vec::new();
        let mut left = query.max;
        for partition in partitions {
            if left == 0 {
                break;
            }
            let entries = admin
                .dead_letters_in(
                    queue,
                    &query.subscription,
                    partition,
                    Offset(query.from_offset),
                    left,
                )
                .await
                .map_err(|error| self.fail_on(&client, queue, error))?;
            left = left.saturating_sub(u32::try_from(entries.len()).unwrap_or(u32::MAX));
            listed.extend(entries.iter().map(|entry| dead_letter(partition.0, entry)));
        }
        Ok(
            json!({ "queue": queue, "subscription": subscription_name(&query.subscription), "dead_letters": listed }),
        )
    }

    pub(super) async fn redrive(&self, queue: &str, body: Redrive) -> Result<Value, ApiError> {
        let target = match body.offsets {
            Some(_) if body.partition.is_none() => {
                return Err(ApiError::invalid("offsets need a partition"))
            }
            Some(offsets) => RedriveTarget::Offsets(offsets.into_iter().map(Offset).collect()),
            None => RedriveTarget::All,
        };
        let client = self.client().await?;
        let partitions = self.partitions_of(&client, queue, body.partition).await?;
        let admin = Admin::new(client.clone());
        let mut total = 0u64;
        let mut counts = Vec::new();
        for partition in partitions {
            let count = admin
                .redrive_in(queue, &body.subscription, partition, target.clone())
                .await
                .map_err(|error| self.fail_on(&client, queue, error))?;
            total += count;
            counts.push(json!({ "partition": partition.0, "count": count }));
        }
        Ok(json!({
            "queue": queue,
            "subscription": subscription_name(&body.subscription),
            "redriven": total,
            "partitions": counts,
        }))
    }

    pub(super) async fn purge(&self, queue: &str, body: Purge) -> Result<Value, ApiError> {
        let client = self.client().await?;
        let partitions = self.partitions_of(&client, queue, body.partition).await?;
        let admin = Admin::new(client.clone());
        let dry_run = !body.confirm;
        let mut total = 0u64;
        let mut counts = Vec::new();
        for partition in partitions {
            let count = admin
                .purge_in(queue, &body.subscription, partition, dry_run)
                .await
                .map_err(|error| self.fail_on(&client, queue, error))?;
            total += count;
            counts.push(json!({ "partition": partition.0, "count": count }));
        }
        Ok(json!({
            "queue": queue,
            "subscription": subscription_name(&body.subscription),
            "dry_run": dry_run,
            "count": total,
            "partitions": counts,
        }))
    }
}

/// The query of `GET /v1/queues/{q}/dead-letters`.
pub(super) struct DeadLetterQuery {
    partition: Option<u32>,
    from_offset: u64,
    max: u32,
    /// The subscription (empty: the default).
    subscription: String,
}

impl DeadLetterQuery {
    pub(super) fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let mut parsed = Self {
            partition: None,
            from_offset: 0,
            max: DEAD_LETTERS_DEFAULT_HTTP,
            subscription: String::new(),
        };
        for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = |name: &str| {
                value.parse::<u64>().map_err(|_| {
                    ApiError::invalid(format!("query parameter {name}: '{value}' is not a number"))
                })
            };
            match name {
                "partition" => {
                    let partition = u32::try_from(number(name)?)
                        .map_err(|_| ApiError::invalid("partition out of range"))?;
                    parsed.partition = Some(partition);
                }
                "from_offset" => parsed.from_offset = number(name)?,
                "subscription" => {
                    validate_subscription_name(value)
                        .map_err(|error| ApiError::invalid(format!("subscription: {error}")))?;
                    parsed.subscription = value.to_owned();
                }
                "max" => {
                    let max = number(name)?;
                    if !(1..=u64::from(DEAD_LETTERS_MAX_HTTP)).contains(&max) {
                        return Err(ApiError::invalid(format!(
                            "max {max} outside 1..={DEAD_LETTERS_MAX_HTTP}"
                        ))
                        .with_detail("limit", DEAD_LETTERS_MAX_HTTP));
                    }
                    parsed.max = u32::try_from(max).unwrap_or(DEAD_LETTERS_MAX_HTTP);
                }
                other => {
                    return Err(ApiError::invalid(format!(
                        "unknown query parameter '{other}' (partition, from_offset, max, \
                         subscription)"
                    )))
                }
            }
        }
        if parsed.from_offset != 0 && parsed.partition.is_none() {
            return Err(ApiError::invalid("from_offset needs a partition"));
        }
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the dead-letter query reads its three parameters and refuses
    // anything else, and a max past the limit.
    #[test]
    fn dead_letter_query_is_bounded() {
        let query = DeadLetterQuery::parse(Some("partition=2&from_offset=5&max=7")).unwrap();
        assert_eq!((query.partition, query.from_offset, query.max), (Some(2), 5, 7));
        assert!(DeadLetterQuery::parse(Some("max=1001")).is_err());
        assert!(DeadLetterQuery::parse(Some("max=0")).is_err());
        assert!(DeadLetterQuery::parse(Some("from_offset=3")).is_err());
        assert!(DeadLetterQuery::parse(Some("limit=3")).is_err());
        let named = DeadLetterQuery::parse(Some("subscription=audit&max=3")).unwrap();
        assert_eq!((named.subscription.as_str(), named.max), ("audit", 3));
        assert!(DeadLetterQuery::parse(Some("subscription=a%20b")).is_err());
        assert_eq!(DeadLetterQuery::parse(None).unwrap().max, DEAD_LETTERS_DEFAULT_HTTP);
    }
}
