//! The frame the in-process disk scenarios (`log_append`, `recovery`) run
//! in: a fresh directory under the one the user names, one glommio executor
//! pinned to a core, and the directory's removal afterwards unless asked to
//! keep it.
//!
//! What it does not do: create or open anything in the directory (the
//! scenario's `ShardJournal::open` or `Partition::open_journal` creates it,
//! durably) or measure anything.

use std::future::Future;
use std::path::PathBuf;

use glommio::{LocalExecutorBuilder, Placement};

use crate::error::BenchError;

/// Where an in-process scenario runs: its `--dir`, `--core` and `--keep`.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct PinnedRun {
    /// Parent directory; the run uses a fresh subdirectory and removes it afterwards.
    #[arg(long)]
    pub dir: PathBuf,
    /// CPU to pin the shard to.
    #[arg(long, default_value_t = 0)]
    pub core: usize,
    /// Keep the run's directory after the run.
    #[arg(long)]
    pub keep: bool,
}

impl PinnedRun {
    /// The run's directory: `dir/spool-bench-<label>-<pid>`.
    pub fn run_dir(&self, label: &str) -> PathBuf {
        self.dir.join(format!("spool-bench-{label}-{}", std::process::id()))
    }

    /// Runs `scenario` on a new glommio executor pinned to `core`, handing it
    /// [`run_dir`](Self::run_dir) (removed first if an earlier run left it,
    /// and afterwards unless `keep`).
    ///
    /// # Errors
    /// [`BenchError::Executor`], [`BenchError::Dir`], or the scenario's own.
    pub fn run<T, F, Fut>(&self, label: &str, scenario: F) -> Result<T, BenchError>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: Future<Output = Result<T, BenchError>>,
    {
        let dir = self.run_dir(label);
        let io_error = |action, source| BenchError::Dir { action, path: dir.clone(), source };
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|source| io_error("clear", source))?;
        }
        let executor = LocalExecutorBuilder::new(Placement::Fixed(self.core))
            // Registered (fixed) buffers make reads fail on virtio hosts: see broker io/dma.rs.
            .io_memory(0)
            .name("spool-bench")
            .make()
            .map_err(|error| BenchError::Executor(error.to_string()))?;
        let result = executor.run(scenario(dir.clone()));
        if !self.keep && dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|source| io_error("remove", source))?;
        }
        result
    }
}
