//! Catalog encoding, damage detection, atomic replacement and replay.

use super::*;
use crate::control::assignment::PartitionAssignment;
use crate::queue::SubscriptionId;

fn name(text: &str) -> QueueName {
    QueueName::new(text).unwrap()
}

/// A table with three creates and one delete on 3 shards, and the next id.
fn sample_table() -> (AssignmentTable, QueueId) {
    let mut table = AssignmentTable::new(3);
    let configs = [
        QueueConfig::default(),
        QueueConfig {
            band_weights: vec![9, 5, 3, 1, 1],
            backoff: crate::queue::Backoff::Linear { step_ms: 250, max_ms: 10_000 },
            dead_letter_on_expiry: true,
            ..QueueConfig::default()
        },
        QueueConfig { backoff: crate::queue::Backoff::None, ..QueueConfig::default() },
    ];
    for (index, (queue, partitions)) in
        [("jobs", 4u32), ("gone", 1), ("mail", 2)].iter().enumerate()
    {
        let update = table
            .plan_create_queue(
                name(queue),
                QueueId(index as u32 + 1),
                *partitions,
                Arc::new(configs[index].clone()),
            )
            .unwrap();
        table.apply(&update).unwrap();
    }
    let delete = table.plan_delete_queue(name("gone")).unwrap();
    table.apply(&delete).unwrap();
    (table, QueueId(4))
}

fn placement(table: &AssignmentTable, queue: &str) -> Vec<u16> {
    table
        .partitions(&name(queue))
        .unwrap()
        .iter()
        .map(|p: &PartitionAssignment| p.shard.0)
        .collect()
}

// Goal: a stored catalog loads back equal, and its replay rebuilds the same
// queues (ids, configs, placement), ends at the same version and keeps the
// placement cursor. Method: store a table with a deleted queue, load,
// compare, replay onto the same shard count.
#[test]
fn round_trip_and_replay_rebuild_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let (table, next_id) = sample_table();
    let catalog = Catalog::from_table(&table, next_id);
    assert_eq!(catalog.queues.len(), 2);
    store(dir.path(), &catalog).unwrap();
    let loaded = load(dir.path()).unwrap().unwrap();
    assert_eq!(loaded, catalog);
    assert_eq!(loaded.next_queue_id, QueueId(4));

    let replay = loaded.replay(3, &dir.path().join(CATALOG_FILE_NAME)).unwrap();
    assert_eq!(replay.start.version(), AssignmentVersion(2));
    assert_eq!(replay.start.queue_count(), 0);
    let versions: Vec<u64> = replay.updates.iter().map(|update| update.version.0).collect();
    assert_eq!(versions, vec![3, 4]);
    assert_eq!(replay.table.version(), table.version());
    assert_eq!(replay.table.placement_cursor(), table.placement_cursor());
    for queue in ["jobs", "mail"] {
        let (before, after) =
            (table.queue(&name(queue)).unwrap(), replay.table.queue(&name(queue)).unwrap());
        assert_eq!(after.id, before.id);
        assert_eq!(after.config, before.config);
        assert_eq!(placement(&replay.table, queue), placement(&table, queue));
    }
    assert!(replay.table.queue(&name("gone")).is_none());
    assert_eq!(replay.table.queue_by_id(QueueId(3)).unwrap().0.as_str(), "mail");
    // The replayed table writes back the same catalog, except creation
    // versions, which are the replay's.
    let again = Catalog::from_table(&replay.table, replay.next_queue_id);
    assert_eq!(again.version, catalog.version);
    assert_eq!(again.queues.len(), 2);
}

// Goal: a fresh directory has no catalog (None, not an error).
// Method: load from an empty temp dir.
#[test]
fn missing_catalog_is_none() {
    let dir = tempfile::tempdir().unwrap();
    assert!(load(dir.path()).unwrap().is_none());
}

