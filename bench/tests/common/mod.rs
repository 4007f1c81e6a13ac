//! What the bench binary's end-to-end tests share: the binary under test and
//! the `spoold` it starts.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `spool-bench` binary under test.
pub const BENCH: &str = env!("CARGO_BIN_EXE_spool-bench");

/// The `spoold` of the same profile, next to the bench binary. Cargo does not
/// build a dependency's binaries for this crate's tests, so build it if it is
/// missing (a no-op when it is fresh).
pub fn spoold() -> PathBuf {
    let bench = Path::new(BENCH);
    let path = bench.with_file_name("spoold");
    let profile_dir = bench.parent().unwrap().file_name().unwrap().to_str().unwrap().to_owned();
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "-q", "-p", "spool-broker", "--bin", "spoold"]);
    if profile_dir != "debug" {
        build.args(["--profile", &profile_dir]);
    }
    assert!(build.status().unwrap().success(), "building spoold failed");
    assert!(path.is_file(), "no spoold at {}", path.display());
    path
}
