//! Authenticate (api key 7): the connection handshake. When the broker has
//! authentication on, the first request on a connection must be this one;
//! any other request before it is answered `UNAUTHENTICATED` and the
//! connection is closed (`docs/design/protocol.md`, "Authentication").
//!
//! Layout (hand-written, like the data path):
//!
//! ```text
//! request:  | u16 principal_len | principal | u16 secret_len | secret |
//! response: | u8 enforced | u8 reserved | u16 reserved | u32 reserved |
//! ```
//!
//! `principal`: 1..=[`PRINCIPAL_BYTES_MAX`] bytes of `[A-Za-z0-9._@-]`;
//! `secret`: 1..=[`SECRET_BYTES_MAX`] bytes of UTF-8. The secret is never
//! printed: [`AuthenticateRequest`]'s `Debug` shows its length only.

use super::codec::{check_range, Reader, Writer};
use super::error::ProtoError;
pub use super::limits::{PRINCIPAL_BYTES_MAX, SECRET_BYTES_MAX};

/// Checks a principal name: 1..=[`PRINCIPAL_BYTES_MAX`] bytes of
/// `[A-Za-z0-9._@-]`.
///
/// # Errors
/// [`ProtoError::OutOfRange`] for the length, and for a byte outside the
/// charset (the error names the byte's value).
pub fn validate_principal(name: &str) -> Result<(), ProtoError> {
    check_range("principal length", name.len() as u64, 1, PRINCIPAL_BYTES_MAX as u64)?;
    let allowed =
        |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-' | b'@');
    if let Some(&bad) = name.as_bytes().iter().find(|&&byte| !allowed(byte)) {
        return Err(ProtoError::OutOfRange {
            field: "principal character (allowed: [A-Za-z0-9._@-])",
            value: u64::from(bad),
            min: 0,
            max: 0,
        });
    }
    Ok(())
}

/// The handshake: who the connection acts as, and its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthenticateRequest<'a> {
    /// The principal's name.
    pub principal: &'a str,
    /// The principal's secret, as configured (the broker keeps only its
    /// argon2 hash).
    pub secret: &'a str,
}

impl std::fmt::Debug for AuthenticateRequest<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AuthenticateRequest")
            .field("principal", &self.principal)
            .field("secret", &format_args!("<{} bytes>", self.secret.len()))
            .finish()
    }
}

impl<'a> AuthenticateRequest<'a> {
    /// Checks the principal's charset and both lengths.
    ///
    /// # Errors
    /// [`ProtoError::OutOfRange`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_principal(self.principal)?;
        check_range("secret length", self.secret.len() as u64, 1, SECRET_BYTES_MAX as u64)
    }

    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.str(self.principal);
        writer.str(self.secret);
    }

    pub(crate) fn read(body: &'a [u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let principal = reader.str("principal", PRINCIPAL_BYTES_MAX)?;
        let secret = reader.str("secret", SECRET_BYTES_MAX)?;
        reader.finish()?;
        let request = Self { principal, secret };
        request.validate()?;
        Ok(request)
    }
}

/// The broker accepted the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthenticateResponse {
    /// Whether the broker checks credentials at all (false: authentication
    /// is off and any principal was accepted as is).
    pub enforced: bool,
}

impl AuthenticateResponse {
    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.u8(u8::from(self.enforced));
        writer.u8(0);
        writer.u16(0);
        writer.u32(0);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let enforced = match reader.u8()? {
            0 => false,
            1 => true,
            other => {
                return Err(ProtoError::UnknownEnumValue { field: "enforced", value: other.into() })
            }
        };
        if reader.u8()? != 0 || reader.u16()? != 0 {
            return Err(ProtoError::NonzeroReserved { field: "authenticate response" });
        }
        reader.reserved_u32("authenticate response")?;
        reader.finish()?;
        Ok(Self { enforced })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes::ErrorCode;
    use crate::proto::{decode_frame, CorrelationId, Reply, Request, Response};

    fn frame_bytes(request: &Request<'_>) -> rkyv::util::AlignedVec {
        let mut out = Vec::new();
        request.encode(CorrelationId(9), &mut out).unwrap();
        let mut aligned = rkyv::util::AlignedVec::new();
        aligned.extend_from_slice(&out);
        aligned
    }

    // Goal: the handshake round-trips through the frame codec, both ways,
    // and its Debug never prints the secret. Method: encode, decode, compare.
    #[test]
    fn authenticate_round_trips_and_hides_the_secret() {
        let request = Request::Authenticate(AuthenticateRequest {
            principal: "worker@eu-1",
            secret: "hunter2-but-longer",
        });
        let bytes = frame_bytes(&request);
        let frame = decode_frame(&bytes).unwrap();
        assert_eq!(frame.header.api_key.as_u16(), 7);
        assert_eq!(Request::decode(&frame).unwrap(), request);
        let shown = format!("{request:?}");
        assert!(shown.contains("worker@eu-1") && !shown.contains("hunter2"), "{shown}");

        for enforced in [false, true] {
            let mut out = Vec::new();
            Response::Authenticate(AuthenticateResponse { enforced })
                .encode(CorrelationId(9), &mut out)
                .unwrap();
            let mut aligned = rkyv::util::AlignedVec::<16>::new();
            aligned.extend_from_slice(&out);
            let reply = Response::decode(&decode_frame(&aligned).unwrap()).unwrap();
            assert_eq!(
                reply.reply,
                Reply::Ok(Response::Authenticate(AuthenticateResponse { enforced }))
            );
        }
    }

    // Goal: names and secrets out of bounds are refused by the encoder and
    // the decoder alike; a truncated body is malformed.
    #[test]
    fn bad_handshakes_are_refused() {
        for (principal, secret) in [
            ("", "s"),
            ("a b", "s"),
            ("a", ""),
            ("ü", "s"),
            ("a", &*"x".repeat(SECRET_BYTES_MAX + 1)),
        ] {
            let request = Request::Authenticate(AuthenticateRequest { principal, secret });
            let error = request.encode(CorrelationId(1), &mut Vec::new()).unwrap_err();
            assert_eq!(error.code(), ErrorCode::InvalidArgument, "{principal:?}: {error}");
        }
        let long = "p".repeat(PRINCIPAL_BYTES_MAX + 1);
        assert!(validate_principal(&long).is_err());
        assert!(validate_principal(&long[..PRINCIPAL_BYTES_MAX]).is_ok());
        let body = [3u8, 0, b'a', b'b'];
        assert!(AuthenticateRequest::read(&body).is_err());
    }
}
