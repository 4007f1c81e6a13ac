//! Tidy: the source tree keeps the rules ARCHITECTURE.md states as absences.
//!
//! Goal: a change that breaks one of them fails the test suite, not a
//! review. Method: read the workspace's sources, blank out comments and
//! string literals (a doc that *mentions* glommio names nothing), and check
//! each rule over what is left:
//!
//! 1. Only `broker/src/{io,net,server,shard}/` and `broker/src/bin/` name
//!    glommio; the rest of the broker, `wire` and `client` run without it.
//! 2. `broker/src/queue/` never awaits, never reads a clock, does no I/O.
//! 3. `client` depends on `wire`, never on `broker` (manifest and code).
//! 4. A `const` named like a limit (`*_MAX`, `*_MIN`, `*_DEFAULT`, `*_LIMIT`,
//!    `*_BYTES*`, ...) is defined in a `limits.rs`, unless [`LIMIT_ALLOWED`]
//!    names it with its reason. An allowance that matches nothing fails too,
//!    so the list cannot outlive the constants it excuses.
//!
//! 5. The patches `vendor/glommio` carries (`vendor/README.md`) are all
//!    there: each leaves a piece of code a re-vendored upstream would not
//!    have (and, where it replaced one, lacks upstream's), and the source's
//!    `Patched:` markers are exactly the ones [`GLOMMIO_PATCHES`] lists, so
//!    an update that drops a patch, or a new patch left out of the list,
//!    fails here.
//!
//! 6. No library file is over [`FILE_LINES_MAX`] lines before its
//!    `#[cfg(test)] mod` (generated code and `tests/` modules aside), except
//!    those [`FILE_LINES_ALLOWED`] lists, each at most at its ceiling: the
//!    list only shrinks (a listed file that grows past its ceiling fails,
//!    and so does an entry whose file is back under the limit), so files
//!    are cut by responsibility, not allowed to grow.
//!
//! 7. No two files of `broker/src` name each other (`crate::…` or
//!    `super::…` paths in code, test modules aside), and no two of its
//!    folders do, except the circles [`CIRCLES_ALLOWED`] lists, still to be
//!    cut; an entry whose circle is gone fails too, so the list only
//!    shrinks.
//!
//! 8. `broker/src`'s folders keep the layer order [`LAYERS`] (bottom
//!    first, as ARCHITECTURE.md states it): none names a folder above its
//!    own, except the pairs [`LAYERS_ALLOWED`] lists, still to be cut (an
//!    entry that no longer matches fails too).
//!
//! 9. Every reference resolves: a Markdown file named in a doc (`*.md`
//!    outside `vendor/` and `target/`) or in a comment of the workspace's
//!    Rust sources exists in the repository (by its path from the file, from
//!    the root, or as the unique end of a path: `shard-journal.md`); docs
//!    name no directory of one machine ([`MACHINE_PATHS`]) and speak of the
//!    project, not of its tracker (no "issue 12").
//!
//! 10. Every library file opens with a `//!` module doc saying what it owns.
//!
//! Every rule is also run on a small injected example (the `checker_*`
//! tests) so that a rule that matches nothing cannot pass vacuously.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// Directories (relative to the workspace root, `/`-separated) whose files
/// may name glommio: the storage seam, the network edge, the server that
/// spawns tasks, the shard bootstrap, and the daemon binaries.
const GLOMMIO_ALLOWED: &[&str] = &[
    "broker/src/io/",
    "broker/src/net/",
    "broker/src/server/",
    "broker/src/shard/",
    "broker/src/bin/",
];

/// Source trees that rule 1 and rule 4 read.
const LIBRARY_ROOTS: &[&str] = &["broker/src", "wire/src", "client/src"];

/// Every folder of Rust sources whose comments rule 9 reads.
const RUST_ROOTS: &[&str] = &[
    "broker/src",
    "broker/tests",
    "broker/benches",
    "wire/src",
    "wire/tests",
    "client/src",
    "client/tests",
    "tests/src",
    "tests/tests",
    "bench/src",
    "bench/tests",
    "tuning/src",
    "fuzz/fuzz_targets",
];

/// Where the pure state machine lives (rule 2).
const QUEUE_DIR: &str = "broker/src/queue/";

/// The patches of `vendor/glommio`: (file, code it must contain, code it
/// must not contain — upstream's, or "" —, reason in one line). Code is
/// matched with comments and literals blanked, except in `build.rs`, whose
/// upstream command lines were string literals.
const GLOMMIO_PATCHES: &[(&str, &str, &str, &str)] = &[
    (
        "vendor/glommio/src/sys/uring.rs",
        "keep_latency_timer",
        "",
        "the preempt timer is kept across reactor passes while there is work (upstream cancelled and re-armed it every pass: two submissions each)",
    ),
    (
        "vendor/glommio/src/sys/uring.rs",
        "throughput_live",
        "",
        "the throughput timer is armed again only after it fired (upstream: cancelled and re-armed every pass)",
    ),
    (
        "vendor/glommio/src/sys/uring.rs",
        "std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst)",
        "membarrier::",
        "a fence before each park instead of membarrier's IPI to every CPU running the process",
    ),
    (
        "vendor/glommio/src/sys/mod.rs",
        "std::sync::atomic::fence(Ordering::SeqCst)",
        "",
        "the waking side's fence that pairs with the parking side's",
    ),
    (
        "vendor/glommio/build.rs",
        "",
        "submodule",
        "liburing is built from the bundled sources, without `git submodule update`",
    ),
];

/// `Patched:` markers in `vendor/glommio/src` (the build.rs patch has none).
const GLOMMIO_PATCH_MARKERS: usize = 4;

/// Most lines a library file may have before its test module (rule 6).
const FILE_LINES_MAX: usize = 800;

/// Files over [`FILE_LINES_MAX`] that are still to be cut along their
/// responsibilities, with their ceiling: their length on 2026-12-05. Lower a
/// ceiling when a file shrinks; remove the entry when it is under the limit.
const FILE_LINES_ALLOWED: &[(&str, usize)] = &[];

/// Import circles of `broker/src` still to be cut (rule 7): two files, or
/// two top-level folders (a single file at the top counts as a folder), in
/// name order.
const CIRCLES_ALLOWED: &[(&str, &str)] = &[];

