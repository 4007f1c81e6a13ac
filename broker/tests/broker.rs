//! `Broker` in-process: custom shard hooks see assignment updates for the
//! partitions they own, every executor ticks, stop flushes every shard, and
//! queues (ids, configs, placement) survive a restart through the catalog.

// Test helpers panic on setup failures by design.
#![allow(clippy::unwrap_used)]

use std::cell::Cell;
use std::future::Future;
use std::net::TcpListener;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spool_broker::admin::node::Node;
use spool_broker::control::assignment::{
    AssignmentChange, AssignmentTable, AssignmentUpdate, AssignmentVersion, QueueName, ShardId,
};
use spool_broker::control::catalog::{self, Catalog, CatalogError, CatalogQueue};
use spool_broker::control::config::AdminListen;
use spool_broker::control::layers::PartialConfig;
use spool_broker::fatal::FatalReason;
use spool_broker::net::echo::EchoHandler;
use spool_broker::net::listener::NetError;
use spool_broker::queue::{Backoff, QueueConfig, QueueId};
use spool_broker::shard::hooks::{ShardContext, ShardHooks, ShardHooksFactory};
use spool_broker::shard::{
    cpus, Broker, CoordinatorError, CoordinatorHandle, ShardError, StartError,
};

/// What a shard-side `create_queue_async` call observed when it finished.
#[derive(Debug)]
struct AsyncOutcome {
    result: Result<(u64, u32), String>,
    /// Lowest version applied over all shards at completion.
    min_applied: u64,
    /// Whether this shard's hooks had seen the create before completion.
    hooks_saw_create: bool,
}

#[derive(Default)]
struct Record {
    /// (shard, version, owned partitions as "queue/partition").
    assignments: Mutex<Vec<(u16, u64, Vec<String>)>>,
    /// Every update each shard's hooks were given, in arrival order.
    updates: Mutex<Vec<(u16, AssignmentUpdate)>>,
    flushes: Mutex<Vec<u16>>,
    ticks: Vec<AtomicU64>,
    async_outcome: Mutex<Option<AsyncOutcome>>,
}

impl Record {
    fn new(shards: u16) -> Arc<Record> {
        Arc::new(Record {
            ticks: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            ..Default::default()
        })
    }

    fn updates_of(&self, shard: u16) -> Vec<AssignmentUpdate> {
        let updates = self.updates.lock().unwrap();
        updates.iter().filter(|(s, _)| *s == shard).map(|(_, update)| update.clone()).collect()
    }
}

struct RecordingFactory {
    record: Arc<Record>,
    /// On its first tick, shard 0 creates this queue with
    /// `create_queue_async` from inside its executor.
    create_from_shard: Option<&'static str>,
}

struct RecordingHooks {
    shard: ShardId,
    shard_count: u16,
    record: Arc<Record>,
    handler: Rc<EchoHandler>,
    coordinator: CoordinatorHandle,
    create_from_shard: Option<&'static str>,
    started: Cell<bool>,
}

