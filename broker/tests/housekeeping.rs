//! The housekeeping timer adapts to the work: a shard whose hooks have
//! nothing due sleeps up to `HOUSEKEEPING_IDLE_MAX` between ticks, and a
//! ring of the shard's alarm brings the next tick forward.

// Test helpers panic on setup failures by design.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::net::TcpListener;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spool_broker::control::assignment::{AssignmentTable, AssignmentUpdate};
use spool_broker::control::config::AdminListen;
use spool_broker::control::layers::PartialConfig;
use spool_broker::net::echo::EchoHandler;
use spool_broker::shard::alarm::Alarm;
use spool_broker::shard::hooks::{ShardContext, ShardHooks, ShardHooksFactory};
use spool_broker::shard::{cpus, Broker};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// The trait's default: tick every configured tick.
    Default,
    /// Nothing ever due: sleep as long as allowed.
    Idle,
    /// Nothing due, but a task rings the alarm every 10 ms.
    IdleRung,
}

struct Factory {
    mode: Mode,
    ticks: Arc<AtomicU64>,
}

struct Hooks {
    mode: Mode,
    ticks: Arc<AtomicU64>,
    handler: Rc<EchoHandler>,
    alarm: Rc<Alarm>,
}

impl ShardHooksFactory for Factory {
    type Hooks = Hooks;
    fn make(&self, _context: &ShardContext) -> Hooks {
        let alarm = Rc::new(Alarm::default());
        if self.mode == Mode::IdleRung {
            let alarm = alarm.clone();
            glommio::spawn_local(async move {
                loop {
                    glommio::timer::Timer::new(Duration::from_millis(10)).await;
                    // Earlier than any tick the hooks plan.
                    alarm.request(0);
                }
            })
            .detach();
        }
        Hooks {
            mode: self.mode,
            ticks: self.ticks.clone(),
            handler: Rc::new(EchoHandler { frame_bytes_max: 4096 }),
            alarm,
        }
    }
}

impl ShardHooks for Hooks {
    type Handler = EchoHandler;
    type Error = std::io::Error;

    fn frame_handler(&self) -> Rc<EchoHandler> {
        self.handler.clone()
    }

    fn on_assignment(
        &self,
        _update: &AssignmentUpdate,
        _table: &AssignmentTable,
    ) -> impl Future<Output = Result<(), std::io::Error>> {
        std::future::ready(Ok(()))
    }

    fn on_tick(&self) {
        self.ticks.fetch_add(1, Ordering::Relaxed);
    }

    fn next_tick_in(&self, min: Duration, max: Duration) -> Duration {
        if self.mode == Mode::Default {
            return min;
        }
        // Planned far ahead, as a shard with no deadline does.
        self.alarm.plan(u64::MAX);
        max
    }

    fn alarm(&self) -> Option<Rc<Alarm>> {
        (self.mode != Mode::Default).then(|| self.alarm.clone())
    }

    fn flush(&self) -> impl Future<Output = Result<(), std::io::Error>> {
        std::future::ready(Ok(()))
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Ticks one shard made in about a second.
fn ticks_in_a_second(mode: Mode) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let config = PartialConfig {
        data_dir: Some(dir.path().to_owned()),
        listen: Some(format!("127.0.0.1:{}", free_port()).parse().unwrap()),
        cores: Some(1),
        housekeeping_tick_ms: Some(5),
        admin_listen: Some(AdminListen::Off),
        ..Default::default()
    }
    .resolve(cpus::allowed_cpus().len())
    .unwrap();
    let ticks = Arc::new(AtomicU64::new(0));
    let broker = Broker::start(config, Factory { mode, ticks: ticks.clone() }).unwrap();
    let before = ticks.load(Ordering::Relaxed);
    // Time under test: the ticks of one second (a rate).
    std::thread::sleep(Duration::from_secs(1));
    let counted = ticks.load(Ordering::Relaxed) - before;
    broker.request_stop();
    broker.wait().unwrap();
    counted
}

// Goal: a shard with nothing due stops waking every housekeeping tick (an
// idle broker sleeps), and the alarm still brings ticks forward when a request
// needs one. Method: the same 1-shard broker with a 5 ms tick, three hooks:
// the default (tick every 5 ms: ≈ 200 in a second), idle (≈ 10: one per
// HOUSEKEEPING_IDLE_MAX), idle with the alarm rung every 10 ms (≈ 100). The
// bounds leave room for a loaded machine (a late timer only lowers counts,
// so the idle bound cannot fail from load) yet fail if the idle shard ticked
// every 5 ms or the alarm were ignored.
#[test]
fn an_idle_shard_sleeps_and_the_alarm_wakes_it() {
    let busy = ticks_in_a_second(Mode::Default);
    let idle = ticks_in_a_second(Mode::Idle);
    let rung = ticks_in_a_second(Mode::IdleRung);
    assert!(idle <= 20, "an idle shard ticked {idle} times in a second (default: {busy})");
    assert!(busy >= 60, "the default ticks every 5 ms: {busy} in a second");
    assert!(rung >= 40 && rung >= 3 * idle, "rung every 10 ms: {rung} ticks (idle {idle})");
}