/// The layers of `broker/src`, bottom first (rule 8): a folder (or
/// top-level file) may name its own layer and those below, never one above.
/// ARCHITECTURE.md states the same order.
const LAYERS: &[&[&str]] = &[
    &["clock", "fatal", "failpoint"],
    &["queue"],
    &["limits"],
    &["alloc", "auth", "io"],
    &["log"],
    &["replica"],
    &["partition"],
    &["net"],
    &["control"],
    &["shard"],
    &["server"],
    &["admin"],
];

/// Names of a higher layer still to be cut (rule 8): (folder, the folder
/// above it that it names). The list only shrinks.
const LAYERS_ALLOWED: &[(&str, &str)] = &[];

/// Path prefixes of one machine that docs must not name (rule 9): a reader's
/// machine has none of them; docs say `$SCRATCH` or a relative path.
const MACHINE_PATHS: &[&str] = &["/work/", "/home/", "/root/", "/Users/"];

/// Folders whose files rule 9 does not read: not ours, or built.
const REFERENCE_SKIP_DIRS: &[&str] = &["target", "glommio", ".git", "node_modules", "corpus"];

/// Words that must not appear in `queue/` code, with why.
const QUEUE_FORBIDDEN: &[(&str, &str)] = &[
    ("async", "queue/ never awaits"),
    (".await", "queue/ never awaits"),
    ("Instant::now", "queue/ never reads a clock (now is an argument)"),
    ("SystemTime", "queue/ never reads a clock (now is an argument)"),
    ("now_ms(", "queue/ never reads a clock (now is an argument)"),
    ("instant_now", "queue/ never reads a clock (now is an argument)"),
    ("std::fs", "queue/ does no I/O"),
    ("std::net", "queue/ does no I/O"),
    ("File::", "queue/ does no I/O"),
    ("tokio", "queue/ does no I/O"),
    ("glommio", "queue/ does no I/O"),
];

/// Limit-like constants allowed outside a limits file: (path, name, reason).
const LIMIT_ALLOWED: &[(&str, &str, &str)] = &[
    // Bucket bounds of a metric's histogram: what it reports, not a bound.
    ("broker/src/io/stats.rs", "COMMIT_SIZE_BUCKETS_BYTES", "bucket bounds of a metric"),
    // Sizes of a format: part of the layout they describe, not tunable bounds.
    ("broker/src/net/echo.rs", "ECHO_PREFIX_BYTES", "layout of the echo test protocol's frame"),
    ("broker/src/control/data_dir.rs", "SECRET_BYTES", "length of the broker secret's key"),
    ("broker/src/queue/event.rs", "EVENT_BYTES", "layout of an encoded event"),
    ("broker/src/queue/event.rs", "CLAIMED_EVENT_BYTES", "layout of an encoded event"),
    ("broker/src/partition/log.rs", "JOURNAL_CHECKPOINT_PREFIX_BYTES", "layout of the journal layout's checkpoint payload (the control cursor before the snapshot)"),
    ("broker/src/partition/log.rs", "CHECKPOINT_INDEX_BYTES", "layout of the journal layout's checkpoint payload (the entry index after the control cursor)"),
    ("broker/src/queue/snapshot.rs", "FRESH_ENTRY_BYTES", "layout of the snapshot format"),
    ("broker/src/queue/snapshot.rs", "PHASE_BYTES", "layout of the snapshot format"),
    ("broker/src/queue/snapshot.rs", "WARM_ENTRY_BYTES", "layout of the snapshot format"),
    ("broker/src/queue/snapshot.rs", "DEAD_ENTRY_BYTES", "layout of the snapshot format"),
    ("broker/src/queue/snapshot.rs", "DEDUPE_ENTRY_BYTES", "layout of the snapshot format"),
    ("broker/src/queue/snapshot.rs", "DEDUPE_REF_BYTES", "layout of the snapshot format (a dedupe generation reference)"),
    ("broker/src/queue/snapshot.rs", "STORED_RUN_BYTES", "layout of the snapshot format (a stored-counts run)"),
    ("broker/src/queue/snapshot.rs", "STORED_COUNT_BYTES", "layout of the snapshot format (a stored count)"),
    ("broker/src/queue/snapshot.rs", "LOSS_BYTES", "layout of the snapshot format (a loss report)"),
    ("broker/src/queue/snapshot.rs", "LANE_HEAD_BYTES", "layout of the snapshot format (a lane head)"),
    ("broker/src/queue/dedupe.rs", "DEDUPE_RECORD_BYTES", "layout of a dedupe entry in snapshots and generation files"),
    ("broker/src/queue/token.rs", "DELIVERY_TOKEN_BYTES", "layout of the delivery token"),
    ("broker/src/queue/token.rs", "MAC_COVERS_BYTES", "layout of the delivery token"),
    ("broker/src/queue/token.rs", "TOKEN_MAC_BYTES", "layout of the delivery token"),
    ("broker/src/queue/types.rs", "RESERVED_MIN", "start of the broker's own release codes"),
    ("broker/src/log/journal/entry.rs", "ENTRY_HEADER_BYTES", "layout of a journal entry"),
    ("broker/src/log/journal/entry.rs", "V1_HEADER_BYTES", "layout of a journal entry (the v1 header of older journals and of fillers)"),
    ("broker/src/partition/files.rs", "SIDE_HEADER_BYTES", "layout of the side files"),
    // Geometry of an in-memory structure, sized and tested with it.
    ("broker/src/queue/dedupe.rs", "SLOTS_MIN", "geometry of the dedupe index"),
    ("broker/src/queue/dedupe.rs", "SUBTABLE_SLOTS_MAX", "geometry of the dedupe index"),
    ("broker/src/queue/dedupe.rs", "DIRECTORY_DEPTH_MAX", "geometry of the dedupe index"),
    ("broker/src/queue/dedupe.rs", "SPARE_SLOTS_MAX", "geometry of the dedupe index"),
    // Not ours to choose.
    ("broker/src/shard/cpus.rs", "CPU_SET_CAPACITY", "the kernel's cpu_set_t size (libc)"),
    ("broker/src/shard/nofile.rs", "NR_OPEN_DEFAULT", "the kernel's default fs.nr_open (a fact of Linux)"),
    // Test-only code compiled in with the `failpoints` feature alone.
    ("broker/src/failpoint.rs", "DELAY_MS_MAX", "bound of the test-only failpoint syntax"),
    ("broker/src/failpoint.rs", "ENTRIES_MAX", "bound of the test-only failpoint syntax"),
    // Derived from a format: a header and the batch format's largest batch.
    ("broker/src/log/journal/entry.rs", "ENTRY_BYTES_MAX", "layout of a journal entry: its header plus the batch format's largest batch"),
    ("broker/src/log/journal/handles.rs", "HEADER_BYTES", "the handles table's on-disk format (header size), not a limit"),
    ("broker/src/log/journal/handles.rs", "RECORD_BYTES", "the handles table's on-disk format (record size), not a limit"),
];

