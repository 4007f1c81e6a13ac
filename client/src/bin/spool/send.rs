//! `spool send`: enqueues DATA, a file, or each stdin line through a
//! [`Producer`], and prints one row (or JSON object) per message as the
//! broker acknowledges it, in input order.
//!
//! It must print only what the broker acknowledged, and read no further
//! input after a failure; stdin is read on a thread of its own, each line
//! bounded by [`LINE_BYTES_MAX`].

use std::collections::VecDeque;
use std::io::{BufRead, Read};

use spool_client::limits::{LINE_BYTES_MAX, SEND_IN_FLIGHT_MAX, STDIN_READ_AHEAD_LINES};
use spool_client::{Client, Message, Producer, ProducerConfig, SendFuture};
use tokio::sync::mpsc;

use crate::args::SendArgs;
use crate::render::{Printer, StreamTable};
use crate::Failure;

/// Where `send`'s messages come from.
enum SendInput {
    /// One message: DATA or --file.
    One(Vec<u8>),
    /// One message per stdin line, read by a thread as they arrive.
    Lines(mpsc::Receiver<Result<Vec<u8>, String>>),
}

/// A message submitted but not yet acknowledged, in input order.
struct Pending {
    /// 1-based position in the input.
    line: u64,
    future: SendFuture,
}

/// Enqueues DATA, a file, or each stdin line, and prints one row (or JSON
/// object) per message as the broker acknowledges it, in input order, each
/// flushed at once: interrupted at any point, the output lists exactly the
/// messages the broker acknowledged so far. After a failed message it reads
/// no further input but still prints every earlier message that gets
/// acknowledged, then fails.
pub async fn run(client: Client, send: &SendArgs, json: bool) -> Result<(), Failure> {
    let mut input = if let Some(data) = &send.data {
        SendInput::One(data.clone().into_bytes())
    } else if let Some(path) = &send.file {
        let bytes = std::fs::read(path)
            .map_err(|error| Failure::Input(format!("{}: {error}", path.display())))?;
        SendInput::One(bytes)
    } else {
        SendInput::Lines(read_lines(std::io::stdin()))
    };
    let with_line = matches!(input, SendInput::Lines(_));
    let producer = Producer::new(client, ProducerConfig::default())?;
    let mut out = Printer::new(json);
    let table = StreamTable::fitting(vec!["partition", "offset"], &[]);
    out.header(&table);
    let submit = |body: Vec<u8>| {
        let mut message = Message::new(body).priority(send.priority).delay_ms(send.delay_ms);
        if let Some(key) = &send.key {
            message = message.key(key.as_bytes().to_vec());
        }
        producer.submit(&send.queue, message)
    };
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut lines_read = 0u64;
    let mut first_failure: Option<Failure> = None;
    let mut failed = 0u64;
    let mut reading = true;
    loop {
        // Input is read while fewer than SEND_IN_FLIGHT_MAX messages wait for
        // their acknowledgement and nothing has failed yet.
        let room = reading && first_failure.is_none() && pending.len() < SEND_IN_FLIGHT_MAX;
        tokio::select! {
            biased;
            result = async {
                match pending.front_mut() {
                    Some(front) => (&mut front.future).await,
                    None => std::future::pending().await,
                }
            }, if !pending.is_empty() => {
                let Some(done) = pending.pop_front() else { continue };
                match result {
                    Ok(offset) => out.sent(&table, &send.queue, done.future.partition(), offset, with_line.then_some(done.line)),
                    Err(error) => {
                        failed += 1;
                        first_failure.get_or_insert(Failure::Client(error));
                    }
                }
                // Print everything else already acknowledged, then flush once.
                while let Some(front) = pending.front_mut() {
                    let Some(result) = futures_lite::future::poll_once(&mut front.future).await else { break };
                    let Some(done) = pending.pop_front() else { break };
                    match result {
                        Ok(offset) => out.sent(&table, &send.queue, done.future.partition(), offset, with_line.then_some(done.line)),
                        Err(error) => {
                            failed += 1;
                            first_failure.get_or_insert(Failure::Client(error));
                        }
                    }
                }
                out.flush()?;
            }
            body = next_body(&mut input), if room => {
                match body {
                    None => reading = false,
                    Some(Err(message)) => {
                        reading = false;
                        first_failure.get_or_insert(Failure::Input(message));
                    }
                    Some(Ok(body)) => {
                        lines_read += 1;
                        match submit(body).await {
                            Ok(future) => pending.push_back(Pending { line: lines_read, future }),
                            Err(error) => {
                                failed += 1;
                                first_failure.get_or_insert(Failure::Client(error));
                            }
                        }
                    }
                }
            }
            else => break,
        }
    }
    out.flush()?;
    match first_failure {
        None => Ok(()),
        Some(failure) => {
            if failed > 1 {
                eprintln!("{failed} messages were not acknowledged");
            }
            Err(failure)
        }
    }
}

