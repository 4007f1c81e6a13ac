//! Bearer tokens checked on the admin port itself, before the gateway
//! opens or reuses a connection for them.
//!
//! With authentication on, each API request's `principal:secret` is
//! verified here against the policy in force (`auth::reload::AuthState`,
//! read on the admin thread; argon2 on tokio's blocking pool, a verified
//! secret remembered as a keyed MAC for the policy generation it verified
//! under). A refused token counts against the HTTP peer's address in the
//! admin port's own failed-login table (`auth::limiter`): past the bound
//! that address's tokens are refused at once (401, "too many failed
//! attempts"), without argon2, until the window passes. So wrong tokens
//! never reach the shards, whose own limiters would otherwise count the
//! gateway's loopback address. The shards still check the rights of every
//! request the gateway makes as the caller.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use spool_client::Credentials;
use spool_wire::ErrorCode;

use super::error::ApiError;
use crate::auth::limiter::FailureLimiter;
use crate::auth::{verify_secret, Grants};
use crate::shard::CoordinatorHandle;

/// The HTTP peer's address, put in each request's extensions by the admin
/// port's accept loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp(pub IpAddr);

/// The admin port's check of bearer tokens.
pub struct CallerAuth {
    coordinator: CoordinatorHandle,
    failures: Mutex<FailureLimiter>,
    mac_key: [u8; 32],
    /// Principal → (policy generation, MAC of the secret that verified).
    verified: Mutex<HashMap<String, (u64, blake3::Hash)>>,
}

impl std::fmt::Debug for CallerAuth {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("CallerAuth").finish_non_exhaustive()
    }
}

fn refused(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Unauthenticated, message)
}

impl CallerAuth {
    pub fn new(coordinator: CoordinatorHandle) -> CallerAuth {
        CallerAuth {
            coordinator,
            failures: Mutex::new(FailureLimiter::default()),
            mac_key: rand::random(),
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// The caller's rights: `None` while authentication is off (every
    /// right), else the grants of the principal whose token verified.
    ///
    /// # Errors
    /// `UNAUTHENTICATED`: no token, a wrong one, or an address locked out.
    pub async fn verify(
        &self,
        credentials: Option<&Credentials>,
        peer: Option<IpAddr>,
    ) -> Result<Option<Arc<Grants>>, ApiError> {
        let current = self.coordinator.auth().current();
        if !current.policy.is_enabled() {
            return Ok(None);
        }
        let Some(credentials) = credentials else {
            return Err(refused(
                "authentication is on: send Authorization: Bearer <principal>:<secret>",
            ));
        };
        let now_ms = crate::clock::now_ms();
        if let Some(ip) = peer {
            let locked =
                self.failures.lock().unwrap_or_else(PoisonError::into_inner).check(ip, now_ms);
            if let Err(locked) = locked {
                self.coordinator.auth().count_http_lockout();
                return Err(refused(locked.message()));
            }
        }
        let mac = {
            let mut hasher = blake3::Hasher::new_keyed(&self.mac_key);
            hasher.update(credentials.principal.as_bytes());
            hasher.update(&[0]);
            hasher.update(credentials.secret.as_bytes());
            hasher.finalize()
        };
        let found = current.policy.principal(&credentials.principal);
        if let Some((_, grants)) = &found {
            let verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            // blake3::Hash compares in constant time.
            if verified.get(&credentials.principal) == Some(&(current.generation, mac)) {
                return Ok(Some(grants.clone()));
            }
        }
        // An unknown principal costs an argon2 run too (against another
        // principal's hash), so timing does not tell which names exist.
        let (hash, grants) = match &found {
            Some((hash, grants)) => ((*hash).to_owned(), Some(grants.clone())),
            None => (current.policy.decoy_hash().unwrap_or_default().to_owned(), None),
        };
        let secret = credentials.secret.clone();
        let matches = tokio::task::spawn_blocking(move || verify_secret(&hash, &secret))
            .await
            .unwrap_or(false);
        match grants.filter(|_| matches) {
            Some(grants) => {
                // Keyed by principals the policy names: bounded by it.
                let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
                verified.insert(credentials.principal.clone(), (current.generation, mac));
                Ok(Some(grants))
            }
            None => {
                if let Some(ip) = peer {
                    self.failures
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record_failure(ip, now_ms);
                }
                tracing::warn!(
                    principal = %credentials.principal,
                    peer = ?peer,
                    "admin port: bearer token refused (principal unknown or secret wrong)"
                );
                Err(refused("principal unknown or secret wrong"))
            }
        }
    }
}
