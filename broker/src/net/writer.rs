//! The writing side of a connection: responses taken from the in-flight
//! requests' channel in bursts (every response already waiting, up to
//! `WRITE_BURST_RESPONSES_MAX` / `WRITE_BURST_BYTES_MAX`), small ones
//! coalesced into one buffer and one `write`, each burst within
//! `write_timeout`; a failed or late write stops the writer and the
//! connection. Reading and dispatch are `connection.rs`'s; this file must
//! not read from the peer.

use std::cell::RefCell;
use std::rc::Rc;

use futures_lite::future::or;
use futures_lite::{AsyncWrite, AsyncWriteExt};
use glommio::channels::local_channel::LocalReceiver;
use glommio::timer::Timer;

use super::poll_gate::PollGate;
use super::scope::{Connection, ConnectionLimits};
use super::stop::StopSignal;
use crate::limits::{WRITE_BURST_BYTES_MAX, WRITE_BURST_RESPONSES_MAX, WRITE_COPY_BYTES_MAX};

/// Writes the responses `receiver` yields until every sender is gone; on a
/// failed or timed-out write, records the error in `write_error`, trips
/// `writer_failed` and drains the rest unwritten (so in-flight requests
/// can finish).
pub(super) async fn write_loop<W, R>(
    mut writer: W,
    receiver: LocalReceiver<R>,
    writer_failed: StopSignal,
    write_error: Rc<RefCell<Option<std::io::Error>>>,
    writer_connection: Rc<Connection>,
    limits: ConnectionLimits,
) where
    W: AsyncWrite + Unpin,
    R: AsRef<[u8]>,
{
    let gate = PollGate::new(limits.io_poll_interval);
    let mut burst: Vec<R> = Vec::new();
    let mut coalesced: Vec<u8> = Vec::new();
    while let Some(response) = receiver.recv().await {
        if writer_failed.is_stopped() {
            // Drain so in-flight tasks can finish and drop senders.
            writer_connection.responses_written(response.as_ref().len());
            continue;
        }
        // Take every response that is already waiting (one wake-up,
        // one write for a burst of pipelined answers).
        let mut burst_bytes = response.as_ref().len();
        burst.push(response);
        while burst_bytes < WRITE_BURST_BYTES_MAX && burst.len() < WRITE_BURST_RESPONSES_MAX {
            match futures_lite::future::poll_once(receiver.recv()).await {
                Some(Some(next)) => {
                    burst_bytes += next.as_ref().len();
                    burst.push(next);
                }
                // Nothing waiting, or every sender gone.
                Some(None) | None => break,
            }
        }
        // A write that finds room completes inside this task: a
        // busy connection lets the executor poll now and then.
        gate.pass().await;
        // The flush sends what TLS still holds (a no-op on TCP).
        let write = async {
            write_burst(&mut writer, &mut burst, &mut coalesced).await?;
            writer.flush().await
        };
        let deadline = async {
            Timer::new(limits.write_timeout).await;
            Ok(false)
        };
        let outcome = or(async { write.await.map(|()| true) }, deadline).await;
        burst.clear();
        writer_connection.responses_written(burst_bytes);
        match outcome {
            Ok(true) => {}
            Ok(false) => {
                *write_error.borrow_mut() = Some(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "response not written within write_timeout",
                ));
                writer_failed.stop();
            }
            Err(error) => {
                *write_error.borrow_mut() = Some(error);
                writer_failed.stop();
            }
        }
    }
    if !writer_failed.is_stopped() {
        let _ = or(writer.close(), async {
            Timer::new(limits.write_timeout).await;
            Ok(())
        })
        .await;
    }
}

/// Writes a burst of responses in order: runs of small ones through one
/// copy buffer and one write, large ones straight from their own buffers.
pub(super) async fn write_burst<W, R>(
    writer: &mut W,
    burst: &mut [R],
    coalesced: &mut Vec<u8>,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
    R: AsRef<[u8]>,
{
    if let [only] = burst {
        return writer.write_all(only.as_ref()).await;
    }
    coalesced.clear();
    for response in burst.iter() {
        let bytes = response.as_ref();
        if bytes.len() <= WRITE_COPY_BYTES_MAX {
            coalesced.extend_from_slice(bytes);
            continue;
        }
        if !coalesced.is_empty() {
            writer.write_all(coalesced).await?;
            coalesced.clear();
        }
        writer.write_all(bytes).await?;
    }
    if !coalesced.is_empty() {
        writer.write_all(coalesced).await?;
    }
    // Keep the buffer from pinning a large allocation after a big burst.
    if coalesced.capacity() > WRITE_BURST_BYTES_MAX {
        *coalesced = Vec::new();
    }
    Ok(())
}