impl ShardHooksFactory for RecordingFactory {
    type Hooks = RecordingHooks;
    fn make(&self, context: &ShardContext) -> RecordingHooks {
        RecordingHooks {
            shard: context.shard,
            shard_count: context.shard_count,
            record: self.record.clone(),
            handler: Rc::new(EchoHandler { frame_bytes_max: 4096 }),
            coordinator: context.coordinator.clone(),
            create_from_shard: self.create_from_shard,
            started: Cell::new(false),
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
        self.record.updates.lock().unwrap().push((self.shard.0, update.clone()));
        std::future::ready(Ok(()))
    }

    fn on_tick(&self) {
        self.record.ticks[usize::from(self.shard.0)].fetch_add(1, Ordering::Relaxed);
        let Some(queue) = self.create_from_shard else { return };
        if self.shard != ShardId(0) || self.started.replace(true) {
            return;
        }
        let coordinator = self.coordinator.clone();
        let record = self.record.clone();
        let (shard, shard_count) = (self.shard.0, self.shard_count);
        glommio::spawn_local(async move {
            let result =
                coordinator.create_queue_async(queue, 3, QueueConfig::default(), 10_000).await;
            let min_applied = (0..shard_count)
                .map(|shard| coordinator.applied_version(ShardId(shard)).0)
                .min()
                .unwrap();
            let hooks_saw_create = record.updates.lock().unwrap().iter().any(|(s, update)| {
                *s == shard
                    && matches!(&update.change,
                        AssignmentChange::CreateQueue { queue: name, .. } if name.as_str() == queue)
            });
            let result = result
                .map(|created| (created.version.0, created.queue_id.0))
                .map_err(|error| error.to_string());
            *record.async_outcome.lock().unwrap() =
                Some(AsyncOutcome { result, min_applied, hooks_saw_create });
        })
        .detach();
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

fn shard_count() -> u16 {
    cpus::allowed_cpus().len().min(2) as u16
}

fn start(
    dir: &Path,
    shards: u16,
    record: &Arc<Record>,
    create_from_shard: Option<&'static str>,
) -> Result<Broker, StartError> {
    // The ports were free when probed; a test running beside this one may
    // bind one of them before the shards do: then new ports, a few times.
    let mut attempts = 0;
    loop {
        attempts += 1;
        match start_on(free_base_port(shards), dir, shards, record, create_from_shard) {
            Err(StartError::Executor {
                error: ShardError::Net(NetError::PortInUse { addr }),
                ..
            }) if attempts < 5 => {
                eprintln!("port {addr} taken before the shard bound it; new ports");
            }
            result => return result,
        }
    }
}

fn start_on(
    base: u16,
    dir: &Path,
    shards: u16,
    record: &Arc<Record>,
    create_from_shard: Option<&'static str>,
) -> Result<Broker, StartError> {
    let config = PartialConfig {
        data_dir: Some(dir.to_owned()),
        listen: Some(format!("127.0.0.1:{base}").parse().unwrap()),
        cores: Some(shards),
        // The broker alone: the admin port is `Node`'s (tested below).
        admin_listen: Some(AdminListen::Off),
        ..Default::default()
    }
    .resolve(cpus::allowed_cpus().len())
    .unwrap();
    Broker::start(config, RecordingFactory { record: record.clone(), create_from_shard })
}

fn stop(broker: Broker) {
    broker.request_stop();
    broker.wait().unwrap();
}

// Goal: assignment changes reach every shard in version order, each shard's
// hooks see exactly the partitions placed on it, ticks run, and stop flushes
// every shard and returns Ok. Method: 2 shards (or 1), create a 4-partition
// queue, delete it, stop; inspect what the hooks recorded.
#[test]
fn assignments_reach_every_shard_and_stop_flushes() {
    let shards = shard_count();
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(shards);
    let broker = start(dir.path(), shards, &record, None).unwrap();
    let coordinator = broker.coordinator();

    let created = coordinator.create_queue("jobs", 4, QueueConfig::default()).unwrap();
    coordinator.wait_applied(created.version, 10_000).unwrap();
    assert!(matches!(
        coordinator.create_queue("jobs", 1, QueueConfig::default()),
        Err(CoordinatorError::Assignment(_))
    ));
    let deleted = coordinator.delete_queue("jobs").unwrap();
    assert_eq!(deleted.0, created.version.0 + 1);
    coordinator.wait_applied(deleted, 10_000).unwrap();
    for shard in 0..shards {
        assert_eq!(coordinator.applied_version(ShardId(shard)), deleted);
    }

    stop(broker);

    let assignments = record.assignments.lock().unwrap().clone();
    for shard in 0..shards {
        let seen: Vec<_> = assignments.iter().filter(|(s, _, _)| *s == shard).collect();
        assert_eq!(seen.len(), 2, "shard {shard}: {assignments:?}");
        assert_eq!(seen[0].1, created.version.0);
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

/// (name, id, config, placement) of every create a shard was given.
fn creates(updates: &[AssignmentUpdate]) -> Vec<(String, u32, QueueConfig, Vec<u16>)> {
    updates
        .iter()
        .map(|update| match &update.change {
            AssignmentChange::CreateQueue { queue, queue_id, shards, config, .. } => (
                queue.as_str().to_owned(),
                queue_id.0,
                (**config).clone(),
                shards.iter().map(|shard| shard.0).collect(),
            ),
            other => panic!("replay holds a non-create {other:?}"),
        })
        .collect()
}

// Goal: queues survive a restart: the new broker's hooks get, as their
// first updates and in creation order, exactly the live queues with the
// same ids, configs and placement; versions continue; deleted ids are never
// reused. Method: broker A creates jobs/gone/mail, deletes gone, stops;
// broker B on the same dir records its replay, then creates and re-creates
// queues and checks the ids; broker C sees B's changes.
#[test]
fn queues_ids_and_configs_survive_restart_in_order() {
    let shards = shard_count();
    let dir = tempfile::tempdir().unwrap();
    let mail_config = QueueConfig {
        band_weights: vec![9, 5, 3, 1, 1],
        backoff: Backoff::Linear { step_ms: 250, max_ms: 10_000 },
        dead_letter_on_expiry: true,
        ..QueueConfig::default()
    };
    let jobs_config = QueueConfig { lease_default_ms: 45_000, ..QueueConfig::default() };

    let record_a = Record::new(shards);
    let broker = start(dir.path(), shards, &record_a, None).unwrap();
    let coordinator = broker.coordinator();
    let jobs = coordinator.create_queue("jobs", 4, jobs_config.clone()).unwrap();
    let gone = coordinator.create_queue("gone", 1, QueueConfig::default()).unwrap();
    let mail = coordinator.create_queue("mail", 3, mail_config.clone()).unwrap();
    let deleted = coordinator.delete_queue("gone").unwrap();
    assert_eq!((jobs.queue_id, gone.queue_id, mail.queue_id), (QueueId(1), QueueId(2), QueueId(3)));
    coordinator.wait_applied(deleted, 10_000).unwrap();
    let snapshot = coordinator.catalog_snapshot();
    assert_eq!(snapshot.version(), deleted);
    let placement_of = |table: &AssignmentTable, queue: &str| -> Vec<u16> {
        let name = QueueName::new(queue).unwrap();
        table.partitions(&name).unwrap().iter().map(|p| p.shard.0).collect()
    };
    let jobs_placement = placement_of(&snapshot, "jobs");
    let mail_placement = placement_of(&snapshot, "mail");
    stop(broker);

    let record_b = Record::new(shards);
    let broker = start(dir.path(), shards, &record_b, None).unwrap();
    let coordinator = broker.coordinator();
    // Start returned only after every shard applied the replay.
    for shard in 0..shards {
        assert_eq!(coordinator.applied_version(ShardId(shard)), deleted);
        let updates = record_b.updates_of(shard);
        let versions: Vec<u64> = updates.iter().map(|update| update.version.0).collect();
        assert_eq!(versions, vec![deleted.0 - 1, deleted.0], "shard {shard}");
        assert_eq!(
            creates(&updates),
            vec![
                ("jobs".to_owned(), 1, jobs_config.clone(), jobs_placement.clone()),
                ("mail".to_owned(), 3, mail_config.clone(), mail_placement.clone()),
            ],
            "shard {shard}"
        );
    }
    let snapshot = coordinator.catalog_snapshot();
    let mail_name = QueueName::new("mail").unwrap();
    assert_eq!(snapshot.queue_by_id(QueueId(3)).unwrap().0, &mail_name);
    assert!(snapshot.queue_by_id(QueueId(2)).is_none());

    let next = coordinator.create_queue("next", 1, QueueConfig::default()).unwrap();
    assert_eq!(next.queue_id, QueueId(4), "id 2 (deleted) must not be reused");
    assert_eq!(next.version, AssignmentVersion(deleted.0 + 1));
    coordinator.delete_queue("mail").unwrap();
    let mail_again = coordinator.create_queue("mail", 1, QueueConfig::default()).unwrap();
    assert_eq!(mail_again.queue_id, QueueId(5));
    coordinator.wait_applied(mail_again.version, 10_000).unwrap();
    stop(broker);

    let record_c = Record::new(shards);
    let broker = start(dir.path(), shards, &record_c, None).unwrap();
    let ids: Vec<(String, u32)> =
        creates(&record_c.updates_of(0)).into_iter().map(|(name, id, _, _)| (name, id)).collect();
    assert_eq!(ids, vec![("jobs".to_owned(), 1), ("next".to_owned(), 4), ("mail".to_owned(), 5)]);
    let created = broker.coordinator().create_queue("later", 1, QueueConfig::default()).unwrap();
    assert_eq!(created.queue_id, QueueId(6));
    stop(broker);
}

// Goal: a catalog that places a partition on a shard the broker no longer
// runs (--cores lowered) stops start-up with a clear error and the Config
// exit reason, and leaves the catalog untouched. Method: store a catalog
// with a partition on shard 7, start a broker with fewer shards.
#[test]
fn shard_count_mismatch_is_a_clear_start_error() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog {
        version: AssignmentVersion(1),
        shard_count: 8,
        placement_cursor: 0,
        next_queue_id: QueueId(2),
        queues: vec![CatalogQueue {
            subscriptions: Default::default(),
            name: QueueName::new("wide").unwrap(),
            id: QueueId(1),
            created_at: AssignmentVersion(1),
            shards: (0..8).map(ShardId).collect(),
            config: Arc::new(QueueConfig::default()),
            keys: spool_broker::control::assignment::KeyPlacement::fresh(8),
            replicas: Default::default(),
        }],
    };
    catalog::store(dir.path(), &catalog).unwrap();
    let before = std::fs::read(dir.path().join(catalog::CATALOG_FILE_NAME)).unwrap();
    let shards = shard_count();
    let error = start(dir.path(), shards, &Record::new(shards), None).unwrap_err();
    match &error {
        StartError::Catalog(CatalogError::PlacementBeyondShards {
            queue,
            shard,
            shard_count,
            ..
        }) => {
            assert_eq!(queue.as_str(), "wide");
            assert_eq!(shard.0, shards);
            assert_eq!(*shard_count, shards);
        }
        other => panic!("expected PlacementBeyondShards, got {other:?}"),
    }
    assert!(error.to_string().contains("--cores"), "{error}");
    assert_eq!(error.fatal_reason(), FatalReason::Config);
    let after = std::fs::read(dir.path().join(catalog::CATALOG_FILE_NAME)).unwrap();
    assert_eq!(before, after);
}

// Goal: a damaged catalog stops start-up (DataDir exit reason) instead of
// starting with no queues. Method: flip one body byte of a real catalog.
#[test]
fn damaged_catalog_is_a_start_error() {
    let shards = shard_count();
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(shards);
    let broker = start(dir.path(), shards, &record, None).unwrap();
    broker.coordinator().create_queue("jobs", 2, QueueConfig::default()).unwrap();
    stop(broker);
    let path = dir.path().join(catalog::CATALOG_FILE_NAME);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let error = start(dir.path(), shards, &record, None).unwrap_err();
    assert!(matches!(error, StartError::Catalog(CatalogError::Damaged { .. })), "{error:?}");
    assert_eq!(error.fatal_reason(), FatalReason::DataDir);
}

// Goal: a shard's executor can create a queue through the coordinator
// without blocking itself: create_queue_async completes, and by then every
// shard (including the caller's own, whose assignment task must run while
// the caller waits) has applied it. Method: shard 0's first tick spawns a
// task that calls create_queue_async; the test thread waits for its outcome.
#[test]
fn create_queue_async_from_a_shard_completes_once_all_shards_applied() {
    let shards = shard_count();
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(shards);
    let broker = start(dir.path(), shards, &record, Some("from-shard")).unwrap();
    let mut outcome = None;
    for _ in 0..2_000 {
        outcome = record.async_outcome.lock().unwrap().take();
        if outcome.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let outcome = outcome.expect("create_queue_async did not finish within 10 s");
    let (version, queue_id) = outcome.result.clone().unwrap();
    assert_eq!(queue_id, 1);
    assert!(outcome.min_applied >= version, "{outcome:?}");
    assert!(outcome.hooks_saw_create, "{outcome:?}");
    let name = QueueName::new("from-shard").unwrap();
    let snapshot = broker.coordinator().catalog_snapshot();
    assert_eq!(snapshot.queue(&name).unwrap().partitions.len(), 3);
    stop(broker);
}

// Goal: a catalog write that fails before its rename refuses the change
// entirely: the caller gets CoordinatorError::Catalog, no shard sees an update,
// the version and the id allocator are rolled back, and the next create
// works once the disk does. Method: plant a directory at catalog.tmp so the
// temp file cannot be created, create a queue, remove it, create again.
#[test]
fn failed_catalog_write_refuses_the_change() {
    let shards = shard_count();
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(shards);
    let broker = start(dir.path(), shards, &record, None).unwrap();
    let coordinator = broker.coordinator();
    let blocker = dir.path().join(catalog::CATALOG_TEMP_FILE_NAME);
    std::fs::create_dir(&blocker).unwrap();
    let refused = coordinator.create_queue("jobs", 2, QueueConfig::default());
    assert!(matches!(refused, Err(CoordinatorError::Catalog(_))), "{refused:?}");
    assert_eq!(coordinator.catalog_snapshot().queue_count(), 0);
    assert_eq!(coordinator.catalog_snapshot().version(), AssignmentVersion(0));
    assert!(!dir.path().join(catalog::CATALOG_FILE_NAME).exists());

    std::fs::remove_dir(&blocker).unwrap();
    let created = coordinator.create_queue("jobs", 2, QueueConfig::default()).unwrap();
    assert_eq!(created.version, AssignmentVersion(1));
    assert_eq!(created.queue_id, QueueId(1));
    coordinator.wait_applied(created.version, 10_000).unwrap();
    for shard in 0..shards {
        let versions: Vec<u64> =
            record.updates_of(shard).iter().map(|update| update.version.0).collect();
        assert_eq!(versions, vec![1], "shard {shard}");
    }
    stop(broker);
}

// Goal: the admin port runs in-process beside hooks that report nothing:
// port 0 picks a free port, live answers 200, ready answers 200 once every
// shard reported (a shard reaches it only by message), and stop ends the
// admin thread with the executors. Method: start with admin port 0, raw
// HTTP requests, stop; the port refuses connections afterwards.
#[test]
fn admin_port_zero_serves_health_and_stops_with_the_broker() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(1);
    let config = PartialConfig {
        data_dir: Some(dir.path().to_owned()),
        listen: Some(format!("127.0.0.1:{}", free_base_port(1)).parse().unwrap()),
        cores: Some(1),
        // Port 0: the kernel picks a free one (`Node::admin_addr`).
        admin_listen: Some(AdminListen::At("127.0.0.1:0".parse().unwrap())),
        ..Default::default()
    }
    .resolve(cpus::allowed_cpus().len())
    .unwrap();
    let node =
        Node::start(config, RecordingFactory { record: record.clone(), create_from_shard: None })
            .unwrap();
    let addr = node.admin_addr().expect("admin port on");
    assert_ne!(addr.port(), 0);
    let get = |path: &str| {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    assert!(get("/health/live").starts_with("HTTP/1.1 200"));
    let ready = get("/health/ready");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(ready.contains("ready: 1 shards"), "{ready}");
    let metrics = get("/metrics");
    assert!(metrics.contains("spool_shard_reporting{shard=\"0\"} 1"), "{metrics}");
    node.broker().request_stop();
    node.wait().unwrap();
    assert!(std::net::TcpStream::connect(addr).is_err(), "the admin port closed on stop");
}
