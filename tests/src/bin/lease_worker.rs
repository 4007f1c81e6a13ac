//! `lease_worker`: a worker process for the SIGSTOP lease test
//! (`tests/tests/lease_pause.rs`). It claims one message with a short
//! lease, prints the delivery as one JSON line, "handles" it for `hold_ms`,
//! then extends and acks it and prints what the broker answered as a second
//! JSON line. A test pauses it with SIGSTOP during the hold, so the extend
//! and ack arrive after the lease ran out and another consumer took over.
//!
//! Usage: `lease_worker ADDR QUEUE PARTITION LEASE_MS HOLD_MS`. Exit 0 when
//! both lines were printed, 1 when the claim failed or found nothing, 2 on
//! bad arguments.

use std::io::Write;
use std::time::Duration;

use spool_client::spool_wire::proto::{PartitionId, WorkerId};
use spool_client::spool_wire::ErrorCode;
use spool_client::{ClaimOptions, Client};

/// The worker id this process claims as (the test tells its deliveries
/// from the other consumer's by it too).
const WORKER: u64 = 0x5709;

fn code_name(result: Result<ErrorCode, spool_client::ClientError>) -> String {
    match result {
        Ok(code) => code.name().to_owned(),
        Err(error) => {
            error.code().map_or_else(|| format!("error: {error}"), |code| code.name().to_owned())
        }
    }
}

async fn run(args: &[String]) -> Result<(), String> {
    let [addr, queue, partition, lease_ms, hold_ms] = args else {
        return Err("usage: lease_worker ADDR QUEUE PARTITION LEASE_MS HOLD_MS".to_owned());
    };
    let number = |text: &str| text.parse::<u64>().map_err(|error| format!("{text}: {error}"));
    let partition = PartitionId(u32::try_from(number(partition)?).map_err(|e| e.to_string())?);
    let lease_ms = u32::try_from(number(lease_ms)?).map_err(|e| e.to_string())?;
    let hold = Duration::from_millis(number(hold_ms)?);
    let client = Client::connect(addr).await.map_err(|error| error.to_string())?;
    let options = ClaimOptions {
        worker: WorkerId(WORKER),
        credits: 1,
        max_bytes: 1 << 20,
        lease_ms,
        wait_ms: 5_000,
        subscription: None,
    };
    let batch = client.claim(queue, partition, &options).await.map_err(|e| e.to_string())?;
    let Some(delivery) = batch.deliveries.first() else {
        return Err("nothing to claim".to_owned());
    };
    let claimed = serde_json::json!({
        "event": "claimed",
        "offset": delivery.offset().0,
        "generation": delivery.generation().0,
        "lease_deadline_ms": delivery.lease_deadline_ms(),
    });
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{claimed}").map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    // The handler's work. A SIGSTOP lands here; the sleep's deadline has
    // passed by the SIGCONT, so the late calls follow at once.
    std::thread::sleep(hold);
    let extend =
        client.extend(queue, partition, delivery.token(), lease_ms).await.map(|_| ErrorCode::None);
    // A refused ack is an error whose code is the token's.
    let ack = client.ack(queue, partition, &[delivery.token()]).await.map(|()| ErrorCode::None);
    let answered = serde_json::json!({
        "event": "late_calls",
        "extend": code_name(extend),
        "ack": code_name(ack),
    });
    writeln!(stdout, "{answered}").map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 5 {
        eprintln!("usage: lease_worker ADDR QUEUE PARTITION LEASE_MS HOLD_MS");
        std::process::exit(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lease_worker: runtime: {error}");
            std::process::exit(1);
        }
    };
    if let Err(error) = runtime.block_on(run(&args)) {
        eprintln!("lease_worker: {error}");
        std::process::exit(1);
    }
}
