//! [`SimStorage`]: an in-memory disk for deterministic crash tests.
//!
//! Each file keeps two images: `written` (what reads see) and `durable` (what
//! survives a crash), plus the list of writes since the last `fdatasync`.
//! Names work the same way: creates, renames and removes change the live
//! namespace at once and the durable one only at `sync_dir` of the parent.
//! [`SimStorage::crash_image`] builds the disk a crash at this instant could
//! leave: durable bytes plus all, none, a byte prefix, or a random subset of
//! the unsynced writes, torn at page, sector and sub-sector granularity.
//!
//! Every operation first yields once (so concurrent tasks interleave, as they
//! would around real I/O), then takes effect atomically and is counted. A
//! test can make the Nth operation of a kind fail, and can install a hook that
//! runs after every mutating operation — the crash-point explorer. Nothing
//! here reads a clock or an OS random source: runs repeat exactly.
//!
//! Directories follow the same rule as files: a directory created by
//! `create_dir_all` survives a crash only once its parent was synced
//! (`sync_dir`) after the creation; a crash image drops every directory
//! whose name is not durable, and with it everything below. The disk records
//! each `sync_dir` ([`SimStorage::synced_dirs`]) and which directories have
//! name changes no sync has made durable yet ([`SimStorage::dirty_dirs`]),
//! so a test can assert the seam's rule: every create, rename and remove is
//! followed by a sync of its parent.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::{assert_page_aligned, IoBuf, IoError, IoOp, Storage, StorageFile};
use crate::limits::{PAGE_BYTES, SECTOR_BYTES};

/// Which unsynced writes a crash image keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Only what was synced.
    DurableOnly,
    /// Every completed write (as if the crash came right after a sync).
    AllWritten,
    /// The first `bytes` of the unsynced writes, in issue order: a write torn
    /// at an arbitrary byte, so sectors are not assumed atomic.
    Prefix { bytes: u64 },
    /// Each unsynced page independently: new, old, or mixed per sector with a
    /// torn sector (byte prefix); seeded.
    Torn { seed: u64 },
    /// Power loss: each unsynced sector ([`SECTOR_BYTES`]) of every unsynced
    /// write independently reaches the disk or does not, whole (the device
    /// writes sectors atomically but in no particular order, and a later
    /// write's sector may land while an earlier one's does not); seeded.
    PowerLoss { seed: u64 },
}

/// Operation kinds the simulator counts and can fail.
pub type SimOp = IoOp;

const OP_KINDS: usize = 10;

fn op_index(op: IoOp) -> usize {
    match op {
        IoOp::Open => 0,
        IoOp::Write => 1,
        IoOp::Read => 2,
        IoOp::Sync => 3,
        IoOp::Len => 4,
        IoOp::Remove => 5,
        IoOp::Rename => 6,
        IoOp::ListDir => 7,
        IoOp::CreateDir => 8,
        IoOp::SyncDir => 9,
    }
}

fn is_mutating(op: IoOp) -> bool {
    matches!(
        op,
        IoOp::Open | IoOp::Write | IoOp::Sync | IoOp::Remove | IoOp::Rename | IoOp::SyncDir
    )
}

#[derive(Clone, Default)]
struct FileData {
    written: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last sync, in issue order: (position, bytes).
    unsynced: Vec<(u64, Vec<u8>)>,
}

type Hook = Box<dyn FnMut(&SimStorage, IoOp, u64)>;

/// Which operation a [`SimStorage::hold`] stops: (kind, path, position).
type HoldMatch = Box<dyn Fn(IoOp, &Path, Option<u64>) -> bool>;

#[derive(Default)]
struct SimState {
    files: Vec<FileData>,
    names: BTreeMap<PathBuf, usize>,
    durable_names: BTreeMap<PathBuf, usize>,
    dirs: BTreeSet<PathBuf>,
    /// Directories whose own name is durable in their parent.
    durable_dirs: BTreeSet<PathBuf>,
    /// Directories with creates, renames or removes (of files or
    /// directories) since their last `sync_dir`.
    dirty_dirs: BTreeSet<PathBuf>,
    /// Every `sync_dir`, in order.
    synced_dirs: Vec<PathBuf>,
    op_count: u64,
    counts: [u64; OP_KINDS],
    /// Absolute per-kind counts at which an operation fails.
    /// (operation, its count, fails as a full disk).
    faults: Vec<(IoOp, u64, bool)>,
    hook: Option<Hook>,
    /// An operation to hold before it takes effect ([`SimStorage::hold`]).
    hold: Option<Hold>,
}

