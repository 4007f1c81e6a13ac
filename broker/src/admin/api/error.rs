//! The API's one error type: a stable wire [`ErrorCode`] (the binary
//! protocol's own table, `wire/src/codes.rs`), an HTTP status, a message,
//! and optional details. Every refusal the API sends is one of these,
//! rendered as `{"error": {"code": 6, "name": "QUEUE_NOT_FOUND",
//! "message": "...", ...details}}`.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::{Map, Value};
use spool_client::ClientError;
use spool_wire::{ErrorCode, WireError};
use thiserror::Error;

/// One refusal, as the API answers it.
#[derive(Debug, Clone, Error)]
#[error("{}: {message}", code.name())]
pub struct ApiError {
    /// The stable code.
    pub code: ErrorCode,
    /// The HTTP status ([`status_for`] the code unless a route says otherwise).
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// Extra fields of the `error` object (a limit, refused tokens, ...).
    pub details: Map<String, Value>,
}

/// The HTTP status of each code: 4xx for what the request can fix, 5xx for
/// the broker's state. Retriable codes are 429 or 5xx and carry
/// `Retry-After`.
pub fn status_for(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::None => StatusCode::OK,
        ErrorCode::MalformedFrame
        | ErrorCode::UnsupportedVersion
        | ErrorCode::InvalidArgument
        | ErrorCode::InvalidToken
        | ErrorCode::LeaseOutOfRange
        | ErrorCode::BatchInvalid => StatusCode::BAD_REQUEST,
        ErrorCode::UnknownApi
        | ErrorCode::QueueNotFound
        | ErrorCode::PartitionNotFound
        | ErrorCode::SubscriptionNotFound => StatusCode::NOT_FOUND,
        ErrorCode::FrameTooLarge | ErrorCode::RecordTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::QueueExists | ErrorCode::StaleToken | ErrorCode::LeaseLifetimeExceeded => {
            StatusCode::CONFLICT
        }
        ErrorCode::QueueFull | ErrorCode::Throttled | ErrorCode::QuotaExceeded => {
            StatusCode::TOO_MANY_REQUESTS
        }
        ErrorCode::DiskFull => StatusCode::INSUFFICIENT_STORAGE,
        ErrorCode::NotOwner
        | ErrorCode::NotLeader
        | ErrorCode::TooManyConnections
        | ErrorCode::ShuttingDown
        | ErrorCode::StorageFailed => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Timeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    /// An error with the code's own status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, status: status_for(code), message: message.into(), details: Map::new() }
    }

    /// `INVALID_ARGUMENT` (400).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// The same error with another HTTP status.
    #[must_use]
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// The same error with one more field in its `error` object.
    #[must_use]
    pub fn with_detail(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.details.insert(name.to_owned(), value.into());
        self
    }

    /// The body `{"error": {...}}`.
    pub fn body(&self) -> Value {
        let mut error = Map::new();
        error.insert("code".to_owned(), self.code.as_u16().into());
        error.insert("name".to_owned(), self.code.name().into());
        error.insert("message".to_owned(), self.message.clone().into());
        for (name, value) in &self.details {
            error.insert(name.clone(), value.clone());
        }
        serde_json::json!({ "error": error })
    }

    /// The HTTP answer; a retriable code says when to retry.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = super::json_response(self.status, &self.body());
        if self.code.is_retriable() {
            // The broker's hint (QUOTA_EXCEEDED's `retry_after_ms`) in whole
            // seconds, rounded up; 1 s otherwise.
            let seconds = self
                .details
                .get("retry_after_ms")
                .and_then(Value::as_u64)
                .map_or(1, |ms| ms.div_ceil(1000).max(1));
            let value = HeaderValue::from_str(&seconds.to_string())
                .unwrap_or_else(|_| HeaderValue::from_static("1"));
            response.headers_mut().insert(RETRY_AFTER, value);
        }
        response
    }

    /// Maps a client error from the gateway's call to the shards. Transport
    /// failures (the shard port unreachable, a broken connection, an answer
    /// the codec refuses) have no code of their own: they are `INTERNAL`
    /// with 502, or `SHUTTING_DOWN` when the broker is stopping.
    pub fn from_client(error: ClientError, stopping: bool) -> Self {
        let message = error.to_string();
        match &error {
            ClientError::Server { code, message } => Self::new(*code, message.clone()),
            ClientError::QuotaExceeded { message, retry_after } => {
                let error = Self::new(ErrorCode::QuotaExceeded, message.clone());
                match retry_after {
                    Some(wait) => error.with_detail(
                        "retry_after_ms",
                        u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    ),
                    None => error,
                }
            }
            ClientError::UnknownQueue(queue) => {
                Self::new(ErrorCode::QueueNotFound, format!("queue '{queue}' does not exist"))
            }
            ClientError::Record(wire) => Self::new(record_code(wire), message),
            ClientError::Config(_) => Self::invalid(message),
            ClientError::Io { .. }
            | ClientError::ConnectionClosed { .. }
            | ClientError::Protocol(_)
            | ClientError::Shutdown
                if stopping =>
            {
                Self::new(ErrorCode::ShuttingDown, message)
            }
            ClientError::Io { .. }
            | ClientError::ConnectionClosed { .. }
            | ClientError::Protocol(_)
            | ClientError::Shutdown => {
                Self::new(ErrorCode::Internal, message).with_status(StatusCode::BAD_GATEWAY)
            }
            _ => match error.code() {
                Some(code) => Self::new(code, message),
                None => Self::new(ErrorCode::Internal, message),
            },
        }
    }
}

