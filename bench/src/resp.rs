//! RESP2, the Redis protocol, as much as the peer scenario
//! ([`crate::redis_streams`]) speaks: commands out as arrays of bulk
//! strings, replies in as the five RESP2 types.
//!
//! Owns encoding and incremental decoding over a byte buffer; no sockets
//! (the scenario reads and writes), so the codec is tested without a
//! server. Every length a server sends is bounded ([`BULK_BYTES_MAX`],
//! [`ARRAY_ITEMS_MAX`], [`DEPTH_MAX`]) and a violation is an error, never an
//! allocation of what the peer asked for.

/// Largest bulk string accepted in a reply.
pub const BULK_BYTES_MAX: usize = 16 << 20;
/// Most elements of one reply array.
pub const ARRAY_ITEMS_MAX: usize = 1 << 20;
/// Deepest nesting of reply arrays (XREADGROUP nests four).
pub const DEPTH_MAX: usize = 8;

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Simple(String),
    Error(String),
    Integer(i64),
    /// `$-1`: the null bulk string.
    Nil,
    Bulk(Vec<u8>),
    /// `*-1` (the null array, as XREADGROUP answers a timeout) is `None`.
    Array(Option<Vec<Value>>),
}

/// A reply that is not RESP2 or passes a bound.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RespError {
    #[error("unknown reply type byte {0:#04x}")]
    Type(u8),
    #[error("bad length or integer line {0:?}")]
    Number(String),
    #[error("{what} of {len} passes the bound {max}")]
    TooLarge { what: &'static str, len: usize, max: usize },
    #[error("bulk string not followed by CRLF")]
    Terminator,
}

/// Appends the command `args` (an array of bulk strings) to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Decodes one whole reply from the front of `buf`: `Ok(None)` if more
/// bytes are needed, else the reply and the bytes it took.
///
/// # Errors
/// [`RespError`] for bytes that are not a RESP2 reply or pass a bound.
pub fn decode(buf: &[u8]) -> Result<Option<(Value, usize)>, RespError> {
    decode_at(buf, 0, 0)
}

fn decode_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, RespError> {
    let Some((line, next)) = line(buf, at) else { return Ok(None) };
    let Some((&kind, text)) = line.split_first() else { return Err(RespError::Type(b'\r')) };
    let text_string = || String::from_utf8_lossy(text).into_owned();
    match kind {
        b'+' => Ok(Some((Value::Simple(text_string()), next))),
        b'-' => Ok(Some((Value::Error(text_string()), next))),
        b':' => Ok(Some((Value::Integer(number(text)?), next))),
        b'$' => {
            let len = number(text)?;
            if len < 0 {
                return Ok(Some((Value::Nil, next)));
            }
            let len = bounded("bulk string", len, BULK_BYTES_MAX)?;
            let end = next + len;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(RespError::Terminator);
            }
            Ok(Some((Value::Bulk(buf[next..end].to_vec()), end + 2)))
        }
        b'*' => {
            let len = number(text)?;
            if len < 0 {
                return Ok(Some((Value::Array(None), next)));
            }
            let len = bounded("array", len, ARRAY_ITEMS_MAX)?;
            if depth >= DEPTH_MAX {
                return Err(RespError::TooLarge {
                    what: "nesting",
                    len: depth + 1,
                    max: DEPTH_MAX,
                });
            }
            let mut items = Vec::with_capacity(len.min(1_024));
            let mut at = next;
            for _ in 0..len {
                let Some((item, after)) = decode_at(buf, at, depth + 1)? else { return Ok(None) };
                items.push(item);
                at = after;
            }
            Ok(Some((Value::Array(Some(items)), at)))
        }
        other => Err(RespError::Type(other)),
    }
}

/// The line starting at `at` without its CRLF, and where the next starts.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let end = rest.windows(2).position(|pair| pair == b"\r\n")?;
    Some((&rest[..end], at + end + 2))
}

fn number(text: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| RespError::Number(String::from_utf8_lossy(text).into_owned()))
}

fn bounded(what: &'static str, len: i64, max: usize) -> Result<usize, RespError> {
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > max {
        return Err(RespError::TooLarge { what, len, max });
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a command is an array of bulk strings, byte for byte as Redis
    // documents it. Method: encode XACK with two ids.
    #[test]
    fn encodes_commands_as_bulk_string_arrays() {
        let mut out = Vec::new();
        encode(&mut out, &[b"XACK", b"s", b"g", b"1-0"]);
        assert_eq!(out, b"*4\r\n$4\r\nXACK\r\n$1\r\ns\r\n$1\r\ng\r\n$3\r\n1-0\r\n");
    }

    // Goal: every RESP2 type decodes, with the bytes it took; a reply cut
    // anywhere asks for more instead of failing or guessing. Method: an
    // XREADGROUP-shaped reply followed by an integer, decoded whole, then at
    // every shorter length.
    #[test]
    fn decodes_every_type_and_waits_for_a_cut_reply() {
        let reply =
            b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\np\r\n$2\r\nhi\r\n:7\r\n";
        let (value, used) = decode(reply).unwrap().unwrap();
        let entry = Value::Array(Some(vec![
            Value::Bulk(b"1-0".to_vec()),
            Value::Array(Some(vec![Value::Bulk(b"p".to_vec()), Value::Bulk(b"hi".to_vec())])),
        ]));
        let stream =
            Value::Array(Some(vec![Value::Bulk(b"s".to_vec()), Value::Array(Some(vec![entry]))]));
        assert_eq!(value, Value::Array(Some(vec![stream])));
        assert_eq!(decode(&reply[used..]).unwrap(), Some((Value::Integer(7), 4)));
        for cut in 0..used {
            assert_eq!(decode(&reply[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert_eq!(decode(b"+OK\r\n").unwrap(), Some((Value::Simple("OK".into()), 5)));
        assert_eq!(decode(b"-ERR x\r\n").unwrap(), Some((Value::Error("ERR x".into()), 8)));
        assert_eq!(decode(b"$-1\r\n").unwrap(), Some((Value::Nil, 5)));
        assert_eq!(decode(b"*-1\r\n").unwrap(), Some((Value::Array(None), 5)));
    }

    // Goal: a server cannot make the client allocate what it names, nor
    // pass off garbage as a reply. Method: lengths past each bound, a bad
    // type byte, a bad number, a bulk string without its CRLF.
    #[test]
    fn refuses_what_passes_a_bound_or_is_not_resp() {
        let huge = format!("${}\r\n", BULK_BYTES_MAX + 1);
        assert!(matches!(decode(huge.as_bytes()), Err(RespError::TooLarge { .. })));
        let wide = format!("*{}\r\n", ARRAY_ITEMS_MAX + 1);
        assert!(matches!(decode(wide.as_bytes()), Err(RespError::TooLarge { .. })));
        let deep = "*1\r\n".repeat(DEPTH_MAX + 1);
        assert!(matches!(decode(deep.as_bytes()), Err(RespError::TooLarge { .. })));
        assert_eq!(decode(b"!x\r\n"), Err(RespError::Type(b'!')));
        assert!(matches!(decode(b":x1\r\n"), Err(RespError::Number(_))));
        assert_eq!(decode(b"$2\r\nhiXY"), Err(RespError::Terminator));
    }
}
