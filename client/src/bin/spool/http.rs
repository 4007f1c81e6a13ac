//! A small HTTP/1.1 client for the broker's admin port (`spool auth
//! reload`, `spool acl`, `spool metrics`): one request per connection
//! (`Connection: close`), the answer read to its end within the timeout and
//! at most `ADMIN_RESPONSE_BYTES_MAX` bytes; `Content-Length`, chunked and
//! read-to-close bodies; HTTPS with the command's `--tls-*` options.

use std::time::Duration;

use serde_json::Value;
use spool_client::limits::ADMIN_RESPONSE_BYTES_MAX;
use spool_client::Credentials;
use spool_client::TlsConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// An admin-port answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The broker's refusal as text: the API's error JSON (`code name:
    /// message`), else the body.
    pub fn refusal(&self) -> String {
        if let Some(error) = self.json().and_then(|body| body.get("error").cloned()) {
            let name = error["name"].as_str().unwrap_or("?");
            let message = error["message"].as_str().unwrap_or("");
            return format!("{name}: {message}");
        }
        format!("HTTP {}: {}", self.status, String::from_utf8_lossy(&self.body).trim())
    }
}

/// Sends one request to `addr` and reads the answer; over TLS when `tls`
/// is given (the admin port of a broker with `tls_cert_file` speaks HTTPS
/// only).
///
/// # Errors
/// Connection, TLS, timeout, size or HTTP framing trouble, as text.
pub async fn call(
    addr: &str,
    tls: Option<&TlsConfig>,
    method: &str,
    path: &str,
    bearer: Option<&Credentials>,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Answer, String> {
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n");
    if let Some(credentials) = bearer {
        request.push_str(&format!(
            "Authorization: Bearer {}:{}\r\n",
            credentials.principal, credentials.secret
        ));
    }
    let body = body.unwrap_or_default();
    if !body.is_empty() || method != "GET" {
        request.push_str("Content-Type: application/json\r\n");
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|error| format!("cannot reach the admin port {addr}: {error}"))?;
        let answer = match tls {
            None => exchange_on(stream, &bytes).await,
            Some(tls) => {
                let name = tls.server_name_for(addr).map_err(|error| error.to_string())?;
                let stream =
                    tls.connector().connect(name, stream).await.map_err(|error| {
                        format!("admin port {addr}: TLS handshake failed: {error}")
                    })?;
                exchange_on(stream, &bytes).await
            }
        }
        .map_err(|error| format!("admin port {addr}: {error}"))?;
        if answer.len() > ADMIN_RESPONSE_BYTES_MAX {
            return Err(format!("admin port {addr}: answer over {ADMIN_RESPONSE_BYTES_MAX} bytes"));
        }
        parse(&answer).map_err(|error| format!("admin port {addr}: {error}"))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("admin port {addr}: no answer within {} ms", timeout.as_millis()))?
}

/// Writes `request` and reads the answer to the end (at most one byte past
/// `ADMIN_RESPONSE_BYTES_MAX`, so the caller can tell it was too long). A
/// TLS peer that closes without close_notify ends the answer like a plain
/// close: the HTTP framing says whether it is complete.
async fn exchange_on<S>(mut stream: S, request: &[u8]) -> Result<Vec<u8>, std::io::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(request).await?;
    stream.flush().await?;
    let mut answer = Vec::new();
    let limit = u64::try_from(ADMIN_RESPONSE_BYTES_MAX).unwrap_or(u64::MAX) + 1;
    match (&mut stream).take(limit).read_to_end(&mut answer).await {
        Ok(_) => Ok(answer),
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => Ok(answer),
        Err(error) => Err(error),
    }
}

/// Reads a whole HTTP/1.1 answer.
fn parse(bytes: &[u8]) -> Result<Answer, String> {
    let end = bytes
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .ok_or("the answer has no complete header")?;
    let head = std::str::from_utf8(&bytes[..end]).map_err(|_| "the header is not UTF-8")?;
    let rest = &bytes[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().map_err(|_| "bad Content-Length")?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(length) = length {
        rest.get(..length).ok_or("the body is shorter than its Content-Length")?.to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Answer { status, body })
}

/// Decodes a chunked body.
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end =
            rest.windows(2).position(|window| window == b"\r\n").ok_or("a chunk size is cut")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).map_err(|_| "bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| "bad chunk size")?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or("a chunk is cut")?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).ok_or("a chunk is cut")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_length_chunked_and_closed_bodies() {
        let sized = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello").unwrap();
        assert_eq!((sized.status, sized.body.as_slice()), (200, &b"hello"[..]));
        let chunked = parse(
            b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((chunked.status, chunked.body.as_slice()), (401, &b"abcde"[..]));
        let closed = parse(b"HTTP/1.1 200 OK\r\n\r\nrest").unwrap();
        assert_eq!(closed.body, b"rest");
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort").is_err());
        let refused = parse(
            b"HTTP/1.1 403 Forbidden\r\n\r\n{\"error\":{\"code\":25,\"name\":\"PERMISSION_DENIED\",\"message\":\"no\"}}",
        )
        .unwrap();
        assert_eq!(refused.refusal(), "PERMISSION_DENIED: no");
    }
}
