//! Commands that run without a broker: `spool auth hash-secret` (a secret
//! on stdin in, its PHC string out, for the broker's auth file) and `spool
//! audit` (a data dir's audit log, oldest first, optionally one queue's).
//!
//! They must not connect anywhere nor write anything: the audit log is the
//! broker's and is only read here.

use serde_json::{json, Value};

use crate::args::AuditArgs;
use crate::render::{Output, Table};
use crate::Failure;

/// The broker's audit log inside its data directory (the broker's
/// `auth::audit::AUDIT_FILE_NAME`; the client does not depend on the broker).
const AUDIT_FILE_NAME: &str = "audit.log";
/// `spool auth hash-secret`: one stdin line in, its PHC string out.
pub fn hash_secret_from_stdin() -> Result<Output, Failure> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|error| Failure::Input(format!("cannot read the secret from stdin: {error}")))?;
    let secret = line.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(Failure::Input("empty secret on stdin".to_owned()));
    }
    let hash = spool_client::auth::hash_secret(secret)?;
    Ok(Output::message(hash.clone(), json!({ "secret_hash": hash })))
}

/// `spool audit`: the broker's audit log, oldest first.
pub fn audit(args: &AuditArgs) -> Result<Output, Failure> {
    let path = match (&args.file, &args.data_dir) {
        (Some(file), _) => file.clone(),
        (None, Some(dir)) => dir.join(AUDIT_FILE_NAME),
        (None, None) => return Err(Failure::Input("--data-dir or --file".to_owned())),
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|error| Failure::Input(format!("cannot read {}: {error}", path.display())))?;
    let mut entries: Vec<Value> = Vec::new();
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    for (index, line) in lines.iter().enumerate() {
        match serde_json::from_str::<Value>(line) {
            Ok(entry) => entries.push(entry),
            // A torn last line (the broker crashed mid-append) is skipped.
            Err(_) if index + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(error) => {
                return Err(Failure::Input(format!(
                    "{}: line {}: {error}",
                    path.display(),
                    index + 1
                )))
            }
        }
    }
    if let Some(queue) = &args.queue {
        entries.retain(|entry| entry["queue"].as_str() == Some(queue.as_str()));
    }
    let columns = [
        "time_ms",
        "principal",
        "operation",
        "queue",
        "subscription",
        "partition",
        "count",
        "outcome",
    ];
    let mut table = Table::new(columns.to_vec());
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    for entry in &entries {
        table.push(columns.iter().map(|field| text(&entry[*field])).collect());
    }
    Ok(Output::table(table, Value::Array(entries)))
}
