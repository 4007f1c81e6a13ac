//! The queue catalog: the durable record of which queues exist.
//!
//! Owns `DATA_DIR/catalog`: every queue's name, id, config and partition →
//! shard placement, the next queue id (ids are never reused, even after a
//! delete) and the assignment-table version. the coordinator writes it
//! with [`store`] **before** it broadcasts a change to the shards, so a
//! change a shard may have acted on is always on disk; at start the broker
//! [`load`]s it and turns it into a [`Replay`]: the creates the shards apply
//! as their first assignment updates.
//!
//! It does not touch partition data. Deleting a queue only removes it from
//! the catalog; the owning shard's hooks remove the partition directories
//! when they see the `DeleteQueue` update. A crash between the two leaves
//! directories the catalog no longer names, which the shard hooks must treat
//! as garbage at start (they know the partition layout; this module does not).
//!
//! # File format (version 1)
//!
//! ```text
//! spool-catalog 1 <body_len_bytes> <crc32c of body, 8 lowercase hex digits>\n
//! <body: body_len_bytes of JSON, nothing after it>
//! ```
//!
//! The body is `CatalogBody` as JSON: `version`, `shard_count` (when
//! written), `placement_cursor`, `next_queue_id` and `queues`, in creation
//! order, each `{name, id, created_at, shards: [shard of partition i],
//! config}` with `config` the serde form of [`QueueConfig`]. Unknown fields
//! are refused: a catalog written by a newer broker must bump the format
//! version, not be half-read. Compact JSON (about 400 bytes per queue with a
//! default config; `tail -n +2 catalog | jq` skips the header line to read
//! it) keeps the file inspectable by an operator;
//! the crc line makes a torn or bit-flipped file a loud start-up error
//! instead of a silently smaller set of queues.
//!
//! Replacement is atomic: write `catalog.tmp`, `fdatasync`, rename over
//! `catalog`, fsync the directory. A leftover `catalog.tmp` (a crash before
//! the rename) is removed by [`load`]; the old `catalog` is authoritative.
//! Plain `std::fs`: this runs rarely, on the coordinator or at start,
//! never on the data path.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::control::assignment::{
    AssignmentChange, AssignmentError, AssignmentTable, AssignmentUpdate, AssignmentVersion,
    KeyPlacement, PartitionId, QueueName, ReplicaSet, ReplicaSets, ShardId, SubscriptionEntry,
    SubscriptionStart, Subscriptions, PARTITIONS_PER_QUEUE_MAX, QUEUES_MAX,
};
use crate::limits::{CATALOG_BODY_BYTES_MAX, CATALOG_HEADER_BYTES_MAX};
use crate::queue::{QueueConfig, QueueId, SubscriptionId};

/// Name of the catalog inside the data directory.
pub const CATALOG_FILE_NAME: &str = "catalog";
/// Name of the catalog being written; renamed over [`CATALOG_FILE_NAME`].
pub const CATALOG_TEMP_FILE_NAME: &str = "catalog.tmp";
/// First word of the header line.
pub const CATALOG_MAGIC: &str = "spool-catalog";
/// The format version this broker writes and reads.
pub const CATALOG_FORMAT_VERSION: u32 = 1;
/// The first queue id handed out; 0 is never a queue.
pub const FIRST_QUEUE_ID: QueueId = QueueId(1);