// Goal: any single bit flip anywhere in the file, and any truncation or
// appended byte, is a start-up error, never a (smaller) catalog. Method:
// flip each bit of every byte of a real encoding; cut at every length.
#[test]
fn bit_flips_and_truncations_are_errors() {
    let (table, next_id) = sample_table();
    let bytes = Catalog::from_table(&table, next_id).encode().unwrap();
    let path = Path::new("/data/catalog");
    for index in 0..bytes.len() {
        for bit in 0..8 {
            let mut damaged = bytes.clone();
            damaged[index] ^= 1 << bit;
            let result = Catalog::decode(&damaged, path);
            assert!(
                matches!(
                    result,
                    Err(CatalogError::Damaged { .. } | CatalogError::UnsupportedFormat { .. })
                ),
                "flip of bit {bit} at byte {index} gave {result:?}"
            );
        }
    }
    for len in 0..bytes.len() {
        let result = Catalog::decode(&bytes[..len], path);
        assert!(matches!(result, Err(CatalogError::Damaged { .. })), "cut at {len}: {result:?}");
    }
    let mut appended = bytes.clone();
    appended.push(b'\n');
    assert!(matches!(Catalog::decode(&appended, path), Err(CatalogError::Damaged { .. })));
    assert!(Catalog::decode(&bytes, path).is_ok());
}

// Goal: damage found on disk is reported by load() with the path and a hint
// that the broker refuses to start empty. Method: truncate a stored file.
#[test]
fn load_reports_damage_with_path() {
    let dir = tempfile::tempdir().unwrap();
    let (table, next_id) = sample_table();
    store(dir.path(), &Catalog::from_table(&table, next_id)).unwrap();
    let path = dir.path().join(CATALOG_FILE_NAME);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let error = load(dir.path()).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, CatalogError::Damaged { .. }), "{error:?}");
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("refusing to start with an empty"), "{message}");
}

// Goal: a leftover temp file (crash before rename) is ignored and removed;
// the real catalog wins, and a later store replaces it cleanly. Method:
// store, plant garbage at catalog.tmp, load, store again, load.
#[test]
fn leftover_temp_file_is_ignored_and_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let (table, next_id) = sample_table();
    let catalog = Catalog::from_table(&table, next_id);
    store(dir.path(), &catalog).unwrap();
    let temp_path = dir.path().join(CATALOG_TEMP_FILE_NAME);
    std::fs::write(&temp_path, b"spool-catalog 1 9999 00000000\n{half").unwrap();
    assert_eq!(load(dir.path()).unwrap().unwrap(), catalog);
    assert!(!temp_path.exists());

    std::fs::write(&temp_path, b"junk").unwrap();
    let empty = Catalog { queues: Vec::new(), ..catalog.clone() };
    store(dir.path(), &empty).unwrap();
    assert!(!temp_path.exists());
    assert_eq!(load(dir.path()).unwrap().unwrap(), empty);
}

// Goal: a placement naming a shard the broker no longer runs is a clear
// error that says --cores changed; more shards than before is fine and
// keeps placement. Method: replay a 3-shard catalog onto 2 and 4 shards.
#[test]
fn replay_refuses_placements_beyond_the_shard_count() {
    let (table, next_id) = sample_table();
    let catalog = Catalog::from_table(&table, next_id);
    let path = Path::new("/data/catalog");
    let error = catalog.replay(2, path).unwrap_err();
    match &error {
        CatalogError::PlacementBeyondShards { queue, partition, shard, shard_count } => {
            assert_eq!(queue.as_str(), "jobs");
            assert_eq!(*partition, 2);
            assert_eq!(*shard, ShardId(2));
            assert_eq!(*shard_count, 2);
        }
        other => panic!("expected PlacementBeyondShards, got {other:?}"),
    }
    assert!(error.to_string().contains("--cores"), "{error}");
    let replay = catalog.replay(4, path).unwrap();
    assert_eq!(placement(&replay.table, "jobs"), placement(&table, "jobs"));
    assert_eq!(replay.table.shard_count(), 4);
}

