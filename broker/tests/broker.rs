//! `Broker` in-process: custom shard hooks see assignment updates for the
//! partitions they own, every executor ticks, and stop flushes every shard.

// Test helpers panic on setup failures by design.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::net::TcpListener;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spool_broker::control::assignment::{AssignmentTable, AssignmentUpdate, ShardId};
use spool_broker::control::config::PartialConfig;
use spool_broker::net::echo::EchoHandler;
use spool_broker::shard::hooks::{ShardContext, ShardHooks, ShardHooksFactory};
use spool_broker::shard::{cpus, Broker, ControlError};

#[derive(Default)]
struct Record {
    /// (shard, version, owned partitions as "queue/partition").
    assignments: Mutex<Vec<(u16, u64, Vec<String>)>>,
    flushes: Mutex<Vec<u16>>,
    ticks: Vec<AtomicU64>,
}

struct RecordingFactory(Arc<Record>);

struct RecordingHooks {
    shard: ShardId,
    record: Arc<Record>,
    handler: Rc<EchoHandler>,
}

impl ShardHooksFactory for RecordingFactory {
    type Hooks = RecordingHooks;
    fn make(&self, context: &ShardContext) -> RecordingHooks {
        RecordingHooks {
            shard: context.shard,
            record: self.0.clone(),
            handler: Rc::new(EchoHandler { frame_bytes_max: 4096 }),
        }
    }
}

impl ShardHooks for RecordingHooks {
    type Handler = EchoHandler;
    type Error = std::io::Error;

    fn frame_handler(&self) -> Rc<EchoHandler> {
        self.handler.clone()
    }

    fn on_assignment(
        &self,
        update: &AssignmentUpdate,
        table: &AssignmentTable,
    ) -> impl Future<Output = Result<(), std::io::Error>> {
        let owned = table
            .owned_by(self.shard)
            .map(|(queue, partition)| format!("{queue}/{}", partition.0))
            .collect();
        self.record.assignments.lock().unwrap().push((self.shard.0, update.version.0, owned));
        std::future::ready(Ok(()))
    }

    fn on_tick(&self) {
        self.record.ticks[usize::from(self.shard.0)].fetch_add(1, Ordering::Relaxed);
    }

    fn flush(&self) -> impl Future<Output = Result<(), std::io::Error>> {
        self.record.flushes.lock().unwrap().push(self.shard.0);
        std::future::ready(Ok(()))
    }
}

fn free_base_port(count: u16) -> u16 {
    for _ in 0..100 {
        let base = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if u32::from(base) + u32::from(count) <= 65_535
            && (base..base + count).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok())
        {
            return base;
        }
    }
    panic!("no free ports");
}

// Goal: assignment changes reach every shard in version order, each shard's
// hooks see exactly the partitions placed on it, ticks run, and stop flushes
// every shard and returns Ok. Method: 2 shards (or 1), create a 4-partition
// queue, delete it, stop; inspect what the hooks recorded.
#[test]
fn assignments_reach_every_shard_and_stop_flushes() {
    let shards = cpus::allowed_cpus().len().min(2) as u16;
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port(shards);
    let config = PartialConfig {
        data_dir: Some(dir.path().to_owned()),
        listen: Some(format!("127.0.0.1:{base}").parse().unwrap()),
        cores: Some(shards),
        ..Default::default()
    }
    .resolve(cpus::allowed_cpus().len())
    .unwrap();
    let record = Arc::new(Record {
        ticks: (0..shards).map(|_| AtomicU64::new(0)).collect(),
        ..Default::default()
    });
    let broker = Broker::start(config, RecordingFactory(record.clone())).unwrap();
    let control = broker.control();

    let created = control.create_queue("jobs", 4).unwrap();
    control.wait_applied(created, 10_000).unwrap();
    assert!(matches!(control.create_queue("jobs", 1), Err(ControlError::Assignment(_))));
    let deleted = control.delete_queue("jobs").unwrap();
    assert_eq!(deleted.0, created.0 + 1);
    control.wait_applied(deleted, 10_000).unwrap();
    for shard in 0..shards {
        assert_eq!(control.applied_version(ShardId(shard)), deleted);
    }

    broker.request_stop();
    broker.wait().unwrap();

    let assignments = record.assignments.lock().unwrap().clone();
    for shard in 0..shards {
        let seen: Vec<_> = assignments.iter().filter(|(s, _, _)| *s == shard).collect();
        assert_eq!(seen.len(), 2, "shard {shard}: {assignments:?}");
        assert_eq!(seen[0].1, created.0);
        let expected: Vec<String> = (0..4u32)
            .filter(|partition| partition % u32::from(shards) == u32::from(shard))
            .map(|partition| format!("jobs/{partition}"))
            .collect();
        assert_eq!(seen[0].2, expected, "shard {shard}");
        assert_eq!(seen[1].1, deleted.0);
        assert!(seen[1].2.is_empty());
        assert!(record.ticks[usize::from(shard)].load(Ordering::Relaxed) > 0);
    }
    let mut flushes = record.flushes.lock().unwrap().clone();
    flushes.sort_unstable();
    assert_eq!(flushes, (0..shards).collect::<Vec<_>>());
    // The data-dir lock was released with the broker.
    spool_broker::control::data_dir::DataDirLock::acquire(dir.path()).unwrap();
}