/// Why the catalog could not be read or written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CatalogError {
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
    #[error(
        "catalog {path} is damaged ({reason}); refusing to start with an empty \
         queue set. Restore it from a backup or move it away to start empty."
    )]
    Damaged { path: PathBuf, reason: String },
    #[error(
        "catalog {path} has format version {found}; this broker reads {CATALOG_FORMAT_VERSION}"
    )]
    UnsupportedFormat { path: PathBuf, found: u32 },
    #[error("catalog {path} is inconsistent: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("catalog body would be {len_bytes} bytes, over the {CATALOG_BODY_BYTES_MAX} limit")]
    TooLarge { len_bytes: usize },
    #[error(
        "queue {queue} partition {partition} is placed on shard {}, but the broker now \
         runs {shard_count} shards (--cores changed?). Moving partitions between shards \
         is not supported yet: restart with at least {} cores.",
        shard.0, shard.0 + 1
    )]
    PlacementBeyondShards { queue: QueueName, partition: u32, shard: ShardId, shard_count: u16 },
    #[error(
        "catalog {path} renamed into place but the directory fsync failed: {source}; \
         whether the change is durable is unknown"
    )]
    DirectorySync { path: PathBuf, source: std::io::Error },
}

impl CatalogError {
    /// True when a write may or may not have taken effect (the rename
    /// happened but was not made durable). the coordinator cannot
    /// answer that in-process: it stops the broker.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, CatalogError::DirectorySync { .. })
    }
}

fn io_error<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> CatalogError + 'a {
    move |source| CatalogError::Io { op, path: path.to_owned(), source }
}

/// One queue as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogQueue {
    pub name: QueueName,
    pub id: QueueId,
    /// Version of the update that created it; orders the replay.
    pub created_at: AssignmentVersion,
    /// Partition `i` lives on `shards[i]`.
    pub shards: Vec<ShardId>,
    pub config: Arc<QueueConfig>,
    /// Its key map (fresh unless the queue was resized).
    pub keys: KeyPlacement,
    /// In a cluster, the partitions re-placed off the placer's sets.
    pub replicas: ReplicaSets,
    /// Its subscriptions besides the default.
    pub subscriptions: Subscriptions,
}

/// The whole catalog. Build it with [`Catalog::from_table`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    pub version: AssignmentVersion,
    /// Shard count of the broker that wrote it.
    pub shard_count: u16,
    pub placement_cursor: u16,
    /// The id the next created queue gets.
    pub next_queue_id: QueueId,
    /// In creation order.
    pub queues: Vec<CatalogQueue>,
}