/// Which operation [`SimStorage::hold`] stops, and its gate.
struct Hold {
    matches: HoldMatch,
    gate: HoldGate,
    taken: bool,
}

/// The gate of a held operation: whether one was caught, and releasing it.
/// Cloning shares the gate.
#[derive(Clone, Default)]
pub struct HoldGate {
    reached: Rc<Cell<bool>>,
    released: Rc<Cell<bool>>,
}

impl HoldGate {
    /// Whether the held operation has been issued (and is waiting).
    pub fn reached(&self) -> bool {
        self.reached.get()
    }

    /// Lets the held operation take effect at its next poll.
    pub fn release(&self) {
        self.released.set(true);
    }
}

/// The simulated disk. Cloning shares the same disk.
#[derive(Clone, Default)]
pub struct SimStorage {
    state: Rc<RefCell<SimState>>,
    /// Bytes allocated by `alloc_buf` and not yet dropped (see
    /// [`SimStorage::live_buf_bytes`]).
    live_buf_bytes: Rc<Cell<u64>>,
}

/// One open simulated file (a handle to an inode: renames keep it valid).
pub struct SimFile {
    id: usize,
    path: PathBuf,
    storage: SimStorage,
}

/// A plain heap buffer; alignment is asserted on positions and lengths.
/// Counts its allocation in its disk's live-buffer bytes until dropped; a
/// trim shortens it but keeps the allocation, as a DMA buffer does.
pub struct SimBuf {
    bytes: Vec<u8>,
    /// Held for its `Drop`, which gives the bytes back to the count.
    _live: Option<LiveBuf>,
}

/// The share of [`SimStorage::live_buf_bytes`] one buffer holds.
struct LiveBuf {
    counter: Rc<Cell<u64>>,
    alloc_bytes: u64,
}

impl Drop for LiveBuf {
    fn drop(&mut self) {
        self.counter.set(self.counter.get() - self.alloc_bytes);
    }
}

impl SimBuf {
    /// A buffer outside any disk's accounting (for tests of the simulator).
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self { bytes, _live: None }
    }
}