/// Name endings that mark a constant as a limit.
const LIMIT_SUFFIXES: &[&str] = &[
    "_MAX",
    "_MIN",
    "_DEFAULT",
    "_LIMIT",
    "_LOWER",
    "_UPPER",
    "_CAPACITY",
    "_TIMEOUT",
    "_INTERVAL",
    "_BACKOFF",
];
/// Name parts that mark a constant as a limit wherever they stand.
const LIMIT_INFIXES: &[&str] = &["_BYTES", "_MS_"];

/// One source file: its path relative to the workspace root
/// (`/`-separated) and its text.
struct Source {
    path: String,
    text: String,
}

/// One broken rule.
#[derive(Debug, PartialEq, Eq)]
struct Violation {
    rule: &'static str,
    path: String,
    line: usize,
    detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}:{}: [{}] {}", self.path, self.line, self.rule, self.detail)
    }
}

/// The text with comments and the contents of string and char literals
/// replaced by spaces; line breaks are kept so line numbers stay true.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // Raw string: r"..." or r#"..."#.
            let mut hashes = 0;
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push('"');
            i = j + 1;
            'raw: while i < chars.len() {
                if chars[i] == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#')) {
                    out.push('"');
                    i += 1 + hashes;
                    break 'raw;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() {
                if chars[i] == '\\' {
                    out.push(' ');
                    if let Some(&escaped) = chars.get(i + 1) {
                        out.push(blank(escaped));
                    }
                    i += 2;
                } else if chars[i] == '"' {
                    out.push('"');
                    i += 1;
                    break;
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}', '"'), else a lifetime.
            if next == Some('\\') {
                // Quote, backslash and the escaped character, then up to the
                // closing quote (`\u{..}` is longer).
                out.push_str("'  ");
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push('\'');
                    i += 1;
                }
            } else if chars.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether the character before `index` continues an identifier (so an `r`
/// there is part of a name, not a raw string's prefix).
fn ident_before(chars: &[char], index: usize) -> bool {
    index > 0 && (chars[index - 1].is_alphanumeric() || chars[index - 1] == '_')
}

/// Offsets of `word` in `code` that stand alone as an identifier (or, for a
/// word that starts or ends with punctuation, anywhere).
fn find_word(code: &str, word: &str) -> Vec<usize> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let first_is_ident = word.chars().next().is_some_and(is_ident);
    let last_is_ident = word.chars().last().is_some_and(is_ident);
    code.match_indices(word)
        .filter(|(at, _)| {
            let before = code[..*at].chars().last();
            let after = code[at + word.len()..].chars().next();
            (!first_is_ident || !before.is_some_and(is_ident))
                && (!last_is_ident || !after.is_some_and(is_ident))
        })
        .map(|(at, _)| at)
        .collect()
}

fn line_of(code: &str, offset: usize) -> usize {
    code[..offset].matches('\n').count() + 1
}

/// Rule 1: glommio named outside the directories allowed to.
fn check_glommio(files: &[Source]) -> Vec<Violation> {
    let mut found = Vec::new();
    for file in files {
        if GLOMMIO_ALLOWED.iter().any(|dir| file.path.starts_with(dir)) {
            continue;
        }
        let code = code_only(&file.text);
        if let Some(&at) = find_word(&code, "glommio").first() {
            found.push(Violation {
                rule: "glommio",
                path: file.path.clone(),
                line: line_of(&code, at),
                detail: "names glommio; only io/, net/, server/, shard/ and bin/ may".to_owned(),
            });
        }
    }
    found
}

/// Rule 2: async, a clock read or I/O in the pure state machine.
fn check_queue(files: &[Source]) -> Vec<Violation> {
    let mut found = Vec::new();
    for file in files.iter().filter(|file| file.path.starts_with(QUEUE_DIR)) {
        let code = code_only(&file.text);
        for (word, why) in QUEUE_FORBIDDEN {
            for at in find_word(&code, word) {
                found.push(Violation {
                    rule: "queue-pure",
                    path: file.path.clone(),
                    line: line_of(&code, at),
                    detail: format!("`{word}`: {why}"),
                });
            }
        }
    }
    found
}

/// Rule 3: the client's manifest or code names the broker.
fn check_client_deps(manifest: &Source, client_files: &[Source]) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut in_dependencies = false;
    for (index, line) in manifest.text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line.contains("dependencies");
            // `[dependencies.spool-broker]` names it in the header itself.
            if in_dependencies && (line.contains("spool-broker") || line.contains("spool_broker")) {
                found.push(Violation {
                    rule: "client-deps",
                    path: manifest.path.clone(),
                    line: index + 1,
                    detail: "client depends on the broker; it may depend on wire only".to_owned(),
                });
            }
            continue;
        }
        let key = line.split(['=', '.', ' ']).next().unwrap_or_default();
        if in_dependencies && (key == "spool-broker" || key == "spool_broker") {
            found.push(Violation {
                rule: "client-deps",
                path: manifest.path.clone(),
                line: index + 1,
                detail: "client depends on the broker; it may depend on wire only".to_owned(),
            });
        }
    }
    for file in client_files {
        let code = code_only(&file.text);
        if let Some(&at) = find_word(&code, "spool_broker").first() {
            found.push(Violation {
                rule: "client-deps",
                path: file.path.clone(),
                line: line_of(&code, at),
                detail: "client code names spool_broker".to_owned(),
            });
        }
    }
    found
}

fn limit_like(name: &str) -> bool {
    LIMIT_SUFFIXES.iter().any(|suffix| name.ends_with(suffix))
        || LIMIT_INFIXES.iter().any(|infix| name.contains(infix))
}

/// The limit-like constants a file defines outside its tests: (line, name).
fn limit_consts(text: &str) -> Vec<(usize, String)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        // A file's unit-test module comes last; its constants are test inputs.
        if line.starts_with("#[cfg(test)]") {
            let item =
                lines[index + 1..].iter().map(|next| next.trim()).find(|next| !next.is_empty());
            if item.is_some_and(|item| item.starts_with("mod ") || item.starts_with("pub mod ")) {
                break;
            }
        }
        let mut words = line.split_whitespace().peekable();
        if words.peek().is_some_and(|word| word.starts_with("pub")) {
            words.next();
        }
        if words.next() != Some("const") {
            continue;
        }
        let Some(name) = words.next() else { continue };
        let name = name.trim_end_matches(':');
        let is_constant =
            name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if is_constant && name != "_" && limit_like(name) {
            found.push((index + 1, name.to_owned()));
        }
    }
    found
}

