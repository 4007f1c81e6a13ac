//! The admin port from a test: plain HTTP/1.1 requests over a std socket, and
//! a checker for the metrics text that enforces the exposition's rules and
//! the naming conventions, then answers sample lookups.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// An HTTP answer: status code, `Content-Type`, body.
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
    /// Every header, names lowercased.
    pub headers: Vec<(String, String)>,
}

impl HttpAnswer {
    /// The body as JSON. Panics when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {self:?}"))
    }

    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(have, _)| have == name).map(|(_, value)| value.as_str())
    }
}

/// Sends `method path` to `addr` with `Connection: close` and reads the
/// whole answer. Panics on a transport failure (a failed step is a failed
/// test).
pub fn http(addr: &str, method: &str, path: &str) -> HttpAnswer {
    http_with_body(addr, method, path, b"")
}

/// `method path` with a JSON body.
pub fn http_json(addr: &str, method: &str, path: &str, body: &serde_json::Value) -> HttpAnswer {
    http_with_body(addr, method, path, body.to_string().as_bytes())
}

/// `method path` with `body` as its bytes (`Content-Type:
/// application/json`, `Connection: close`).
pub fn http_with_body(addr: &str, method: &str, path: &str, body: &[u8]) -> HttpAnswer {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    http_raw(addr, &request)
}

/// Sends `request` as written and reads the whole answer.
pub fn http_raw(addr: &str, request: &[u8]) -> HttpAnswer {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|error| panic!("{addr}: {error}"));
    stream.set_read_timeout(Some(Duration::from_secs(60))).expect("read timeout");
    stream.write_all(request).expect("send request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read answer");
    parse_answer(raw)
}

/// Reads a whole HTTP answer (head and body) as received.
pub fn parse_answer(raw: Vec<u8>) -> HttpAnswer {
    let text = String::from_utf8(raw).expect("the answer is UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {text:?}"));
    let mut lines = head.lines();
    let status_line = lines.next().expect("status line");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let header = |wanted: &str| {
        headers.iter().find(|(name, _)| name == wanted).map(|(_, value)| value.clone())
    };
    let content_type = header("content-type").unwrap_or_default();
    let body = if header("transfer-encoding").is_some_and(|value| value.contains("chunked")) {
        dechunk(body)
    } else {
        body.to_owned()
    };
    HttpAnswer { status, content_type, body, headers }
}