impl AsRef<[u8]> for SimBuf {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsMut<[u8]> for SimBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl IoBuf for SimBuf {
    fn trim(&mut self, len_bytes: usize) {
        assert!(len_bytes <= self.bytes.len());
        self.bytes.truncate(len_bytes);
    }
}

/// splitmix64: a tiny deterministic generator, so crash images depend only
/// on the seed (and tests' workloads on theirs).
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next value (an endless stream, not an iterator's `Option`).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value below `bound` (> 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

fn put(image: &mut Vec<u8>, pos: usize, bytes: &[u8]) {
    if image.len() < pos + bytes.len() {
        image.resize(pos + bytes.len(), 0);
    }
    image[pos..pos + bytes.len()].copy_from_slice(bytes);
}

fn file_image(data: &FileData, mode: CrashMode) -> Vec<u8> {
    match mode {
        CrashMode::DurableOnly => data.durable.clone(),
        CrashMode::AllWritten => data.written.clone(),
        CrashMode::Prefix { bytes } => {
            let mut image = data.durable.clone();
            let mut budget = usize::try_from(bytes).unwrap_or(usize::MAX);
            for (pos, write) in &data.unsynced {
                let take = budget.min(write.len());
                put(&mut image, *pos as usize, &write[..take]);
                budget -= take;
                if budget == 0 {
                    break;
                }
            }
            image
        }
        CrashMode::Torn { seed } => {
            let mut rng = SplitMix(seed);
            let mut image = data.durable.clone();
            let page = PAGE_BYTES as usize;
            let sector = SECTOR_BYTES as usize;
            for (pos, write) in &data.unsynced {
                for (page_index, page_bytes) in write.chunks(page).enumerate() {
                    let page_pos = *pos as usize + page_index * page;
                    match rng.below(100) {
                        0..45 => put(&mut image, page_pos, page_bytes),
                        45..80 => {}
                        _ => {
                            for (sector_index, sector_bytes) in
                                page_bytes.chunks(sector).enumerate()
                            {
                                let sector_pos = page_pos + sector_index * sector;
                                match rng.below(3) {
                                    0 => put(&mut image, sector_pos, sector_bytes),
                                    1 => {}
                                    _ => {
                                        let cut = rng.below(sector as u64) as usize;
                                        put(&mut image, sector_pos, &sector_bytes[..cut]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            image
        }
        CrashMode::PowerLoss { seed } => {
            let mut rng = SplitMix(seed);
            let mut image = data.durable.clone();
            let sector = SECTOR_BYTES as usize;
            for (pos, write) in &data.unsynced {
                for (index, sector_bytes) in write.chunks(sector).enumerate() {
                    if rng.below(2) == 0 {
                        put(&mut image, *pos as usize + index * sector, sector_bytes);
                    }
                }
            }
            image
        }
    }
}

/// Marks the parent of `path` as having an unsynced name change.
fn touch_parent(state: &mut SimState, path: &Path) {
    if let Some(parent) = path.parent() {
        state.dirty_dirs.insert(parent.to_path_buf());
    }
}

/// Whether `dir` would survive a crash: the root, or a directory whose name
/// is durable in a parent that would survive.
fn dir_survives(state: &SimState, dir: &Path) -> bool {
    match dir.parent() {
        None => true,
        Some(parent) if parent.as_os_str().is_empty() => true,
        Some(parent) => state.durable_dirs.contains(dir) && dir_survives(state, parent),
    }
}

impl SimStorage {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes of write buffers this disk's files allocated that are still
    /// alive, at their allocated size (a trimmed buffer counts in full): the
    /// memory a log holds in gathers, in-flight commits and its tail cache.
    pub fn live_buf_bytes(&self) -> u64 {
        self.live_buf_bytes.get()
    }

    /// Mutating and non-mutating operations performed so far.
    pub fn op_count(&self) -> u64 {
        self.state.borrow().op_count
    }

    /// Operations of one kind performed so far.
    pub fn count(&self, op: IoOp) -> u64 {
        self.state.borrow().counts[op_index(op)]
    }

    /// Makes the `nth` next operation of kind `op` fail (1 = the next one),
    /// with no effect on the disk.
    pub fn inject_failure(&self, op: IoOp, nth: u64) {
        assert!(nth >= 1);
        let mut state = self.state.borrow_mut();
        let at = state.counts[op_index(op)] + nth;
        state.faults.push((op, at, false));
    }

    /// As [`SimStorage::inject_failure`], failing with ENOSPC (a full disk).
    pub fn inject_disk_full(&self, op: IoOp, nth: u64) {
        assert!(nth >= 1);
        let mut state = self.state.borrow_mut();
        let at = state.counts[op_index(op)] + nth;
        state.faults.push((op, at, true));
    }

    /// Runs `hook(disk, op, op_count)` after every mutating operation (open,
    /// write, sync, remove, rename, sync_dir). The hook must not perform
    /// operations on this disk; it may build crash images.
    pub fn set_hook(&self, hook: impl FnMut(&SimStorage, IoOp, u64) + 'static) {
        self.state.borrow_mut().hook = Some(Box::new(hook));
    }

    pub fn clear_hook(&self) {
        self.state.borrow_mut().hook = None;
    }

    /// Holds the first operation for which `matches(op, path, pos)` is true
    /// before it takes effect, until the returned gate is released: a slow
    /// write or sync, while everything else goes on (the held future keeps
    /// yielding). One hold at a time.
    pub fn hold(&self, matches: impl Fn(IoOp, &Path, Option<u64>) -> bool + 'static) -> HoldGate {
        let gate = HoldGate::default();
        let mut state = self.state.borrow_mut();
        assert!(state.hold.as_ref().is_none_or(|hold| hold.taken), "one hold at a time");
        state.hold = Some(Hold { matches: Box::new(matches), gate: gate.clone(), taken: false });
        gate
    }

    /// The disk a crash right now could leave, as a fresh simulator: durably
    /// named files with durable bytes plus the unsynced writes `mode` keeps.
    pub fn crash_image(&self, mode: CrashMode) -> SimStorage {
        let state = self.state.borrow();
        let dirs: BTreeSet<PathBuf> =
            state.dirs.iter().filter(|dir| dir_survives(&state, dir)).cloned().collect();
        let mut image =
            SimState { durable_dirs: dirs.clone(), dirs: dirs.clone(), ..SimState::default() };
        for (path, id) in &state.durable_names {
            if !path.parent().is_some_and(|parent| dirs.contains(parent)) {
                continue;
            }
            let bytes = file_image(&state.files[*id], mode);
            image.files.push(FileData { written: bytes.clone(), durable: bytes, unsynced: vec![] });
            let new_id = image.files.len() - 1;
            image.names.insert(path.clone(), new_id);
            image.durable_names.insert(path.clone(), new_id);
        }
        SimStorage { state: Rc::new(RefCell::new(image)), live_buf_bytes: Rc::default() }
    }

    /// The disk a killed process leaves while the machine keeps running
    /// (SIGKILL, no power loss): every name and written byte is still there
    /// for the next process to read, but what was not synced is still not
    /// durable — a crash image of the returned disk drops it unless the next
    /// process syncs it. Counts, faults and the hook are not carried over.
    pub fn process_crash_image(&self) -> SimStorage {
        let state = self.state.borrow();
        let image = SimState {
            files: state.files.clone(),
            names: state.names.clone(),
            durable_names: state.durable_names.clone(),
            dirs: state.dirs.clone(),
            durable_dirs: state.durable_dirs.clone(),
            dirty_dirs: state.dirty_dirs.clone(),
            ..SimState::default()
        };
        SimStorage { state: Rc::new(RefCell::new(image)), live_buf_bytes: Rc::default() }
    }

    /// Every directory synced so far, in order (one entry per `sync_dir`).
    pub fn synced_dirs(&self) -> Vec<PathBuf> {
        self.state.borrow().synced_dirs.clone()
    }

    /// Directories with a create, rename or remove in them (of a file or a
    /// directory) that no `sync_dir` has made durable yet, sorted.
    pub fn dirty_dirs(&self) -> Vec<PathBuf> {
        self.state.borrow().dirty_dirs.iter().cloned().collect()
    }

    /// Total unsynced bytes across files (bounds `CrashMode::Prefix` sweeps).
    pub fn unsynced_bytes(&self) -> u64 {
        let state = self.state.borrow();
        let mut live: BTreeSet<usize> = state.names.values().copied().collect();
        live.extend(state.durable_names.values().copied());
        live.iter()
            .map(|id| state.files[*id].unsynced.iter().map(|(_, w)| w.len() as u64).sum::<u64>())
            .sum()
    }

    /// Live contents of a file (what reads see), for test inspection.
    pub fn file_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state.borrow();
        state.names.get(path).map(|id| state.files[*id].written.clone())
    }

    /// Overwrites a file's bytes both live and durably (media corruption or a
    /// test's hand-made damage), bypassing counting and hooks.
    pub fn set_file_bytes(&self, path: &Path, bytes: Vec<u8>) {
        let mut state = self.state.borrow_mut();
        let id = *state.names.get(path).expect("set_file_bytes on a missing file");
        state.files[id] = FileData { written: bytes.clone(), durable: bytes, unsynced: vec![] };
    }

    /// Live file names under `dir`, sorted.
    pub fn names_in(&self, dir: &Path) -> Vec<String> {
        let state = self.state.borrow();
        state
            .names
            .keys()
            .filter(|path| path.parent() == Some(dir))
            .filter_map(|path| path.file_name().and_then(|n| n.to_str()).map(str::to_owned))
            .collect()
    }

    /// Counts the operation, applies an injected fault, and otherwise runs
    /// `effect`; then calls the hook for mutating operations.
    async fn perform<T>(
        &self,
        op: IoOp,
        path: &Path,
        pos: Option<u64>,
        effect: impl FnOnce(&mut SimState) -> Result<T, std::io::Error>,
    ) -> Result<T, IoError> {
        let held = {
            let mut state = self.state.borrow_mut();
            match state.hold.as_mut() {
                Some(hold) if !hold.taken && (hold.matches)(op, path, pos) => {
                    hold.taken = true;
                    hold.gate.reached.set(true);
                    Some(hold.gate.clone())
                }
                _ => None,
            }
        };
        if let Some(gate) = held {
            while !gate.released.get() {
                futures_lite::future::yield_now().await;
            }
        }
        futures_lite::future::yield_now().await;
        let (result, count) = {
            let mut state = self.state.borrow_mut();
            state.op_count += 1;
            state.counts[op_index(op)] += 1;
            let kind_count = state.counts[op_index(op)];
            let injected = state
                .faults
                .iter()
                .find(|(kind, at, _)| *kind == op && *at == kind_count)
                .map(|(_, _, full)| *full);
            let result = if let Some(full) = injected {
                Err(if full {
                    std::io::Error::from_raw_os_error(libc::ENOSPC)
                } else {
                    std::io::Error::other(format!("injected {op} failure"))
                })
            } else {
                effect(&mut state)
            };
            (result, state.op_count)
        };
        if result.is_ok() && is_mutating(op) {
            let hook = self.state.borrow_mut().hook.take();
            if let Some(mut hook) = hook {
                hook(self, op, count);
                let mut state = self.state.borrow_mut();
                if state.hook.is_none() {
                    state.hook = Some(hook);
                }
            }
        }
        result.map_err(|source| IoError::new(op, path, pos, source))
    }
}

fn not_found(path: &Path) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::NotFound, format!("{} not found", path.display()))
}

fn parent_exists(state: &SimState, path: &Path) -> Result<(), std::io::Error> {
    match path.parent() {
        Some(parent) if !state.dirs.contains(parent) => Err(not_found(parent)),
        _ => Ok(()),
    }
}

impl Storage for SimStorage {
    type File = SimFile;

    async fn open(&self, path: &Path) -> Result<SimFile, IoError> {
        let id = self
            .perform(IoOp::Open, path, None, |state| {
                parent_exists(state, path)?;
                if let Some(id) = state.names.get(path) {
                    return Ok(*id);
                }
                state.files.push(FileData::default());
                let id = state.files.len() - 1;
                state.names.insert(path.to_path_buf(), id);
                touch_parent(state, path);
                Ok(id)
            })
            .await?;
        Ok(SimFile { id, path: path.to_path_buf(), storage: self.clone() })
    }

    async fn remove(&self, path: &Path) -> Result<(), IoError> {
        self.perform(IoOp::Remove, path, None, |state| {
            state.names.remove(path).ok_or_else(|| not_found(path))?;
            touch_parent(state, path);
            Ok(())
        })
        .await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<(), IoError> {
        self.perform(IoOp::Rename, from, None, |state| {
            parent_exists(state, to)?;
            let id = state.names.remove(from).ok_or_else(|| not_found(from))?;
            state.names.insert(to.to_path_buf(), id);
            touch_parent(state, from);
            touch_parent(state, to);
            Ok(())
        })
        .await
    }

    async fn list_dir(&self, dir: &Path) -> Result<Vec<String>, IoError> {
        let names = self.names_in(dir);
        self.perform(IoOp::ListDir, dir, None, |state| {
            if state.dirs.contains(dir) {
                Ok(names)
            } else {
                Err(not_found(dir))
            }
        })
        .await
    }

    async fn create_dir_all(&self, dir: &Path) -> Result<Vec<PathBuf>, IoError> {
        self.perform(IoOp::CreateDir, dir, None, |state| {
            let mut created = Vec::new();
            for ancestor in dir.ancestors() {
                if ancestor.as_os_str().is_empty() || state.dirs.contains(ancestor) {
                    continue;
                }
                state.dirs.insert(ancestor.to_path_buf());
                if ancestor.parent().is_none() {
                    // The root exists on every disk.
                    state.durable_dirs.insert(ancestor.to_path_buf());
                } else {
                    touch_parent(state, ancestor);
                }
                created.push(ancestor.to_path_buf());
            }
            created.reverse();
            Ok(created)
        })
        .await
    }

    async fn sync_dir(&self, dir: &Path) -> Result<(), IoError> {
        self.perform(IoOp::SyncDir, dir, None, |state| {
            if !state.dirs.contains(dir) {
                return Err(not_found(dir));
            }
            state.durable_names.retain(|path, _| path.parent() != Some(dir));
            let live: Vec<(PathBuf, usize)> = state
                .names
                .iter()
                .filter(|(path, _)| path.parent() == Some(dir))
                .map(|(path, id)| (path.clone(), *id))
                .collect();
            state.durable_names.extend(live);
            let children: Vec<PathBuf> =
                state.dirs.iter().filter(|path| path.parent() == Some(dir)).cloned().collect();
            state.durable_dirs.retain(|path| path.parent() != Some(dir));
            state.durable_dirs.extend(children);
            state.dirty_dirs.remove(dir);
            state.synced_dirs.push(dir.to_path_buf());
            Ok(())
        })
        .await
    }
}

impl StorageFile for SimFile {
    type Buf = SimBuf;
    type ReadBuf = Vec<u8>;

    fn alloc_buf(&self, len_bytes: usize) -> SimBuf {
        assert_page_aligned(0, len_bytes);
        // Deliberately not zeroed: the log must fill every byte it writes.
        let counter = self.storage.live_buf_bytes.clone();
        counter.set(counter.get() + len_bytes as u64);
        SimBuf {
            bytes: vec![0xA5; len_bytes],
            _live: Some(LiveBuf { counter, alloc_bytes: len_bytes as u64 }),
        }
    }

    async fn write_at(&self, buf: Rc<SimBuf>, pos: u64) -> Result<(), IoError> {
        let bytes = buf.as_ref().as_ref();
        assert_page_aligned(pos, bytes.len());
        let id = self.id;
        self.storage
            .perform(IoOp::Write, &self.path, Some(pos), |state| {
                let file = &mut state.files[id];
                put(&mut file.written, pos as usize, bytes);
                file.unsynced.push((pos, bytes.to_vec()));
                Ok(())
            })
            .await
    }

    async fn read_at(&self, pos: u64, len_bytes: usize) -> Result<Vec<u8>, IoError> {
        assert!(pos.is_multiple_of(PAGE_BYTES));
        let id = self.id;
        self.storage
            .perform(IoOp::Read, &self.path, Some(pos), |state| {
                let written = &state.files[id].written;
                let start = (pos as usize).min(written.len());
                let end = (pos as usize).saturating_add(len_bytes).min(written.len());
                Ok(written[start..end].to_vec())
            })
            .await
    }

    async fn fdatasync(&self) -> Result<(), IoError> {
        let id = self.id;
        self.storage
            .perform(IoOp::Sync, &self.path, None, |state| {
                let file = &mut state.files[id];
                file.durable.clone_from(&file.written);
                file.unsynced.clear();
                Ok(())
            })
            .await
    }

    async fn len_bytes(&self) -> Result<u64, IoError> {
        let id = self.id;
        self.storage
            .perform(IoOp::Len, &self.path, None, |state| Ok(state.files[id].written.len() as u64))
            .await
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::block_on;

    fn page(byte: u8) -> Rc<SimBuf> {
        Rc::new(SimBuf::from_vec(vec![byte; PAGE_BYTES as usize]))
    }

    #[test]
    fn unsynced_writes_and_names_vanish_in_a_durable_only_crash() {
        // Goal: written-but-unsynced bytes and unsynced names do not survive; synced ones do.
        block_on(async {
            let disk = SimStorage::new();
            let dir = Path::new("/d");
            crate::io::create_dir_durable(&disk, dir).await.unwrap();
            let file = disk.open(&dir.join("a")).await.unwrap();
            file.write_at(page(1), 0).await.unwrap();
            let before_sync = disk.crash_image(CrashMode::AllWritten);
            assert!(before_sync.file_bytes(&dir.join("a")).is_none(), "name not yet durable");
            disk.sync_dir(dir).await.unwrap();
            file.fdatasync().await.unwrap();
            file.write_at(page(2), PAGE_BYTES).await.unwrap();
            let crashed = disk.crash_image(CrashMode::DurableOnly);
            assert_eq!(crashed.file_bytes(&dir.join("a")).unwrap(), vec![1u8; 4096]);
            let full = disk.crash_image(CrashMode::AllWritten);
            assert_eq!(full.file_bytes(&dir.join("a")).unwrap().len(), 8192);
            let prefix = disk.crash_image(CrashMode::Prefix { bytes: 100 });
            let bytes = prefix.file_bytes(&dir.join("a")).unwrap();
            assert_eq!(bytes.len(), 4096 + 100);
            assert_eq!(bytes[4096 + 99], 2);
        });
    }

    #[test]
    fn injected_failure_hits_exactly_the_nth_operation() {
        // Goal: fault injection is exact and leaves the disk unchanged.
        block_on(async {
            let disk = SimStorage::new();
            crate::io::create_dir_durable(&disk, Path::new("/d")).await.unwrap();
            let file = disk.open(Path::new("/d/a")).await.unwrap();
            disk.inject_failure(IoOp::Write, 2);
            file.write_at(page(1), 0).await.unwrap();
            let error = file.write_at(page(2), 0).await.unwrap_err();
            assert_eq!(error.op, IoOp::Write);
            assert_eq!(disk.file_bytes(Path::new("/d/a")).unwrap()[0], 1);
            file.write_at(page(3), 0).await.unwrap();
            assert_eq!(disk.count(IoOp::Write), 3);
        });
    }

    #[test]
    fn power_loss_images_keep_or_drop_whole_sectors_at_random() {
        // Goal: a power-loss image keeps each unsynced sector whole or not
        // at all, independently (later sectors may land while earlier ones do
        // not), repeatably for a seed, and never touches synced bytes.
        block_on(async {
            let disk = SimStorage::new();
            let path = Path::new("/d/a");
            crate::io::create_dir_durable(&disk, Path::new("/d")).await.unwrap();
            let file = disk.open(path).await.unwrap();
            disk.sync_dir(Path::new("/d")).await.unwrap();
            file.write_at(Rc::new(SimBuf::from_vec(vec![1u8; 8 * 4096])), 0).await.unwrap();
            file.fdatasync().await.unwrap();
            file.write_at(Rc::new(SimBuf::from_vec(vec![2u8; 8 * 4096])), 0).await.unwrap();
            let image =
                |seed| disk.crash_image(CrashMode::PowerLoss { seed }).file_bytes(path).unwrap();
            assert_eq!(image(5), image(5));
            let one = image(5);
            let sectors: Vec<u8> = one
                .chunks(SECTOR_BYTES as usize)
                .map(|sector| {
                    assert!(sector.iter().all(|byte| *byte == sector[0]), "a torn sector");
                    sector[0]
                })
                .collect();
            assert_eq!(sectors.len(), 64);
            assert!(sectors.contains(&1) && sectors.contains(&2), "{sectors:?}");
            // Not a prefix: some new sector follows an old one.
            let first_old = sectors.iter().position(|byte| *byte == 1).unwrap();
            assert!(sectors[first_old..].contains(&2), "{sectors:?}");
        });
    }

    #[test]
    fn directories_are_durable_only_once_their_parent_is_synced() {
        // Goal: a crash image drops a directory (and all below it) whose
        // name no sync of its parent made durable; the disk reports the
        // unsynced directory and every sync.
        block_on(async {
            let disk = SimStorage::new();
            let created = disk.create_dir_all(Path::new("/a/b")).await.unwrap();
            assert_eq!(
                created,
                vec![PathBuf::from("/"), PathBuf::from("/a"), PathBuf::from("/a/b")]
            );
            let file = disk.open(Path::new("/a/b/f")).await.unwrap();
            file.write_at(page(3), 0).await.unwrap();
            file.fdatasync().await.unwrap();
            disk.sync_dir(Path::new("/a/b")).await.unwrap();
            assert_eq!(disk.dirty_dirs(), vec![PathBuf::from("/"), PathBuf::from("/a")]);
            let lost = disk.crash_image(CrashMode::AllWritten);
            assert!(lost.file_bytes(Path::new("/a/b/f")).is_none(), "/a was never named durably");
            disk.sync_dir(Path::new("/")).await.unwrap();
            disk.sync_dir(Path::new("/a")).await.unwrap();
            assert!(disk.dirty_dirs().is_empty());
            let kept = disk.crash_image(CrashMode::DurableOnly);
            assert_eq!(kept.file_bytes(Path::new("/a/b/f")).unwrap(), vec![3u8; 4096]);
            assert_eq!(disk.synced_dirs().len(), 3);
        });
    }

    #[test]
    fn torn_images_are_deterministic_and_mix_old_and_new() {
        // Goal: the same seed gives the same image; torn images differ from both extremes.
        block_on(async {
            let disk = SimStorage::new();
            crate::io::create_dir_durable(&disk, Path::new("/d")).await.unwrap();
            let file = disk.open(Path::new("/d/a")).await.unwrap();
            disk.sync_dir(Path::new("/d")).await.unwrap();
            let big = Rc::new(SimBuf::from_vec(vec![7u8; 64 * 4096]));
            file.write_at(big, 0).await.unwrap();
            let path = Path::new("/d/a");
            let one = disk.crash_image(CrashMode::Torn { seed: 9 }).file_bytes(path).unwrap();
            let two = disk.crash_image(CrashMode::Torn { seed: 9 }).file_bytes(path).unwrap();
            assert_eq!(one, two);
            assert!(one.contains(&7));
            let zeros_or_missing = one.len() < 64 * 4096 || one.contains(&0);
            assert!(zeros_or_missing);
        });
    }
}
