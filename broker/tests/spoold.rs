//! The real `spoold` binary: started on a temp dir with free ports, talked to
//! over TCP, stopped with signals. Every wait is bounded by a poll count so
//! a broken binary fails the test instead of hanging it.

// Test helpers panic on setup failures by design.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const SPOOLD: &str = env!("CARGO_BIN_EXE_spoold");
const POLL: Duration = Duration::from_millis(20);
/// 20 s at 20 ms per poll.
const POLLS_MAX: u32 = 1_000;

fn shard_count() -> u16 {
    std::thread::available_parallelism().map_or(1, |count| count.get().min(2) as u16)
}

/// A base port whose next `count` ports are all free right now.
fn free_base_port(count: u16) -> u16 {
    for _ in 0..100 {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = probe.local_addr().unwrap().port();
        drop(probe);
        if u32::from(base) + u32::from(count) > 65_535 {
            continue;
        }
        let all_free =
            (base..base + count).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no {count} consecutive free ports");
}

/// A spawned spoold that is killed and reaped when dropped, so a failing
/// assertion never leaves a broker running behind the test.
struct Spoold(Child);

impl Drop for Spoold {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl std::ops::Deref for Spoold {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Spoold {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

fn spawn_spoold(data_dir: &Path, base_port: u16, shards: u16, extra: &[&str]) -> Spoold {
    let child = Command::new(SPOOLD)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--listen")
        .arg(format!("127.0.0.1:{base_port}"))
        .arg("--cores")
        .arg(shards.to_string())
        .args(extra)
        .env_remove("SPOOL_CONFIG")
        // Tests run side by side: no two may take the default admin port.
        .env("SPOOL_ADMIN_LISTEN", "off")
        .env("SPOOL_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spoold");
    Spoold(child)
}

/// Connects to `addr`, retrying while spoold starts; panics if it exits.
fn connect_when_up(child: &mut Child, addr: SocketAddr) -> TcpStream {
    for _ in 0..POLLS_MAX {
        if let Ok(stream) = TcpStream::connect(addr) {
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            return stream;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("spoold exited early with {status}: {}", stderr_of(child));
        }
        std::thread::sleep(POLL);
    }
    panic!("spoold never listened on {addr}");
}

/// spoold's stderr, read on a thread as it is written, so that a test can
/// wait for a line (an event of the running process) and still have the
/// whole text once it exited.
struct StderrWatch {
    text: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    reader: std::thread::JoinHandle<()>,
}

impl StderrWatch {
    fn start(child: &mut Child) -> StderrWatch {
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let text = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let written = std::sync::Arc::clone(&text);
        let reader = std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(read @ 1..) = stderr.read(&mut chunk) {
                written.lock().unwrap().extend_from_slice(&chunk[..read]);
            }
        });
        StderrWatch { text, reader }
    }

    fn text(&self) -> String {
        lossy(&self.text)
    }

    /// Polls until stderr holds `needle`; panics if spoold exits first or
    /// the poll budget runs out.
    fn wait_for(&self, child: &mut Child, needle: &str) {
        for _ in 0..POLLS_MAX {
            if self.text().contains(needle) {
                return;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("spoold exited ({status}) before logging {needle:?}: {}", self.text());
            }
            std::thread::sleep(POLL);
        }
        panic!("spoold never logged {needle:?}: {}", self.text());
    }

    /// Everything spoold wrote to stderr (call once it exited).
    fn finish(self) -> String {
        self.reader.join().unwrap();
        lossy(&self.text)
    }
}

fn lossy(bytes: &std::sync::Mutex<Vec<u8>>) -> String {
    String::from_utf8_lossy(&bytes.lock().unwrap()).into_owned()
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut text);
    }
    text
}