/// `GET path`.
pub fn http_get(addr: &str, path: &str) -> HttpAnswer {
    http(addr, "GET", path)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed, checked exposition.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    /// Family name → type (`counter`, `gauge`, `histogram`, ...).
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_' || first == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Conventions: lower snake case, the `spool_` prefix.
fn conventional(name: &str) -> bool {
    name.starts_with("spool_")
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"").ok_or(format!("label without =\": {text}"))?;
        if !valid_name(name) || name.starts_with("__") {
            return Err(format!("bad label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("dangling escape".into()),
                },
                Some((index, '"')) => break index,
                Some((_, c)) => value.push(c),
                None => return Err(format!("unterminated label value in {text}")),
            }
        };
        if labels.insert(name.to_owned(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = after[end + 1..].strip_prefix(',').unwrap_or(&after[end + 1..]);
    }
    Ok(labels)
}

impl Exposition {
    /// Parses `text` and checks it: `# TYPE` before its samples, valid and
    /// conventional names, every sample in a declared family with the
    /// suffix its type allows (`_total` for counters; `_bucket`/`_sum`/
    /// `_count` for histograms), values that parse, cumulative buckets
    /// ending in `+Inf` equal to `_count`, no sample twice, `# EOF` last.
    ///
    /// # Errors
    /// The first rule broken, with the line.
    pub fn parse(text: &str) -> Result<Exposition, String> {
        let mut exposition = Exposition::default();
        let mut lines: Vec<&str> = text.lines().collect();
        if lines.pop() != Some("# EOF") {
            return Err("the exposition does not end with # EOF".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for line in lines {
            if let Some(comment) = line.strip_prefix("# ") {
                let mut words = comment.splitn(3, ' ');
                let (kind, name, rest) = (words.next(), words.next(), words.next());
                let (Some(kind), Some(name)) = (kind, name) else {
                    return Err(format!("bad comment line {line:?}"));
                };
                if !valid_name(name) || !conventional(name) {
                    return Err(format!("unconventional family name {name:?}"));
                }
                match kind {
                    "TYPE" => {
                        let kind = rest.unwrap_or_default().to_owned();
                        if exposition.types.insert(name.to_owned(), kind).is_some() {
                            return Err(format!("family {name} declared twice"));
                        }
                    }
                    "HELP" if rest.is_some_and(|help| !help.is_empty()) => {}
                    "UNIT" => {}
                    _ => return Err(format!("bad comment line {line:?}")),
                }
                continue;
            }
            let (series, value) = line.rsplit_once(' ').ok_or(format!("no value: {line:?}"))?;
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                other => other.parse().map_err(|_| format!("bad value in {line:?}"))?,
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => {
                    let labels = labels.strip_suffix('}').ok_or(format!("bad labels {line:?}"))?;
                    (name, parse_labels(labels)?)
                }
                None => (series, BTreeMap::new()),
            };
            if !valid_name(name) || !conventional(name) {
                return Err(format!("unconventional sample name {name:?}"));
            }
            let family = exposition
                .types
                .iter()
                .filter(|(family, _)| name.starts_with(family.as_str()))
                .max_by_key(|(family, _)| family.len())
                .ok_or(format!("sample {name} before its # TYPE"))?;
            let suffix = &name[family.0.len()..];
            let allowed: &[&str] = match family.1.as_str() {
                "counter" => &["_total", "_created"],
                "gauge" | "unknown" | "info" => &[""],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                other => return Err(format!("unexpected type {other} of {}", family.0)),
            };
            if !allowed.contains(&suffix) {
                return Err(format!("{name} does not fit its {} family {}", family.1, family.0));
            }
            let whole = !family.0.ends_with("_seconds");
            if family.1 == "counter"
                && (value < 0.0 || whole && value.fract() != 0.0 && value.is_finite())
            {
                // Our counters count things (whole) or time in seconds, and
                // are never negative.
                return Err(format!("counter {name} has value {value}"));
            }
            if !seen.insert(series.to_owned()) {
                return Err(format!("sample {series} twice"));
            }
            exposition.samples.push(Sample { name: name.to_owned(), labels, value });
        }
        exposition.check_histograms()?;
        Ok(exposition)
    }

    fn check_histograms(&self) -> Result<(), String> {
        for (family, kind) in &self.types {
            if kind != "histogram" {
                continue;
            }
            let mut series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
            for sample in self.samples.iter().filter(|s| s.name == format!("{family}_bucket")) {
                let mut labels = sample.labels.clone();
                let bound = labels.remove("le").ok_or(format!("{family} bucket without le"))?;
                let bound = if bound == "+Inf" {
                    f64::INFINITY
                } else {
                    bound.parse().map_err(|_| format!("bad le {bound}"))?
                };
                series.entry(labels).or_default().push((bound, sample.value));
            }
            for (labels, buckets) in series {
                if buckets.windows(2).any(|pair| pair[0].0 >= pair[1].0 || pair[0].1 > pair[1].1) {
                    return Err(format!("{family}{labels:?}: buckets not cumulative: {buckets:?}"));
                }
                let last = buckets.last().ok_or("no buckets")?;
                let count = self
                    .samples
                    .iter()
                    .find(|s| s.name == format!("{family}_count") && s.labels == labels)
                    .ok_or(format!("{family}{labels:?} has no _count"))?;
                if last.0 != f64::INFINITY || last.1 != count.value {
                    return Err(format!(
                        "{family}{labels:?}: +Inf bucket {last:?} vs count {}",
                        count.value
                    ));
                }
            }
        }
        Ok(())
    }

    /// The value of the sample `name` with exactly these labels.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> =
            labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        self.samples.iter().find(|s| s.name == name && s.labels == wanted).map(|s| s.value)
    }

    /// The sum of every sample `name` (over all label sets).
    pub fn sum(&self, name: &str) -> f64 {
        self.samples.iter().filter(|s| s.name == name).map(|s| s.value).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the checker refuses what breaks the rules it claims to check,
    // so a passing e2e test means something. Method: one good exposition,
    // then one broken copy per rule.
    #[test]
    fn checker_accepts_good_text_and_refuses_broken_text() {
        let good = "# HELP spool_x_total X.\n# TYPE spool_x counter\nspool_x_total{queue=\"a\",partition=\"0\"} 3\n# TYPE spool_h histogram\nspool_h_sum{shard=\"0\"} 0.5\nspool_h_count{shard=\"0\"} 2\nspool_h_bucket{shard=\"0\",le=\"0.1\"} 1\nspool_h_bucket{shard=\"0\",le=\"+Inf\"} 2\n# EOF\n";
        let parsed = Exposition::parse(good).unwrap();
        assert_eq!(parsed.value("spool_x_total", &[("queue", "a"), ("partition", "0")]), Some(3.0));
        for broken in [
            good.replace("# EOF\n", ""),
            good.replace("spool_x_total{", "spool_x{"),
            good.replace("# TYPE spool_x counter\n", ""),
            good.replace("spool_x_total{queue", "Spool_x_total{queue"),
            good.replace("} 3", "} three"),
            good.replace("le=\"+Inf\"} 2", "le=\"+Inf\"} 1"),
            good.replace("queue=\"a\"", "queue=\"a"),
            good.replace("} 3", "} 2.5"),
        ] {
            assert!(Exposition::parse(&broken).is_err(), "accepted:\n{broken}");
        }
        // Time counted in seconds may be fractional.
        let seconds = good.replace("spool_x", "spool_x_seconds").replace("} 3", "} 2.5");
        assert!(Exposition::parse(&seconds).is_ok(), "refused:\n{seconds}");
    }
}
