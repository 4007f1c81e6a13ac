//! What the bench binary's end-to-end tests share: the binary under test and
//! the `spoold` it starts.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `spool-bench` binary under test.
pub const BENCH: &str = env!("CARGO_BIN_EXE_spool-bench");

/// Environment variable naming a prebuilt `spoold` (`scripts/test.sh` sets
/// it to the binary it built before the suite).
const SPOOLD_BIN_ENV: &str = "SPOOL_E2E_SPOOLD";

/// The `spoold` under test: the prebuilt one named by [`SPOOLD_BIN_ENV`], or
/// the one of the same profile next to the bench binary, built if missing.
///
/// The prebuilt binary comes first: `cargo build -p spool-broker` alone
/// unifies dependency features differently from the workspace build, so a
/// nested build from inside a test recompiled half the dependency tree (for
/// minutes under the suite's load, past the per-test timeout) and replaced
/// the `spoold` other tests were starting.
pub fn spoold() -> PathBuf {
    if let Some(path) = std::env::var_os(SPOOLD_BIN_ENV) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "{SPOOLD_BIN_ENV} names no file: {}", path.display());
        return path;
    }
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