/// The JSON body, field for field. Separate from [`Catalog`] so the file
/// format does not change when an in-memory type does.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogBody {
    version: u64,
    shard_count: u16,
    placement_cursor: u16,
    next_queue_id: u32,
    queues: Vec<QueueRecord>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueRecord {
    name: String,
    id: u32,
    created_at: u64,
    shards: Vec<u16>,
    config: QueueConfig,
    /// The key map of a queue that was resized (absent: fresh, as every
    /// catalog written before resizes holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keys: Option<KeysRecord>,
    /// The partitions re-placed off the placer's replica sets (absent:
    /// none, as every catalog written before re-placement holds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    replicas: Vec<ReplicasRecord>,
    /// Its subscriptions besides the default (absent: none, as every
    /// catalog written before subscriptions holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subscriptions: Option<SubscriptionsRecord>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscriptionsRecord {
    next_id: u16,
    named: Vec<SubscriptionRecord>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscriptionRecord {
    name: String,
    id: u16,
    start: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicasRecord {
    partition: u32,
    nodes: Vec<u64>,
    settled: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysRecord {
    version: u64,
    held_from: u32,
    draining: Vec<u32>,
}

/// What a start-up does with a catalog: shards start from `start` and apply
/// `updates` in order, which yields `table` (the coordinator's copy).
#[derive(Debug, Clone)]
pub struct Replay {
    pub start: AssignmentTable,
    pub updates: Vec<AssignmentUpdate>,
    pub table: AssignmentTable,
    pub next_queue_id: QueueId,
}

impl Catalog {
    /// The catalog of a fresh data directory.
    pub fn empty(shard_count: u16) -> Catalog {
        Catalog {
            version: AssignmentVersion(0),
            shard_count,
            placement_cursor: 0,
            next_queue_id: FIRST_QUEUE_ID,
            queues: Vec::new(),
        }
    }

    /// The catalog describing `table`, with `next_queue_id` to hand out next.
    pub fn from_table(table: &AssignmentTable, next_queue_id: QueueId) -> Catalog {
        let mut queues: Vec<CatalogQueue> = table
            .queues()
            .map(|(name, entry)| {
                assert!(entry.id < next_queue_id, "queue id not below the next id");
                CatalogQueue {
                    name: name.clone(),
                    id: entry.id,
                    created_at: entry.created_at,
                    shards: entry.partitions.iter().map(|partition| partition.shard).collect(),
                    config: entry.config.clone(),
                    keys: entry.keys.clone(),
                    replicas: entry.replicas.clone(),
                    subscriptions: entry.subscriptions.clone(),
                }
            })
            .collect();
        queues.sort_by_key(|queue| queue.created_at);
        Catalog {
            version: table.version(),
            shard_count: table.shard_count(),
            placement_cursor: table.placement_cursor(),
            next_queue_id,
            queues,
        }
    }

    /// The file bytes: header line and JSON body.
    ///
    /// # Errors
    /// [`CatalogError::TooLarge`] past [`CATALOG_BODY_BYTES_MAX`].
    pub fn encode(&self) -> Result<Vec<u8>, CatalogError> {
        let body = CatalogBody {
            version: self.version.0,
            shard_count: self.shard_count,
            placement_cursor: self.placement_cursor,
            next_queue_id: self.next_queue_id.0,
            queues: self
                .queues
                .iter()
                .map(|queue| QueueRecord {
                    name: queue.name.as_str().to_owned(),
                    id: queue.id.0,
                    created_at: queue.created_at.0,
                    shards: queue.shards.iter().map(|shard| shard.0).collect(),
                    config: (*queue.config).clone(),
                    keys: (queue.keys != KeyPlacement::fresh(queue.shards.len() as u32)).then(
                        || KeysRecord {
                            version: queue.keys.version,
                            held_from: queue.keys.held_from,
                            draining: queue.keys.draining.iter().map(|p| p.0).collect(),
                        },
                    ),
                    replicas: queue
                        .replicas
                        .iter()
                        .map(|(partition, set)| ReplicasRecord {
                            partition: partition.0,
                            nodes: set.nodes.clone(),
                            settled: set.settled,
                        })
                        .collect(),
                    subscriptions: (queue.subscriptions != Subscriptions::default()).then(|| {
                        SubscriptionsRecord {
                            next_id: queue.subscriptions.next_id,
                            named: queue
                                .subscriptions
                                .named
                                .iter()
                                .map(|(name, entry)| SubscriptionRecord {
                                    name: name.clone(),
                                    id: entry.id.0,
                                    start: entry.start.text(),
                                })
                                .collect(),
                        }
                    }),
                })
                .collect(),
        };
        // Serializing plain structs of strings and integers cannot fail.
        let json = serde_json::to_vec(&body);
        let json = match json {
            Ok(json) => json,
            Err(error) => panic!("catalog body does not serialize: {error}"),
        };
        if json.len() > CATALOG_BODY_BYTES_MAX {
            return Err(CatalogError::TooLarge { len_bytes: json.len() });
        }
        let header = format!(
            "{CATALOG_MAGIC} {CATALOG_FORMAT_VERSION} {} {:08x}\n",
            json.len(),
            crc32c::crc32c(&json)
        );
        assert!(header.len() <= CATALOG_HEADER_BYTES_MAX);
        let mut bytes = Vec::with_capacity(header.len() + json.len());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&json);
        Ok(bytes)
    }

    /// Parses and checks a catalog read from `path` (named in errors).
    ///
    /// # Errors
    /// `Damaged` (bad header, length or crc, unparsable JSON),
    /// `UnsupportedFormat`, `Invalid` (parsed but self-contradictory).
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Catalog, CatalogError> {
        let damaged = |reason: String| CatalogError::Damaged { path: path.to_owned(), reason };
        let header_end = bytes
            .iter()
            .take(CATALOG_HEADER_BYTES_MAX)
            .position(|&byte| byte == b'\n')
            .ok_or_else(|| damaged("no header line".to_owned()))?;
        let header = std::str::from_utf8(&bytes[..header_end])
            .map_err(|_| damaged("header is not UTF-8".to_owned()))?;
        let fields: Vec<&str> = header.split(' ').collect();
        let [magic, format, len, crc] = fields.as_slice() else {
            return Err(damaged(format!("header {header:?} does not have 4 fields")));
        };
        if *magic != CATALOG_MAGIC {
            return Err(damaged(format!("header starts with {magic:?}, not {CATALOG_MAGIC:?}")));
        }
        let format: u32 =
            format.parse().map_err(|_| damaged(format!("format version {format:?}")))?;
        if format != CATALOG_FORMAT_VERSION {
            return Err(CatalogError::UnsupportedFormat { path: path.to_owned(), found: format });
        }
        let len_bytes: usize = len.parse().map_err(|_| damaged(format!("length {len:?}")))?;
        let crc = u32::from_str_radix(crc, 16).map_err(|_| damaged(format!("crc {crc:?}")))?;
        // Only the canonical spelling is accepted, so a flipped bit that
        // still parses (case of a hex digit, a leading zero) is caught too.
        let canonical = format!("{CATALOG_MAGIC} {format} {len_bytes} {crc:08x}");
        if header != canonical {
            return Err(damaged(format!("header {header:?} is not canonical")));
        }
        let body = &bytes[header_end + 1..];
        if body.len() != len_bytes {
            return Err(damaged(format!(
                "body has {} bytes, header says {len_bytes} (truncated or appended to)",
                body.len()
            )));
        }
        let actual = crc32c::crc32c(body);
        if actual != crc {
            return Err(damaged(format!("crc32c {actual:08x} does not match header {crc:08x}")));
        }
        let body: CatalogBody = serde_json::from_slice(body)
            .map_err(|error| damaged(format!("body is not a catalog: {error}")))?;
        let catalog = Catalog::from_body(body, path)?;
        // Replaying onto the shard count it was written with checks every
        // queue the same way a live create is checked.
        catalog.replay_onto(catalog.shard_count, path)?;
        Ok(catalog)
    }

    fn from_body(body: CatalogBody, path: &Path) -> Result<Catalog, CatalogError> {
        let invalid = |reason: String| CatalogError::Invalid { path: path.to_owned(), reason };
        if body.shard_count == 0 {
            return Err(invalid("shard_count is 0".to_owned()));
        }
        if body.placement_cursor >= body.shard_count {
            return Err(invalid(format!(
                "placement_cursor {} is not below shard_count {}",
                body.placement_cursor, body.shard_count
            )));
        }
        if body.next_queue_id < FIRST_QUEUE_ID.0 {
            return Err(invalid("next_queue_id is 0".to_owned()));
        }
        if body.queues.len() > QUEUES_MAX {
            return Err(invalid(format!("{} queues, over {QUEUES_MAX}", body.queues.len())));
        }
        let mut queues = Vec::with_capacity(body.queues.len());
        let mut previous_created_at = 0;
        for record in body.queues {
            let name = QueueName::new(&record.name).map_err(|error| invalid(error.to_string()))?;
            if !(FIRST_QUEUE_ID.0..body.next_queue_id).contains(&record.id) {
                return Err(invalid(format!(
                    "queue {name} has id {}, outside {}..{}",
                    record.id, FIRST_QUEUE_ID.0, body.next_queue_id
                )));
            }
            if record.created_at <= previous_created_at || record.created_at > body.version {
                return Err(invalid(format!(
                    "queue {name} created at version {} is out of order (previous {}, table {})",
                    record.created_at, previous_created_at, body.version
                )));
            }
            previous_created_at = record.created_at;
            if record.shards.is_empty() || record.shards.len() > PARTITIONS_PER_QUEUE_MAX as usize {
                return Err(invalid(format!(
                    "queue {name} has {} partitions",
                    record.shards.len()
                )));
            }
            let keys = match record.keys {
                None => KeyPlacement::fresh(record.shards.len() as u32),
                Some(keys) => KeyPlacement {
                    version: keys.version,
                    held_from: keys.held_from,
                    draining: keys.draining.into_iter().map(PartitionId).collect(),
                },
            };
            let subscriptions = match record.subscriptions {
                None => Subscriptions::default(),
                Some(record) => {
                    let mut named = std::collections::BTreeMap::new();
                    for sub in record.named {
                        let start = SubscriptionStart::parse(&sub.start).ok_or_else(|| {
                            invalid(format!("queue {name}: subscription start {:?}", sub.start))
                        })?;
                        let entry = SubscriptionEntry { id: SubscriptionId(sub.id), start };
                        if named.insert(sub.name.clone(), entry).is_some() {
                            return Err(invalid(format!(
                                "queue {name}: subscription {} twice",
                                sub.name
                            )));
                        }
                    }
                    Subscriptions { named, next_id: record.next_id }
                }
            };
            queues.push(CatalogQueue {
                subscriptions,
                name,
                id: QueueId(record.id),
                created_at: AssignmentVersion(record.created_at),
                shards: record.shards.into_iter().map(ShardId).collect(),
                config: Arc::new(record.config),
                keys,
                replicas: record
                    .replicas
                    .into_iter()
                    .map(|record| {
                        let set = ReplicaSet { nodes: record.nodes, settled: record.settled };
                        (PartitionId(record.partition), set)
                    })
                    .collect(),
            });
        }
        Ok(Catalog {
            version: AssignmentVersion(body.version),
            shard_count: body.shard_count,
            placement_cursor: body.placement_cursor,
            next_queue_id: QueueId(body.next_queue_id),
            queues,
        })
    }

    /// The start-up replay for a broker running `shard_count` shards: one
    /// create per queue, in creation order, with versions ending at the
    /// catalog's version (so versions never go backwards across a restart)
    /// and placement exactly as recorded.
    ///
    /// # Errors
    /// [`CatalogError::PlacementBeyondShards`] if a partition sits on a
    /// shard that no longer exists; `Invalid` if the catalog contradicts
    /// itself.
    pub fn replay(&self, shard_count: u16, path: &Path) -> Result<Replay, CatalogError> {
        for queue in &self.queues {
            if let Some((partition, &shard)) =
                queue.shards.iter().enumerate().find(|(_, shard)| shard.0 >= shard_count)
            {
                return Err(CatalogError::PlacementBeyondShards {
                    queue: queue.name.clone(),
                    partition: partition as u32,
                    shard,
                    shard_count,
                });
            }
        }
        self.replay_onto(shard_count, path)
    }

    fn replay_onto(&self, shard_count: u16, path: &Path) -> Result<Replay, CatalogError> {
        assert!(shard_count > 0);
        let invalid = |reason: String| CatalogError::Invalid { path: path.to_owned(), reason };
        let queue_count = self.queues.len() as u64;
        // Every live queue was created by its own update.
        let Some(base_version) = self.version.0.checked_sub(queue_count) else {
            return Err(invalid(format!(
                "version {} is below the queue count {queue_count}",
                self.version.0
            )));
        };
        let replayed_partitions: u64 =
            self.queues.iter().map(|queue| queue.shards.len() as u64).sum();
        let count = u64::from(shard_count);
        // Start the cursor so that after the replay it is where it was
        // (modulo a changed shard count): new queues keep rotating.
        let end_cursor = u64::from(self.placement_cursor) % count;
        let start_cursor = (end_cursor + count - replayed_partitions % count) % count;
        let start = AssignmentTable::starting_at(
            shard_count,
            AssignmentVersion(base_version),
            start_cursor as u16,
        );
        let mut table = start.clone();
        let mut updates = Vec::with_capacity(self.queues.len());
        for (index, queue) in self.queues.iter().enumerate() {
            let update = AssignmentUpdate {
                version: AssignmentVersion(base_version + 1 + index as u64),
                change: AssignmentChange::CreateQueue {
                    queue: queue.name.clone(),
                    queue_id: queue.id,
                    shards: queue.shards.clone(),
                    config: queue.config.clone(),
                    keys: queue.keys.clone(),
                    replicas: queue.replicas.clone(),
                    subscriptions: queue.subscriptions.clone(),
                },
            };
            table.apply(&update).map_err(|error: AssignmentError| {
                invalid(format!("queue {}: {error}", queue.name))
            })?;
            updates.push(update);
        }
        assert!(table.version() == self.version);
        Ok(Replay { start, updates, table, next_queue_id: self.next_queue_id })
    }
}

/// Reads `dir/catalog`, or `None` in a data directory that never had one.
/// Removes a leftover `catalog.tmp` first (a crash before its rename: the
/// old catalog is the truth).
///
/// # Errors
/// `Io`, and every [`Catalog::decode`] error. A damaged file is never
/// treated as absent.
pub fn load(dir: &Path) -> Result<Option<Catalog>, CatalogError> {
    let temp_path = dir.join(CATALOG_TEMP_FILE_NAME);
    match std::fs::remove_file(&temp_path) {
        Ok(()) => {
            tracing::warn!(path = %temp_path.display(), "removed a half-written catalog");
            // Every remove is followed by a sync of its directory.
            File::open(dir).and_then(|dir_file| dir_file.sync_all()).map_err(|source| {
                CatalogError::Io { op: "sync directory", path: dir.to_path_buf(), source }
            })?;
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(CatalogError::Io { op: "remove leftover", path: temp_path, source })
        }
    }
    let path = dir.join(CATALOG_FILE_NAME);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CatalogError::Io { op: "open", path, source }),
    };
    let limit = (CATALOG_BODY_BYTES_MAX + CATALOG_HEADER_BYTES_MAX) as u64;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(io_error("read", &path))?;
    if bytes.len() as u64 > limit {
        return Err(CatalogError::Damaged { path, reason: format!("file is over {limit} bytes") });
    }
    Catalog::decode(&bytes, &path).map(Some)
}