/// Sends a ListQueues request and checks the broker answers it with a
/// well-formed ListQueues response carrying the same correlation id.
fn list_queues_round_trip(stream: &mut TcpStream, correlation: u64) {
    use spool_wire::proto::{
        decode_frame, CorrelationId, ListQueuesRequest, Reply, Request, Response,
    };
    let mut request = Vec::new();
    Request::ListQueues(ListQueuesRequest {})
        .encode(CorrelationId(correlation), &mut request)
        .unwrap();
    stream.write_all(&request).unwrap();
    let mut length = [0u8; 4];
    stream.read_exact(&mut length).unwrap();
    let total = u32::from_le_bytes(length) as usize;
    let mut frame = vec![0u8; total];
    frame[..4].copy_from_slice(&length);
    stream.read_exact(&mut frame[4..]).unwrap();
    let mut aligned = spool_wire::batch::BatchBytes::with_capacity(total);
    aligned.extend_from_slice(&frame);
    let decoded = decode_frame(&aligned).unwrap();
    let reply = Response::decode(&decoded).unwrap();
    assert_eq!(reply.correlation_id, CorrelationId(correlation));
    match reply.reply {
        Reply::Ok(Response::ListQueues(list)) => assert!(list.queues.is_empty()),
        other => panic!("expected a ListQueues answer, got {other:?}"),
    }
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    let rc = unsafe { libc::kill(child.id() as i32, signal) };
    assert_eq!(rc, 0);
}

/// Waits for exit (bounded), returning the status code and stderr.
fn wait_exit(mut child: Spoold) -> (Option<i32>, String) {
    for _ in 0..POLLS_MAX {
        if let Some(status) = child.try_wait().unwrap() {
            let stderr = stderr_of(&mut child);
            return (status.code(), stderr);
        }
        std::thread::sleep(POLL);
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("spoold did not exit within the poll budget");
}

fn run_to_exit(args: &[&str]) -> Output {
    Command::new(SPOOLD)
        .args(args)
        .env_remove("SPOOL_CONFIG")
        .env("SPOOL_ADMIN_LISTEN", "off")
        .output()
        .expect("run spoold")
}

// Goal: spoold binds base_port + i for every shard and serves each port;
// SIGTERM stops it with exit 0, quickly, with a connection still open.
// Method: start on a temp dir, a ListQueues round trip on every shard port, SIGTERM, time the
// exit by poll count.
#[test]
fn serves_every_shard_port_and_sigterm_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let shards = shard_count();
    let base = free_base_port(shards);
    let mut child = spawn_spoold(dir.path(), base, shards, &[]);
    let mut streams = Vec::new();
    for shard in 0..shards {
        let addr: SocketAddr = format!("127.0.0.1:{}", base + shard).parse().unwrap();
        let mut stream = connect_when_up(&mut child, addr);
        list_queues_round_trip(&mut stream, u64::from(shard) + 1);
        streams.push(stream);
    }
    assert!(dir.path().join("LOCK").exists());
    signal(&child, libc::SIGTERM);
    let mut polls = 0;
    while child.try_wait().unwrap().is_none() {
        polls += 1;
        assert!(polls < 250, "spoold took more than 5 s to stop");
        std::thread::sleep(POLL);
    }
    let (code, stderr) = wait_exit(child);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("spoold stopped cleanly"), "{stderr}");
    // The open connections were closed by the server, not left dangling.
    for mut stream in streams {
        let mut byte = [0u8; 1];
        assert_eq!(stream.read(&mut byte).unwrap_or(0), 0);
    }
}

// Goal: a second spoold on the same data dir fails loudly, naming the dir
// and the first one's pid, with a non-zero exit; the first keeps serving.
// Method: start one, start another with other ports on the same dir.
#[test]
fn second_spoold_on_same_data_dir_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port(1);
    let mut first = spawn_spoold(dir.path(), base, 1, &[]);
    let addr: SocketAddr = format!("127.0.0.1:{base}").parse().unwrap();
    let mut stream = connect_when_up(&mut first, addr);

    let other_base = free_base_port(1);
    let second = spawn_spoold(dir.path(), other_base, 1, &[]);
    let (code, stderr) = wait_exit(second);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains(&dir.path().display().to_string()), "{stderr}");
    assert!(stderr.contains(&format!("pid {}", first.id())), "{stderr}");

    list_queues_round_trip(&mut stream, 7);
    signal(&first, libc::SIGINT);
    let (code, stderr) = wait_exit(first);
    assert_eq!(code, Some(0), "{stderr}");
}

// Goal: a port already bound by someone else is refused before glommio's
// SO_REUSEPORT bind could share it. Method: hold the port with a std
// listener, start spoold on it.
#[test]
fn port_in_use_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let child = spawn_spoold(dir.path(), port, 1, &[]);
    let (code, stderr) = wait_exit(child);
    assert_eq!(code, Some(5), "{stderr}");
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
    assert!(stderr.contains("already in use"), "{stderr}");
}

