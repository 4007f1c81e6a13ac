//! Credentials for a broker with authentication on.
//!
//! A [`Credentials`] value in [`ConnectionConfig::credentials`]
//! (or [`ClientConfig::with_credentials`](crate::ClientConfig::with_credentials))
//! makes every connection send the Authenticate handshake first: a
//! connection is handed out only once the broker accepted it, and a refusal
//! is [`ClientError::Server`] with `UNAUTHENTICATED`. A broker with
//! authentication off accepts any credentials.
//!
//! [`hash_secret`] makes the argon2id PHC string an operator puts in the
//! broker's auth file (`spool auth hash-secret`).
//!
//! [`ConnectionConfig::credentials`]: crate::ConnectionConfig::credentials

pub use crate::limits::SALT_BYTES;
use argon2::password_hash::{PasswordHasher, SaltString};
use argon2::Argon2;

use crate::error::ClientError;

/// A principal and its secret. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The principal's name (`[A-Za-z0-9._@-]`, at most 128 bytes).
    pub principal: String,
    /// The principal's secret.
    pub secret: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Credentials")
            .field("principal", &self.principal)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// `principal` with `secret`.
    pub fn new(principal: impl Into<String>, secret: impl Into<String>) -> Credentials {
        Credentials { principal: principal.into(), secret: secret.into() }
    }

    /// Reads the token form `principal:secret` (the HTTP API's bearer
    /// token); the secret is everything after the first `:`.
    pub fn from_token(token: &str) -> Option<Credentials> {
        let (principal, secret) = token.split_once(':')?;
        (!principal.is_empty() && !secret.is_empty()).then(|| Credentials::new(principal, secret))
    }
}

/// An argon2id PHC string for `secret` with a fresh random salt and the
/// argon2 crate's default parameters: what the broker's auth file holds.
///
/// # Errors
/// [`ClientError::Config`] if argon2 refuses the input.
pub fn hash_secret(secret: &str) -> Result<String, ClientError> {
    let salt_bytes: [u8; SALT_BYTES] = rand::random();
    let salt = SaltString::encode_b64(&salt_bytes)
        .map_err(|error| ClientError::Config(format!("salt: {error}")))?;
    Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|error| ClientError::Config(format!("argon2: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_split_at_the_first_colon_and_debug_hides_the_secret() {
        let credentials = Credentials::from_token("ops:pa:ss").unwrap();
        assert_eq!(credentials, Credentials::new("ops", "pa:ss"));
        assert!(Credentials::from_token("ops").is_none());
        assert!(Credentials::from_token(":x").is_none());
        assert!(Credentials::from_token("ops:").is_none());
        let shown = format!("{credentials:?}");
        assert!(shown.contains("ops") && !shown.contains("pa:ss"), "{shown}");
        let hash = hash_secret("pa:ss").unwrap();
        assert!(hash.starts_with("$argon2id$") && !hash.contains("pa:ss"), "{hash}");
    }
}