fn is_limits_file(path: &str) -> bool {
    path == "limits.rs" || path.ends_with("/limits.rs")
}

/// Rule 4: limit-like constants outside a limits file, and allowances that
/// excuse nothing.
fn check_limits(files: &[Source], allowed: &[(&str, &str, &str)]) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut used = vec![false; allowed.len()];
    for file in files {
        // Unit-test modules in their own files are test code.
        if is_limits_file(&file.path) || file.path.contains("/tests/") {
            continue;
        }
        for (line, name) in limit_consts(&file.text) {
            match allowed
                .iter()
                .position(|(path, allowed_name, _)| *path == file.path && *allowed_name == name)
            {
                Some(index) => used[index] = true,
                None => found.push(Violation {
                    rule: "limits",
                    path: file.path.clone(),
                    line,
                    detail: format!(
                        "`{name}` is named like a limit: define it in the crate's limits.rs \
                         (or add it to LIMIT_ALLOWED with its reason)"
                    ),
                }),
            }
        }
    }
    for ((path, name, reason), used) in allowed.iter().zip(used) {
        if !used {
            found.push(Violation {
                rule: "limits-allow",
                path: (*path).to_owned(),
                line: 0,
                detail: format!("allowance for `{name}` ({reason}) matches no constant: remove it"),
            });
        }
    }
    found
}

/// Rule 5: a patch of `vendor/glommio` lost, or a marker not listed.
fn check_glommio_patches(
    files: &[Source],
    patches: &[(&str, &str, &str, &str)],
    markers: usize,
) -> Vec<Violation> {
    let mut found = Vec::new();
    for &(path, present, absent, reason) in patches {
        let Some(file) = files.iter().find(|file| file.path == path) else {
            found.push(Violation {
                rule: "glommio-patch",
                path: path.to_owned(),
                line: 0,
                detail: format!("file missing; its patch: {reason}"),
            });
            continue;
        };
        let code =
            if path.ends_with("build.rs") { file.text.clone() } else { code_only(&file.text) };
        if !present.is_empty() && !code.contains(present) {
            found.push(Violation {
                rule: "glommio-patch",
                path: path.to_owned(),
                line: 0,
                detail: format!("`{present}` is gone: patch lost ({reason})"),
            });
        }
        if let Some(at) = (!absent.is_empty()).then(|| code.find(absent)).flatten() {
            found.push(Violation {
                rule: "glommio-patch",
                path: path.to_owned(),
                line: line_of(&code, at),
                detail: format!("upstream's `{absent}` is back: patch lost ({reason})"),
            });
        }
    }
    let counted: usize = files
        .iter()
        .filter(|file| file.path.starts_with("vendor/glommio/src/"))
        .map(|file| file.text.matches("Patched:").count())
        .sum();
    if counted != markers {
        found.push(Violation {
            rule: "glommio-patch",
            path: "vendor/glommio/src".to_owned(),
            line: 0,
            detail: format!(
                "{counted} `Patched:` markers, the list expects {markers}: list every patch in GLOMMIO_PATCHES and vendor/README.md"
            ),
        });
    }
    found
}

/// Lines of `text` before its test module (`#[cfg(test)]` then `mod …`), or
/// all of them.
fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .position(|pair| pair[0].trim_end() == "#[cfg(test)]" && pair[1].starts_with("mod "))
        .unwrap_or(lines.len())
}

/// Rule 6: a library file too long, or an allowance that no longer holds.
fn check_file_lines(files: &[Source], max: usize, allowed: &[(&str, usize)]) -> Vec<Violation> {
    let mut found = Vec::new();
    for file in files {
        if file.path.contains("/tests/") || file.path.contains("/generated/") {
            continue;
        }
        let lines = lines_before_tests(&file.text);
        let ceiling = allowed.iter().find(|(path, _)| *path == file.path).map(|(_, n)| *n);
        let detail = match ceiling {
            None if lines > max => format!(
                "{lines} lines before its tests (limit {max}): cut it along its responsibilities"
            ),
            Some(ceiling) if lines > ceiling => format!(
                "{lines} lines, over its allowed {ceiling}: listed files may not grow; cut it"
            ),
            Some(_) if lines <= max => {
                format!("{lines} lines, under the limit {max}: remove its FILE_LINES_ALLOWED entry")
            }
            _ => continue,
        };
        found.push(Violation { rule: "file-lines", path: file.path.clone(), line: 0, detail });
    }
    for (path, _) in allowed {
        if !files.iter().any(|file| file.path == *path) {
            found.push(Violation {
                rule: "file-lines",
                path: (*path).to_owned(),
                line: 0,
                detail: "listed in FILE_LINES_ALLOWED but not found: remove the entry".to_owned(),
            });
        }
    }
    found
}

/// The module path of a file under `root` (`broker/src/log/journal/mod.rs`
/// → `log::journal`), or `None` outside it.
fn module_of(path: &str, root: &str) -> Option<Vec<String>> {
    let relative = path.strip_prefix(root)?.strip_prefix('/')?.strip_suffix(".rs")?;
    let mut parts: Vec<String> = relative.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|last| last == "mod" || last == "lib") {
        parts.pop();
    }
    Some(parts)
}