// Goal: a restart right after a SIGKILL does not die because the killed
// process's listening socket outlives it for a few milliseconds: a port
// still in use at start is retried for a bounded time, logged, and bound
// once free. Method: hold the port with a std listener, start spoold, free
// the port once spoold logged that it found it in use and retries; spoold
// must then serve (not exit 5) and say it waited.
#[test]
fn a_port_still_in_use_at_start_is_retried_until_free() {
    let dir = tempfile::tempdir().unwrap();
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let mut child = spawn_spoold(dir.path(), port, 1, &[]);
    let stderr = StderrWatch::start(&mut child);
    stderr.wait_for(&mut child, "port still in use");
    drop(holder);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut stream = connect_when_up(&mut child, addr);
    list_queues_round_trip(&mut stream, 7);
    signal(&child, libc::SIGTERM);
    let (code, _) = wait_exit(child);
    let stderr = stderr.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("port still in use"), "{stderr}");
    assert!(stderr.contains("port came free"), "{stderr}");
}

// Goal: a taken admin port is a start error like a taken shard port (exit
// code 5, the address named), not a broker that runs without its metrics.
// Method: hold a port with a std listener, start spoold with that port as
// its admin port (the flag overrides the tests' SPOOL_ADMIN_LISTEN=off).
#[test]
fn admin_port_in_use_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = holder.local_addr().unwrap();
    let base = free_base_port(1);
    let flag = admin.to_string();
    let child = spawn_spoold(dir.path(), base, 1, &["--admin-listen", &flag]);
    let (code, stderr) = wait_exit(child);
    assert_eq!(code, Some(5), "{stderr}");
    assert!(stderr.contains(&flag), "{stderr}");
    assert!(stderr.contains("admin port"), "{stderr}");
}

// Goal: the broker secret is created once and survives restarts. Method:
// start/stop twice on one dir, compare the secret file.
#[test]
fn secret_persists_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let secret_path = dir.path().join("secret");
    let mut secrets = Vec::new();
    for _ in 0..2 {
        let base = free_base_port(1);
        let mut child = spawn_spoold(dir.path(), base, 1, &[]);
        connect_when_up(&mut child, format!("127.0.0.1:{base}").parse().unwrap());
        signal(&child, libc::SIGTERM);
        let (code, stderr) = wait_exit(child);
        assert_eq!(code, Some(0), "{stderr}");
        secrets.push(std::fs::read(&secret_path).unwrap());
    }
    assert_eq!(secrets[0].len(), 32);
    assert_eq!(secrets[0], secrets[1]);
}

// Goal: configuration errors exit with the config code and name the field;
// --help documents the flags and exits 0. Method: run spoold to completion.
#[test]
fn help_and_config_errors() {
    let help = run_to_exit(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in ["--config", "--data-dir", "--listen", "--cores", "--log-format"] {
        assert!(text.contains(flag), "--help lacks {flag}: {text}");
    }

    let dir = tempfile::tempdir().unwrap();
    let bad_tick =
        run_to_exit(&["--data-dir", dir.path().to_str().unwrap(), "--housekeeping-tick-ms", "50"]);
    assert_eq!(bad_tick.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad_tick.stderr);
    assert!(stderr.contains("housekeeping_tick_ms = 50 is out of range 1..=10"), "{stderr}");

    let config = dir.path().join("spool.toml");
    std::fs::write(&config, "no_such_key = 1\n").unwrap();
    let bad_file = run_to_exit(&["--config", config.to_str().unwrap()]);
    assert_eq!(bad_file.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad_file.stderr);
    assert!(stderr.contains("spool.toml") && stderr.contains("no_such_key"), "{stderr}");
}

// Goal: --log-format json writes one JSON object per line. Method: start,
// stop, parse every stderr line as JSON.
#[test]
fn json_logs_are_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port(1);
    let mut child = spawn_spoold(dir.path(), base, 1, &["--log-format", "json"]);
    connect_when_up(&mut child, format!("127.0.0.1:{base}").parse().unwrap());
    signal(&child, libc::SIGTERM);
    let (code, stderr) = wait_exit(child);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|line| !line.is_empty()).collect();
    assert!(lines.len() >= 2, "{stderr}");
    for line in lines {
        let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|error| {
            panic!("not JSON ({error}): {line}");
        });
        assert!(value.get("level").is_some(), "{line}");
    }
}