impl From<crate::admin::memory::MemoryRefused> for ApiError {
    /// No room in the admin port's memory pool within the wait: 503
    /// `THROTTLED` (retriable, with `Retry-After`) and the pool's figures.
    fn from(refused: crate::admin::memory::MemoryRefused) -> Self {
        Self::new(ErrorCode::Throttled, refused.to_string())
            .with_status(StatusCode::SERVICE_UNAVAILABLE)
            .with_detail("pool_bytes", refused.size_bytes)
            .with_detail("used_bytes", refused.used_bytes)
            .with_detail("asked_bytes", refused.asked_bytes)
            .with_detail("waited_ms", refused.waited_ms)
    }
}

/// The code of a record the client refused to build: the size limits are
/// `RECORD_TOO_LARGE` (as the broker answers them), the rest
/// `INVALID_ARGUMENT`.
fn record_code(error: &WireError) -> ErrorCode {
    match error {
        WireError::RecordTooLarge { .. } | WireError::InlinePayloadTooLarge { .. } => {
            ErrorCode::RecordTooLarge
        }
        _ => ErrorCode::InvalidArgument,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: every code has a status, client errors (4xx) and broker state
    // (429/5xx) apart, and each retriable code is 429 or 5xx so a client
    // that retries on those retries exactly what the protocol says it may.
    // Method: walk the whole code table.
    #[test]
    fn every_code_has_a_status_that_matches_its_retry_flag() {
        for row in spool_wire::codes::ERROR_CODES.iter().skip(1) {
            let status = status_for(row.code);
            assert!(status.is_client_error() || status.is_server_error(), "{}", row.name);
            if row.retriable {
                assert!(
                    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error(),
                    "{} is retriable but {status}",
                    row.name
                );
            }
        }
        assert_eq!(status_for(ErrorCode::QueueNotFound), StatusCode::NOT_FOUND);
        assert_eq!(status_for(ErrorCode::SubscriptionNotFound), StatusCode::NOT_FOUND);
        assert_eq!(status_for(ErrorCode::StaleToken), StatusCode::CONFLICT);
        assert_eq!(status_for(ErrorCode::FrameTooLarge), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(status_for(ErrorCode::Unauthenticated), StatusCode::UNAUTHORIZED);
        assert_eq!(status_for(ErrorCode::PermissionDenied), StatusCode::FORBIDDEN);
    }

    // Goal: the body carries the stable number and name and the details.
    #[test]
    fn body_has_code_name_message_and_details() {
        let error = ApiError::new(ErrorCode::QueueFull, "full").with_detail("limit", 3);
        let body = error.body();
        assert_eq!(body["error"]["code"], 10);
        assert_eq!(body["error"]["name"], "QUEUE_FULL");
        assert_eq!(body["error"]["message"], "full");
        assert_eq!(body["error"]["limit"], 3);
        assert!(error.into_response().headers().contains_key(RETRY_AFTER));
    }
}
