//! `spool quota list`: each principal's quotas and what it uses now, from
//! the broker's admin port (`GET /v1/quotas`, which needs `admin` on `*`
//! when authentication is on). A plain HTTP/1.1 GET over one TCP
//! connection: the admin port answers with a length-delimited JSON body.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::Value;
use spool_client::limits::ADMIN_ANSWER_BYTES_MAX;
use spool_client::spool_wire::ErrorCode;
use spool_client::{ClientError, Credentials};

use crate::args::QuotaListArgs;
use crate::render::{Output, Table};
use crate::Failure;

fn transport(addr: &str, source: std::io::Error) -> Failure {
    Failure::Client(ClientError::Io { addr: addr.to_owned(), source })
}

/// GETs `path` from the admin port at `addr`: (status, body).
fn get(
    addr: &str,
    path: &str,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), Failure> {
    let target = addr
        .to_socket_addrs()
        .map_err(|error| transport(addr, error))?
        .next()
        .ok_or_else(|| Failure::Input(format!("admin address {addr} resolves to nothing")))?;
    let mut stream =
        TcpStream::connect_timeout(&target, timeout).map_err(|error| transport(addr, error))?;
    stream.set_read_timeout(Some(timeout)).map_err(|error| transport(addr, error))?;
    stream.set_write_timeout(Some(timeout)).map_err(|error| transport(addr, error))?;
    let authorization = credentials
        .map(|credentials| {
            format!("Authorization: Bearer {}:{}\r\n", credentials.principal, credentials.secret)
        })
        .unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|error| transport(addr, error))?;
    let mut answer = Vec::new();
    stream
        .take(ADMIN_ANSWER_BYTES_MAX)
        .read_to_end(&mut answer)
        .map_err(|error| transport(addr, error))?;
    let split = answer.windows(4).position(|window| window == b"\r\n\r\n").ok_or_else(|| {
        Failure::Client(ClientError::Protocol(format!("{addr}: not an HTTP answer")))
    })?;
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| Failure::Client(ClientError::Protocol(format!("{addr}: no status"))))?;
    Ok((status, answer[split + 4..].to_vec()))
}

/// `spool quota list`.
pub fn list(
    args: &QuotaListArgs,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<Output, Failure> {
    let (status, body) = get(&args.admin_addr, "/v1/quotas", credentials, timeout)?;
    let value: Value = serde_json::from_slice(&body).map_err(|error| {
        Failure::Client(ClientError::Protocol(format!(
            "{}: answer {status} is not JSON: {error}",
            args.admin_addr
        )))
    })?;
    if status != 200 {
        let error = &value["error"];
        let code = error["code"]
            .as_u64()
            .and_then(|code| u16::try_from(code).ok())
            .and_then(ErrorCode::from_u16)
            .unwrap_or(ErrorCode::Internal);
        let message = error["message"].as_str().unwrap_or("no message").to_owned();
        return Err(Failure::Client(ClientError::Server { code, message }));
    }
    let mut table = Table::new(vec!["principal", "quota", "limit", "in_use", "rejections"]);
    let text = |value: &Value| match value {
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    for principal in value["principals"].as_array().into_iter().flatten() {
        let name = principal["principal"].as_str().unwrap_or_default().to_owned();
        for quota in principal["quotas"].as_array().into_iter().flatten() {
            table.push(vec![
                name.clone(),
                quota["quota"].as_str().unwrap_or_default().to_owned(),
                text(&quota["limit"]),
                text(&quota["in_use"]),
                text(&quota["rejections"]),
            ]);
        }
    }
    Ok(Output::table(table, value))
}