/// Atomically replaces `dir/catalog` with `catalog` (see the module doc).
///
/// # Errors
/// `TooLarge`/`Io` before the rename: nothing changed on disk (the temp file
/// is removed). [`CatalogError::DirectorySync`] after it: the outcome is
/// unknown ([`CatalogError::outcome_unknown`]).
pub fn store(dir: &Path, catalog: &Catalog) -> Result<(), CatalogError> {
    let bytes = catalog.encode()?;
    let temp_path = dir.join(CATALOG_TEMP_FILE_NAME);
    let path = dir.join(CATALOG_FILE_NAME);
    let written = write_temp(&temp_path, &bytes)
        .and_then(|()| std::fs::rename(&temp_path, &path).map_err(io_error("rename", &path)));
    if let Err(error) = written {
        // Best effort: load() removes it anyway.
        let _ = std::fs::remove_file(&temp_path);
        return Err(error);
    }
    File::open(dir)
        .and_then(|dir_file| dir_file.sync_all())
        .map_err(|source| CatalogError::DirectorySync { path: path.clone(), source })
}

fn write_temp(temp_path: &Path, bytes: &[u8]) -> Result<(), CatalogError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(temp_path)
        .map_err(io_error("create", temp_path))?;
    file.write_all(bytes).map_err(io_error("write", temp_path))?;
    file.sync_data().map_err(io_error("fdatasync", temp_path))
}

#[cfg(test)]
mod tests;