/// The paths (`a::b::c`) a code text names after `prefix` (`crate::` or
/// `super::`), with the items of a `{…}` group each as its own path.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for at in code.match_indices(prefix).map(|(at, _)| at) {
        if at > 0
            && code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
        {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item = String::new();
            for character in group.chars() {
                match character {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        paths.push(ident_path(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(character);
            }
            paths.push(ident_path(&item));
        } else {
            paths.push(ident_path(rest));
        }
    }
    paths.retain(|path| !path.is_empty());
    paths
}

/// The leading `a::b::c` of `text` (whitespace allowed around `::`).
fn ident_path(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = text.trim_start();
    loop {
        let len = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        if len == 0 {
            break;
        }
        parts.push(rest[..len].to_owned());
        match rest[len..].trim_start().strip_prefix("::") {
            Some(next) => rest = next.trim_start(),
            None => break,
        }
    }
    parts
}

/// Which file of `files` names which other (`crate::` and `super::` paths in
/// code, test modules and `bin/` aside), as (from, to) paths.
fn module_edges<'a>(
    files: &'a [Source],
    root: &str,
) -> std::collections::BTreeSet<(&'a str, &'a str)> {
    use std::collections::{BTreeMap, BTreeSet};
    let modules: BTreeMap<Vec<String>, &str> = files
        .iter()
        .filter_map(|file| module_of(&file.path, root).map(|module| (module, file.path.as_str())))
        .collect();
    let resolve =
        |path: &[String]| (1..=path.len()).rev().find_map(|len| modules.get(&path[..len]).copied());
    let mut edges: BTreeSet<(&str, &str)> = BTreeSet::new();
    for file in files {
        let Some(module) = module_of(&file.path, root) else { continue };
        if module.first().is_some_and(|top| top == "bin")
            || module.iter().any(|part| part == "tests")
        {
            continue;
        }
        let code = code_only(&file.text);
        let code: String =
            code.lines().take(lines_before_tests(&code)).collect::<Vec<_>>().join("\n");
        let parent = &module[..module.len().saturating_sub(1)];
        let named = paths_after(&code, "crate::").into_iter().chain(
            paths_after(&code, "super::")
                .into_iter()
                .map(|path| parent.iter().cloned().chain(path).collect::<Vec<_>>()),
        );
        for path in named {
            if let Some(target) = resolve(&path) {
                if target != file.path {
                    edges.insert((file.path.as_str(), target));
                }
            }
        }
    }
    edges
}

/// The top-level folder (or single file) of `path` under `root`.
fn top_of(path: &str, root: &str) -> String {
    module_of(path, root).unwrap_or_default().first().cloned().unwrap_or_default()
}

/// Rule 8: a file that names a folder in a higher layer than its own (or a
/// top-level module no layer lists), outside the allowed ones.
fn check_layers(
    files: &[Source],
    root: &str,
    layers: &[&[&str]],
    allowed: &[(&str, &str)],
) -> Vec<Violation> {
    use std::collections::BTreeSet;
    let layer = |top: &str| layers.iter().position(|layer| layer.contains(&top));
    let mut upward: BTreeSet<(String, String)> = BTreeSet::new();
    let mut found = Vec::new();
    for (from, to) in module_edges(files, root) {
        let (a, b) = (top_of(from, root), top_of(to, root));
        if a.is_empty() || b.is_empty() || a == b {
            continue;
        }
        match (layer(&a), layer(&b)) {
            (Some(x), Some(y)) if y > x => {
                if allowed.iter().any(|(p, q)| *p == a && *q == b) {
                    upward.insert((a, b));
                } else {
                    found.push(Violation {
                        rule: "layers",
                        path: from.to_owned(),
                        line: 0,
                        detail: format!("`{a}` names `{b}` ({to}), a layer above it: move the thing to the lower layer, or the call to the higher"),
                    });
                }
            }
            (Some(_), Some(_)) => {}
            _ => found.push(Violation {
                rule: "layers",
                path: from.to_owned(),
                line: 0,
                detail: format!("`{a}` or `{b}` is in no layer of LAYERS: place it"),
            }),
        }
    }
    for (a, b) in allowed {
        if !upward.contains(&((*a).to_owned(), (*b).to_owned())) {
            found.push(Violation {
                rule: "layers",
                path: (*a).to_owned(),
                line: 0,
                detail: format!("`{a}` no longer names `{b}`: remove its LAYERS_ALLOWED entry"),
            });
        }
    }
    found
}

/// Rule 7: the file and folder circles of the files under `root`.
fn check_circles(files: &[Source], root: &str, allowed: &[(&str, &str)]) -> Vec<Violation> {
    use std::collections::BTreeSet;
    let edges = module_edges(files, root);
    let folder = |path: &str| top_of(path, root);
    let mut circles: BTreeSet<(String, String)> = BTreeSet::new();
    for &(from, to) in &edges {
        if from < to && edges.contains(&(to, from)) {
            circles.insert((from.to_owned(), to.to_owned()));
        }
        let (a, b) = (folder(from), folder(to));
        if a < b && edges.iter().any(|&(x, y)| folder(x) == b && folder(y) == a) {
            circles.insert((a, b));
        }
    }
    let mut found = Vec::new();
    for (a, b) in &circles {
        if !allowed.iter().any(|(x, y)| x == a && y == b) {
            found.push(Violation {
                rule: "circle",
                path: a.clone(),
                line: 0,
                detail: format!("imports {b}, which imports it back: one of them must not"),
            });
        }
    }
    for (a, b) in allowed {
        if !circles.contains(&((*a).to_owned(), (*b).to_owned())) {
            found.push(Violation {
                rule: "circle",
                path: (*a).to_owned(),
                line: 0,
                detail: format!("the circle with {b} is gone: remove its CIRCLES_ALLOWED entry"),
            });
        }
    }
    found
}

/// Every `*.md` file of the repository, as paths from the root.
fn markdown_files(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        let entries =
            fs::read_dir(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            let name =
                path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if path.is_dir() {
                if !REFERENCE_SKIP_DIRS.contains(&name.as_str()) {
                    pending.push(path);
                }
            } else if name.ends_with(".md") {
                found.push(read_source(root, &path).path);
            }
        }
    }
    found.sort();
    found
}

/// The `*.md` names `text` mentions: runs of path characters ending in
/// `.md` (a URL's are left out: it names another site).
fn markdown_references(text: &str) -> Vec<(usize, String)> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if !path_char(chars[i]) {
                i += 1;
                continue;
            }
            let start = i;
            while i < chars.len() && path_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let word = word.trim_end_matches('.');
            let before: String = chars[..start].iter().collect();
            let in_url = before.ends_with(':')
                || before.rsplit(char::is_whitespace).next().is_some_and(|w| w.contains("://"));
            if word.ends_with(".md") && word.len() > 3 && !in_url && !word.starts_with('.') {
                found.push((number + 1, word.to_owned()));
            }
        }
    }
    found
}

/// Whether `reference`, seen in `from`, names one of `existing`.
fn resolves(reference: &str, from: &str, existing: &[String]) -> bool {
    let reference = reference.trim_start_matches("./");
    let dir = from.rsplit_once('/').map_or("", |(dir, _)| dir);
    let mut relative: Vec<&str> =
        if dir.is_empty() { Vec::new() } else { dir.split('/').collect() };
    for part in reference.split('/') {
        match part {
            ".." => {
                relative.pop();
            }
            "." | "" => {}
            part => relative.push(part),
        }
    }
    let relative = relative.join("/");
    existing.iter().any(|path| {
        *path == relative || *path == reference || path.ends_with(&format!("/{reference}"))
    })
}