/// The next message body of `input`, `None` at its end.
async fn next_body(input: &mut SendInput) -> Option<Result<Vec<u8>, String>> {
    match input {
        SendInput::One(body) => {
            let body = std::mem::take(body);
            *input = SendInput::Lines(closed_channel());
            Some(Ok(body))
        }
        SendInput::Lines(lines) => lines.recv().await,
    }
}

/// A receiver that is already at its end.
fn closed_channel() -> mpsc::Receiver<Result<Vec<u8>, String>> {
    let (_, receiver) = mpsc::channel(1);
    receiver
}

/// Reads `source` line by line on a thread of its own (stdin blocks), each
/// line without its `\n` (or `\r\n`), at most [`LINE_BYTES_MAX`] bytes.
fn read_lines(
    source: impl std::io::Read + Send + 'static,
) -> mpsc::Receiver<Result<Vec<u8>, String>> {
    let (sender, receiver) = mpsc::channel(STDIN_READ_AHEAD_LINES);
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(source);
        loop {
            let mut line = Vec::new();
            let limit = (LINE_BYTES_MAX + 2) as u64;
            let read = match (&mut reader).take(limit).read_until(b'\n', &mut line) {
                Ok(read) => read,
                Err(error) => {
                    let _ = sender.blocking_send(Err(format!("stdin: {error}")));
                    return;
                }
            };
            if read == 0 {
                return;
            }
            if line.last() == Some(&b'\n') {
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
            } else if line.len() > LINE_BYTES_MAX {
                let message = format!("stdin: a line is longer than {LINE_BYTES_MAX} bytes");
                let _ = sender.blocking_send(Err(message));
                return;
            }
            if sender.blocking_send(Ok(line)).is_err() {
                return;
            }
        }
    });
    receiver
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: stdin lines become message bodies as they arrive: without their
    // line ending (LF or CRLF), bytes kept as they are, a last line without
    // a newline kept, an over-long line refused. Method: feed read_lines a
    // buffer and collect what it sends.
    #[test]
    fn stdin_lines_are_read_as_bodies() {
        let input = b"one\ntwo\r\n\xff\x00binary\n\nlast".to_vec();
        let mut lines = read_lines(std::io::Cursor::new(input));
        let mut got = Vec::new();
        while let Some(line) = lines.blocking_recv() {
            got.push(line.unwrap());
        }
        let expected: Vec<Vec<u8>> = vec![
            b"one".to_vec(),
            b"two".to_vec(),
            b"\xff\x00binary".to_vec(),
            Vec::new(),
            b"last".to_vec(),
        ];
        assert_eq!(got, expected);
        let mut long = read_lines(std::io::Cursor::new(vec![b'x'; LINE_BYTES_MAX + 10]));
        let refused = long.blocking_recv().unwrap().unwrap_err();
        assert!(refused.contains("longer than"), "{refused}");
        assert!(long.blocking_recv().is_none());
    }
}