// Goal: a well-formed file whose content contradicts itself is refused.
// Method: re-encode edited catalogs (valid crc) with a duplicate id, an id
// at/above next_queue_id, a version below the queue count, a bad config.
#[test]
fn inconsistent_catalogs_are_refused() {
    let (table, next_id) = sample_table();
    let good = Catalog::from_table(&table, next_id);
    let path = Path::new("/data/catalog");
    let mut duplicate_id = good.clone();
    duplicate_id.queues[1].id = duplicate_id.queues[0].id;
    let mut id_too_high = good.clone();
    id_too_high.next_queue_id = QueueId(3);
    let mut version_low = good.clone();
    version_low.version = AssignmentVersion(1);
    let mut bad_config = good.clone();
    bad_config.queues[0].config =
        Arc::new(QueueConfig { max_deliveries: 0, ..QueueConfig::default() });
    for (what, catalog) in [
        ("duplicate id", duplicate_id),
        ("id too high", id_too_high),
        ("version low", version_low),
        ("bad config", bad_config),
    ] {
        let bytes = catalog.encode().unwrap();
        let result = Catalog::decode(&bytes, path);
        assert!(matches!(result, Err(CatalogError::Invalid { .. })), "{what}: {result:?}");
    }
}

// Goal: a newer format version is named as such, not as damage.
// Method: rewrite the header's version with a correct crc.
#[test]
fn newer_format_is_reported_as_unsupported() {
    let bytes = Catalog::empty(1).encode().unwrap();
    let text =
        String::from_utf8(bytes).unwrap().replacen("spool-catalog 1 ", "spool-catalog 2 ", 1);
    let result = Catalog::decode(text.as_bytes(), Path::new("/c"));
    assert!(matches!(result, Err(CatalogError::UnsupportedFormat { found: 2, .. })), "{result:?}");
}

// Goal: a resized queue's key map (version, held partitions, the older
// partitions still draining) survives the catalog and its replay, and a
// queue never resized is written as before (no `keys` field, so older
// brokers still read the file). Method: grow `jobs` 4 → 6, report one
// partition drained, store, load, replay, compare; look for the field.
#[test]
fn a_resized_queue_keeps_its_key_map_through_store_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (mut table, next_id) = sample_table();
    let grow = table.plan_grow_queue(name("jobs"), 6).unwrap();
    table.apply(&grow).unwrap();
    let drained = table.plan_keys_drained(name("jobs"), 2, PartitionId(1)).unwrap();
    table.apply(&drained).unwrap();
    let catalog = Catalog::from_table(&table, next_id);
    store(dir.path(), &catalog).unwrap();
    let bytes = std::fs::read(dir.path().join(CATALOG_FILE_NAME)).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(text.matches("\"keys\"").count(), 1, "{text}");
    let loaded = load(dir.path()).unwrap().unwrap();
    assert_eq!(loaded, catalog);
    let replay = loaded.replay(3, &dir.path().join(CATALOG_FILE_NAME)).unwrap();
    let keys = &replay.table.queue(&name("jobs")).unwrap().keys;
    assert_eq!(keys, &table.queue(&name("jobs")).unwrap().keys);
    assert_eq!(keys.version, 2);
    assert_eq!(keys.held_from, 4);
    let draining: Vec<u32> = keys.draining.iter().map(|partition| partition.0).collect();
    assert_eq!(draining, vec![0, 2, 3]);
    assert_eq!(placement(&replay.table, "jobs"), placement(&table, "jobs"));
    assert_eq!(replay.table.version(), table.version());
}