/// The line comments of a Rust source (`//`, `///`, `//!` lines), other
/// lines blanked so line numbers stay true: string literals of code (a
/// test's example text) are not references.
fn comments_of(text: &str) -> String {
    text.lines()
        .map(|line| if line.trim_start().starts_with("//") { line } else { "" })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Rule 9: references to Markdown files that do not exist, machine paths
/// and tracker mentions in docs.
fn check_references(docs: &[Source], rust: &[Source], existing: &[String]) -> Vec<Violation> {
    let mut found = Vec::new();
    let dangling = |path: &str, text: &str| -> Vec<Violation> {
        markdown_references(text)
            .into_iter()
            .filter(|(_, reference)| !resolves(reference, path, existing))
            .map(|(line, reference)| Violation {
                rule: "references",
                path: path.to_owned(),
                line,
                detail: format!("`{reference}` is not a file of the repository"),
            })
            .collect()
    };
    for file in rust {
        found.extend(dangling(&file.path, &comments_of(&file.text)));
    }
    for file in docs {
        found.extend(dangling(&file.path, &file.text));
        for (number, line) in file.text.lines().enumerate() {
            // At the start of a path only: `fuzz/work/` is a relative one.
            let machine = MACHINE_PATHS.iter().find(|prefix| {
                line.match_indices(*prefix).any(|(at, _)| {
                    !line[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || "_-./".contains(c))
                })
            });
            if let Some(prefix) = machine {
                found.push(Violation {
                    rule: "references",
                    path: file.path.clone(),
                    line: number + 1,
                    detail: format!("names `{prefix}…`, a directory of one machine: say $SCRATCH or a relative path"),
                });
            }
            let lower = line.to_lowercase();
            let tracker = lower.match_indices("issue").any(|(at, _)| {
                let rest = lower[at + "issue".len()..].trim_start_matches([' ', '#']);
                lower[at + "issue".len()..].starts_with([' ', '#'])
                    && rest.starts_with(|c: char| c.is_ascii_digit())
            });
            if tracker {
                found.push(Violation {
                    rule: "references",
                    path: file.path.clone(),
                    line: number + 1,
                    detail: "names a tracker issue: say what the change was".to_owned(),
                });
            }
        }
    }
    found
}

/// Rule 10: library files without a `//!` module doc at the top.
fn check_module_docs(files: &[Source]) -> Vec<Violation> {
    files
        .iter()
        .filter(|file| !file.text.trim_start().starts_with("//!"))
        .map(|file| Violation {
            rule: "module-doc",
            path: file.path.clone(),
            line: 1,
            detail: "opens without a `//!` doc saying what the file owns".to_owned(),
        })
        .collect()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_owned()
}

/// Every `.rs` file under `dir` (relative to `root`), sorted, generated code
/// left out.
fn read_tree(root: &Path, dir: &str) -> Vec<Source> {
    let mut files = Vec::new();
    let mut pending = vec![root.join(dir)];
    while let Some(next) = pending.pop() {
        let entries =
            fs::read_dir(&next).unwrap_or_else(|error| panic!("{}: {error}", next.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "generated") {
                    pending.push(path);
                }
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(read_source(root, &path));
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

fn read_source(root: &Path, path: &Path) -> Source {
    let text =
        fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let relative = path.strip_prefix(root).expect("under the root");
    let path = relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/");
    Source { path, text }
}

fn report(violations: &[Violation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
}

#[test]
fn tree_is_tidy() {
    // Goal: the real tree keeps every rule. Method: read the library sources
    // and the client's manifest and tests, run each checker, list every
    // violation at once.
    let root = workspace_root();
    let library: Vec<Source> = LIBRARY_ROOTS.iter().flat_map(|dir| read_tree(&root, dir)).collect();
    assert!(
        library.iter().any(|file| file.path == "broker/src/queue/state/mod.rs"),
        "the checker must see the queue's sources"
    );
    assert!(library.len() > 50, "only {} files read", library.len());
    let mut client_files = read_tree(&root, "client/src");
    client_files.extend(read_tree(&root, "client/tests"));
    let manifest = read_source(&root, &root.join("client/Cargo.toml"));

    let mut violations = check_glommio(&library);
    violations.extend(check_queue(&library));
    violations.extend(check_client_deps(&manifest, &client_files));
    violations.extend(check_limits(&library, LIMIT_ALLOWED));
    violations.extend(check_file_lines(&library, FILE_LINES_MAX, FILE_LINES_ALLOWED));
    violations.extend(check_circles(&library, "broker/src", CIRCLES_ALLOWED));
    violations.extend(check_layers(&library, "broker/src", LAYERS, LAYERS_ALLOWED));
    violations.extend(check_module_docs(&library));
    let markdown = markdown_files(&root);
    assert!(markdown.iter().any(|path| path == "ARCHITECTURE.md"), "{markdown:?}");
    let docs: Vec<Source> =
        markdown.iter().map(|path| read_source(&root, &root.join(path))).collect();
    let rust: Vec<Source> = RUST_ROOTS.iter().flat_map(|dir| read_tree(&root, dir)).collect();
    violations.extend(check_references(&docs, &rust, &markdown));
    let mut vendored = read_tree(&root, "vendor/glommio/src");
    assert!(vendored.len() > 20, "only {} glommio files read", vendored.len());
    vendored.push(read_source(&root, &root.join("vendor/glommio/build.rs")));
    violations.extend(check_glommio_patches(&vendored, GLOMMIO_PATCHES, GLOMMIO_PATCH_MARKERS));
    assert!(violations.is_empty(), "tidy rules broken:\n{}", report(&violations));
}

fn source(path: &str, text: &str) -> Source {
    Source { path: path.to_owned(), text: text.to_owned() }
}

#[test]
fn checker_finds_glommio_outside_its_modules() {
    // Goal: rule 1 fires on code, not on docs or strings. Method: the same
    // word in a comment, a string and a `use`, inside and outside an
    // allowed directory.
    let files = [
        source(
            "broker/src/log/a.rs",
            "//! glommio in a doc\nlet s = \"glommio\";\nuse glommio::Task;\n",
        ),
        source("broker/src/net/b.rs", "use glommio::net::TcpListener;\n"),
        source("wire/src/c.rs", "fn f() { glommio::spawn_local(x); }\n"),
        source("broker/src/log/d.rs", "let glommio_like = 1; // glommio\n"),
    ];
    let found = check_glommio(&files);
    let places: Vec<(&str, usize)> = found.iter().map(|v| (v.path.as_str(), v.line)).collect();
    assert_eq!(places, vec![("broker/src/log/a.rs", 3), ("wire/src/c.rs", 1)]);
}

#[test]
fn checker_finds_async_clock_and_io_in_queue() {
    // Goal: rule 2 fires on each forbidden kind, only in queue/. Method: one
    // line of each kind, plus the same words in a comment and in another
    // module.
    let files = [
        source(
            "broker/src/queue/x.rs",
            "async fn a() {}\nlet t = Instant::now();\nlet f = std::fs::read(p);\n\
             // async, SystemTime, std::net in a comment\nlet n = crate::clock::now_ms();\n\
             let s = \"std::net\";\n",
        ),
        source("broker/src/partition/y.rs", "async fn b() { std::fs::read(p).await }\n"),
    ];
    let found = check_queue(&files);
    let lines: Vec<usize> = found.iter().map(|v| v.line).collect();
    assert_eq!(lines, vec![1, 2, 5, 3], "{}", report(&found));
    assert!(found.iter().all(|v| v.path == "broker/src/queue/x.rs"));
}

#[test]
fn checker_finds_a_client_dependency_on_the_broker() {
    // Goal: rule 3 fires on the manifest and on code. Method: a manifest with
    // the broker among dev-dependencies, and a file that names it.
    let manifest = source(
        "client/Cargo.toml",
        "[package]\nname = \"spool-client\"\n\n[dependencies]\nspool-wire.workspace = true\n\n\
         [dev-dependencies]\nspool-broker = { path = \"../broker\" }\n",
    );
    let files = [
        source("client/src/a.rs", "use spool_broker::queue::Offset;\n"),
        source("client/src/b.rs", "// spool_broker in a comment\n"),
    ];
    let found = check_client_deps(&manifest, &files);
    let places: Vec<(&str, usize)> = found.iter().map(|v| (v.path.as_str(), v.line)).collect();
    assert_eq!(places, vec![("client/Cargo.toml", 8), ("client/src/a.rs", 1)]);
    let clean = source("client/Cargo.toml", "[dependencies]\nspool-wire.workspace = true\n");
    assert!(check_client_deps(&clean, &files[1..]).is_empty());
}

#[test]
fn checker_finds_limits_outside_limits_files() {
    // Goal: rule 4 fires on each limit-like name outside a limits file,
    // honours an allowance, and reports an allowance that excuses nothing.
    // Method: constants of each shape in a module, a limits file and a test
    // module.
    let files = [
        source(
            "broker/src/net/x.rs",
            "pub const READ_BYTES_MAX: usize = 1;\nconst WAIT_MS_DEFAULT: u64 = 2;\n\
             pub(crate) const FRAME_BYTES: usize = 3;\npub const MAGIC: u32 = 4;\n\
             pub const ALLOWED_MAX: u32 = 5;\n// const IN_COMMENT_MAX: u8 = 0;\n\
             #[cfg(test)]\nmod tests { const TEST_MAX: usize = 6; }\n",
        ),
        source("broker/src/limits.rs", "pub const SEGMENT_BYTES_MAX: u64 = 1;\n"),
        source("broker/src/queue/tests/model.rs", "const OPS_MAX: usize = 1;\n"),
    ];
    let allowed = [
        ("broker/src/net/x.rs", "ALLOWED_MAX", "a reason"),
        ("broker/src/gone.rs", "STALE_MAX", "excuses nothing"),
    ];
    let found = check_limits(&files, &allowed);
    let names: Vec<(&str, usize)> = found.iter().map(|v| (v.rule, v.line)).collect();
    assert_eq!(names, vec![("limits", 1), ("limits", 2), ("limits", 3), ("limits-allow", 0)]);
    assert!(found[3].detail.contains("STALE_MAX"));
}

#[test]
fn checker_finds_a_lost_glommio_patch() {
    // Goal: rule 5 fires when a patch's code is gone, when upstream's code is
    // back, and when a marker is added without a listed patch.
    let patches = &[
        ("vendor/glommio/src/sys/uring.rs", "keep_latency_timer", "membarrier::", "why"),
        ("vendor/glommio/build.rs", "", "submodule", "why"),
    ];
    let kept = vec![
        source("vendor/glommio/src/sys/uring.rs", "// Patched: x\nlet keep_latency_timer = 1;\n"),
        source("vendor/glommio/build.rs", "fn main() {}\n"),
    ];
    assert!(check_glommio_patches(&kept, patches, 1).is_empty());
    let lost = vec![
        // Only in a comment: the code is what counts.
        source(
            "vendor/glommio/src/sys/uring.rs",
            "// Patched: keep_latency_timer\nmembarrier::heavy();\n",
        ),
        source("vendor/glommio/build.rs", "Command::new(\"git\").args([\"submodule\"]);\n"),
    ];
    let found = check_glommio_patches(&lost, patches, 1);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found.iter().all(|violation| violation.rule == "glommio-patch"));
    assert_eq!(found[1].line, 2);
    assert_eq!(check_glommio_patches(&kept, patches, 2).len(), 1, "a marker count off by one");
}

#[test]
fn checker_finds_long_files_and_stale_allowances() {
    // Goal: rule 6 fires on a long file, on a listed file past its ceiling, on
    // an entry whose file is back under the limit or gone; test modules and
    // generated code do not count.
    let long = |n: usize| "fn f() {}\n".repeat(n);
    let with_tests = format!("{}#[cfg(test)]\nmod tests {{\n{}}}\n", long(3), long(50));
    let files = vec![
        source("broker/src/a.rs", &long(11)),
        source("broker/src/b.rs", &long(13)),
        source("broker/src/c.rs", &long(4)),
        source("broker/src/d.rs", &with_tests),
        source("broker/src/queue/tests/e.rs", &long(40)),
        source("wire/src/proto/generated/f.rs", &long(40)),
        source("broker/src/g.rs", &long(12)),
    ];
    let allowed = &[
        ("broker/src/b.rs", 12),
        ("broker/src/c.rs", 20),
        ("broker/src/gone.rs", 30),
        ("broker/src/g.rs", 12),
    ];
    let found = check_file_lines(&files, 10, allowed);
    let paths: Vec<&str> = found.iter().map(|violation| violation.path.as_str()).collect();
    assert_eq!(
        paths,
        ["broker/src/a.rs", "broker/src/b.rs", "broker/src/c.rs", "broker/src/gone.rs"],
        "{found:?}"
    );
    assert_eq!(lines_before_tests(&with_tests), 3);
}

#[test]
fn checker_finds_import_circles() {
    // Goal: rule 7 sees circles through `crate::` paths, `super::` paths and
    // `use` groups, between files and between folders, not in comments or
    // test modules, and flags an allowance whose circle is gone.
    let files = vec![
        source("broker/src/a/mod.rs", "pub mod x;\npub mod y;\n"),
        source("broker/src/a/x.rs", "use super::y::Thing;\n"),
        source("broker/src/a/y.rs", "use crate::{b::B, a::x::{self, X}};\n"),
        source("broker/src/b.rs", "fn f() { crate::c::g(); }\n"),
        source(
            "broker/src/c.rs",
            "// crate::b::B\n#[cfg(test)]\nmod tests {\nuse crate::b::B;\n}\n",
        ),
        source("broker/src/d.rs", "fn f() { crate::b::B::new(); }\n"),
        source("broker/src/e.rs", "fn f() { crate::d::f(); }\n"),
    ];
    let found = check_circles(&files, "broker/src", &[("d", "e")]);
    let said: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(
        said,
        [
            "broker/src/a/x.rs:0: [circle] imports broker/src/a/y.rs, which imports it back: one of them must not",
            "d:0: [circle] the circle with e is gone: remove its CIRCLES_ALLOWED entry",
        ],
        "{said:#?}"
    );
    let mut files = files;
    files.push(source("broker/src/c.rs", "fn g() { crate::b::f(); }\n"));
    files.remove(4);
    let found = check_circles(&files, "broker/src", &[]);
    let said: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert!(said.iter().any(|line| line.starts_with("b:0: [circle] imports c")), "{said:#?}");
    assert!(said.iter().any(|line| line.starts_with("broker/src/b.rs:0: [circle]")), "{said:#?}");
}

#[test]
fn checker_finds_a_name_of_a_higher_layer() {
    // Goal: rule 8 fires on a name of a higher layer, on a folder in no layer,
    // and on a stale allowance; names of the same or a lower layer pass.
    let files = vec![
        source("broker/src/low/mod.rs", "pub mod a;\n"),
        source("broker/src/low/a.rs", "fn f() { crate::high::g(); }\n"),
        source("broker/src/high.rs", "use crate::low::a;\nfn g() {}\n"),
        source("broker/src/mid.rs", "use crate::low::a;\nuse crate::stray::s;\n"),
        source("broker/src/stray.rs", "fn s() {}\n"),
    ];
    let layers: &[&[&str]] = &[&["low"], &["mid"], &["high"]];
    let found = check_layers(&files, "broker/src", layers, &[("mid", "high")]);
    let said: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(said.len(), 3, "{said:#?}");
    assert!(said[0].starts_with("broker/src/low/a.rs:0: [layers] `low` names `high`"), "{said:#?}");
    assert!(
        said[1].starts_with("broker/src/mid.rs:0: [layers] `mid` or `stray` is in no layer"),
        "{said:#?}"
    );
    assert!(said[2].starts_with("mid:0: [layers] `mid` no longer names `high`"), "{said:#?}");
    let allowed = check_layers(&files[..3], "broker/src", layers, &[("low", "high")]);
    assert!(allowed.is_empty(), "{allowed:?}");
}

#[test]
fn code_only_blanks_comments_and_literals_but_keeps_lines() {
    // Goal: the checkers read code alone, at true line numbers. Method: each
    // kind of comment and literal, with a word that must disappear.
    let text = "a /* x\n y */ b // z\nc \"q\\\"w\" r#\"e\"f\"# '\"' 'a d\n";
    let code = code_only(text);
    assert_eq!(code.lines().count(), text.lines().count());
    for gone in ["x", "y", "z", "q", "w", "e", "f"] {
        assert!(find_word(&code, gone).is_empty(), "{gone} left in {code:?}");
    }
    for kept in ["a", "b", "c", "d"] {
        assert!(!find_word(&code, kept).is_empty(), "{kept} lost from {code:?}");
    }
}

#[test]
fn checker_finds_dangling_references_machine_paths_and_tracker_mentions() {
    // Goal: rule 9 fires on a Markdown name that resolves nowhere (in a doc
    // and in a comment), on a machine path and on a tracker mention, and
    // passes names that resolve from the file, from the root or as a unique
    // path end, and a URL's. Method: a small tree of docs and one source.
    let existing: Vec<String> =
        ["README.md", "docs/a.md", "docs/design/b.md"].iter().map(|p| (*p).to_owned()).collect();
    let docs = vec![
        source(
            "README.md",
            "See docs/a.md and [b](docs/design/b.md), `b.md`, https://x.org/y.md.\n",
        ),
        source(
            "docs/a.md",
            "See design/b.md, ../README.md and DESIGN.md.\nRun in /work/tmp.\nAs issue 12 said.\n",
        ),
    ];
    let rust = vec![source(
        "broker/src/x.rs",
        "//! Per COMMON.md and docs/a.md.\nfn f() { let s = \"GONE.md\"; }\n",
    )];
    let found = check_references(&docs, &rust, &existing);
    let said: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(
        said,
        [
            "broker/src/x.rs:1: [references] `COMMON.md` is not a file of the repository",
            "docs/a.md:1: [references] `DESIGN.md` is not a file of the repository",
            "docs/a.md:2: [references] names `/work/…`, a directory of one machine: say $SCRATCH or a relative path",
            "docs/a.md:3: [references] names a tracker issue: say what the change was",
        ],
        "{said:#?}"
    );
}

#[test]
fn checker_finds_a_file_without_a_module_doc() {
    // Goal: rule 10 fires on a file that opens with code or a plain
    // comment, and passes one that opens with `//!`.
    let files = vec![
        source("broker/src/a.rs", "//! Owns a.\nfn a() {}\n"),
        source("broker/src/b.rs", "// not a module doc\nfn b() {}\n"),
        source("broker/src/c.rs", "fn c() {}\n"),
    ];
    let said: Vec<String> = check_module_docs(&files).iter().map(ToString::to_string).collect();
    assert_eq!(said.len(), 2, "{said:#?}");
    assert!(said[0].starts_with("broker/src/b.rs:1: [module-doc]"), "{said:#?}");
    assert!(said[1].starts_with("broker/src/c.rs:1: [module-doc]"), "{said:#?}");
}