// Goal: re-placed replica sets (settled or not) survive the catalog and its
// replay, and a catalog without any is written as before (no `replicas`
// field). Method: re-place two partitions of `jobs`, settle one, store,
// load, replay, compare the sets; look for the field.
#[test]
fn re_placed_replica_sets_survive_store_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (mut table, next_id) = sample_table();
    store(dir.path(), &Catalog::from_table(&table, next_id)).unwrap();
    let plain = std::fs::read(dir.path().join(CATALOG_FILE_NAME)).unwrap();
    assert!(!String::from_utf8_lossy(&plain).contains("\"replicas\""));
    for (partition, to) in [(0, vec![1, 2, 4]), (2, vec![2, 3, 5])] {
        let from = vec![1, 2, 3];
        let update =
            table.plan_set_replicas(name("jobs"), PartitionId(partition), from, to).unwrap();
        table.apply(&update).unwrap();
    }
    let settled = table.plan_replicas_settled(name("jobs"), PartitionId(0), vec![1, 2, 4]).unwrap();
    table.apply(&settled).unwrap();
    let catalog = Catalog::from_table(&table, next_id);
    store(dir.path(), &catalog).unwrap();
    let loaded = load(dir.path()).unwrap().unwrap();
    assert_eq!(loaded, catalog);
    let replay = loaded.replay(3, &dir.path().join(CATALOG_FILE_NAME)).unwrap();
    let sets = &replay.table.queue(&name("jobs")).unwrap().replicas;
    assert_eq!(sets, &table.queue(&name("jobs")).unwrap().replicas);
    assert_eq!(sets.len(), 2);
    assert!(sets[&PartitionId(0)].settled && !sets[&PartitionId(2)].settled);
    assert_eq!(sets[&PartitionId(2)].nodes, vec![2, 3, 5]);
}

// Goal: a queue's subscriptions (and the next id, so ids are never reused)
// survive the catalog and its replay; a catalog without any is written as
// before (no `subscriptions` field); a deleted subscription's id is not
// handed out again. Method: subscribe twice, unsubscribe one, store, load,
// replay, subscribe again on the replayed table.
#[test]
fn subscriptions_survive_store_and_replay_and_ids_are_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut table, next_id) = sample_table();
    store(dir.path(), &Catalog::from_table(&table, next_id)).unwrap();
    let plain = std::fs::read(dir.path().join(CATALOG_FILE_NAME)).unwrap();
    assert!(!String::from_utf8_lossy(&plain).contains("\"subscriptions\""));
    for (sub, start) in [
        ("audit", SubscriptionStart::Earliest),
        ("report", SubscriptionStart::Latest),
        ("replay", SubscriptionStart::Time(1_700_000_000_000)),
        ("tail", SubscriptionStart::Offset(42)),
    ] {
        let update = table.plan_subscribe(name("jobs"), sub.to_owned(), start).unwrap();
        table.apply(&update).unwrap();
    }
    let update = table.plan_unsubscribe(name("jobs"), "audit".to_owned()).unwrap();
    table.apply(&update).unwrap();
    let catalog = Catalog::from_table(&table, next_id);
    store(dir.path(), &catalog).unwrap();
    let loaded = load(dir.path()).unwrap().unwrap();
    assert_eq!(loaded, catalog);
    let mut replayed = loaded.replay(3, &dir.path().join(CATALOG_FILE_NAME)).unwrap().table;
    let subscriptions = &replayed.queue(&name("jobs")).unwrap().subscriptions;
    assert_eq!(subscriptions, &table.queue(&name("jobs")).unwrap().subscriptions);
    assert_eq!(subscriptions.id("report"), Some(SubscriptionId(2)));
    let replay = subscriptions.named.get("replay").map(|entry| entry.start);
    assert_eq!(replay, Some(SubscriptionStart::Time(1_700_000_000_000)), "a start by time");
    let tail = subscriptions.named.get("tail").map(|entry| entry.start);
    assert_eq!(tail, Some(SubscriptionStart::Offset(42)), "a start at an offset");
    assert_eq!(subscriptions.id("audit"), None);
    assert_eq!(subscriptions.id("default"), Some(SubscriptionId::DEFAULT));
    let again =
        replayed.plan_subscribe(name("jobs"), "audit".to_owned(), SubscriptionStart::Latest);
    let again = again.unwrap();
    replayed.apply(&again).unwrap();
    let id = replayed.queue(&name("jobs")).unwrap().subscriptions.id("audit");
    assert_eq!(id, Some(SubscriptionId(5)), "a deleted subscription's id is never reused");
}
