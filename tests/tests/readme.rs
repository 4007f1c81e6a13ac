//! The README as written, run the way a new user runs it.
//!
//! The test reads `README.md` itself: the "Two commands" block and the CLI
//! quickstart block. It starts `spoold` exactly as the first command says,
//! from a fresh temporary working directory (so the default data dir
//! `./spool-data` is relative, as a user's is), checks that the second
//! command is what `.ci/run` calls, and then runs the quickstart line by
//! line with an expectation for each line's output. A README line the test
//! has no expectation for fails the test, so the README and this test change
//! together.
//!
//! `cargo run --release -p P --bin B -- ARGS` maps to the release binary
//! `target/release/B ARGS` (`scripts/test.sh` builds both before the tests,
//! so this is the profile the README tells users to use). The README's
//! default port is used when it is free; otherwise the README's documented
//! fallback (`--listen` for `spoold`, `--addr` for `spool`) on free ports.

// A failed step is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use spool_tests::{now, release_bin, reserve_ports};

/// The README's default broker address (shard 0).
const DEFAULT_PORT: u16 = 7400;
/// The default admin port (HTTP: metrics and health).
const DEFAULT_ADMIN_PORT: u16 = 7480;

/// How long the README's `spoold` may take to accept on every shard port.
const START_TIMEOUT: Duration = Duration::from_secs(60);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The lines of the first ```sh block after the heading `heading`.
fn sh_block(readme: &str, heading: &str) -> Vec<String> {
    let start = readme
        .lines()
        .position(|line| line.trim() == heading)
        .unwrap_or_else(|| panic!("README.md has no heading {heading:?}"));
    let mut lines = readme.lines().skip(start + 1).skip_while(|line| line.trim() != "```sh");
    assert!(lines.next().is_some(), "no ```sh block after {heading:?}");
    let block: Vec<String> =
        lines.take_while(|line| line.trim() != "```").map(str::to_owned).collect();
    assert!(!block.is_empty(), "empty ```sh block after {heading:?}");
    block
}

/// The lines of the first ```text block after the heading `heading`: the
/// sample output the README shows.
fn text_block(readme: &str, heading: &str) -> String {
    let start = readme.lines().position(|line| line.trim() == heading).unwrap();
    let mut lines = readme.lines().skip(start + 1).skip_while(|line| line.trim() != "```text");
    assert!(lines.next().is_some(), "no ```text block after {heading:?}");
    lines.take_while(|line| line.trim() != "```").map(|line| format!("{line}\n")).collect()
}

/// Splits a shell line into words: spaces separate, single and double
/// quotes and backslashes quote, `#` at the start of a word begins a
/// comment. Shell syntax this test cannot run (pipes, redirections,
/// expansions, separators) is refused rather than run wrongly.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(character) = chars.next() {
        match character {
            '#' if !in_word => break,
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(quoted) => word.push(quoted),
                        None => panic!("unterminated ' in README line {line:?}"),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => word.extend(chars.next()),
                        Some(special @ ('$' | '`')) => {
                            panic!("README line {line:?}: {special} inside \"\" is not supported")
                        }
                        Some(quoted) => word.push(quoted),
                        None => panic!("unterminated \" in README line {line:?}"),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '|' | '&' | ';' | '<' | '>' | '$' | '`' | '(' | ')' | '*' | '?' => {
                panic!("README line {line:?}: shell syntax {character:?} is not supported here")
            }
            other => {
                in_word = true;
                word.push(other);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// `cargo run [-q] --release -p P --bin B [-- ARGS]` → `[release/B, ARGS]`.
fn cargo_run_to_binary(words: &[String]) -> Vec<String> {
    assert!(
        words.len() >= 2 && words[0] == "cargo" && words[1] == "run",
        "not a `cargo run` line: {words:?}"
    );
    let (mut release, mut package, mut bin, mut args) = (false, None, None, Vec::new());
    let mut rest = words[2..].iter();
    while let Some(word) = rest.next() {
        match word.as_str() {
            "-q" | "--quiet" => {}
            "--release" => release = true,
            "-p" | "--package" => package = rest.next().cloned(),
            "--bin" => bin = rest.next().cloned(),
            "--" => {
                args = rest.by_ref().cloned().collect();
            }
            other => panic!("`cargo run` option {other:?} is not mapped by this test: {words:?}"),
        }
    }
    assert!(release, "the README's commands use the release profile: {words:?}");
    let (package, bin) = (package.unwrap(), bin.unwrap());
    let owner = match bin.as_str() {
        "spoold" => "spool-broker",
        "spool" => "spool-client",
        other => panic!("binary {other:?} is not one the README test knows"),
    };
    assert_eq!(package, owner, "`--bin {bin}` lives in package {owner}");
    let mut command = vec![release_bin(&bin).display().to_string()];
    command.extend(args);
    command
}

/// `spoold` started by the test; SIGKILLed on drop if still running.
struct Broker {
    child: Option<Child>,
    log: PathBuf,
}

impl Broker {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- spoold log ----\n{}\n---- end ----", self.log());
        }
    }
}

/// Shards `spoold` starts by default: one per CPU this process may use.
fn default_shards() -> u16 {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    u16::try_from(cpus).unwrap_or(u16::MAX)
}

fn ports_free(base: u16, shards: u16) -> bool {
    (0..shards).all(|shard| TcpListener::bind(("127.0.0.1", base + shard)).is_ok())
}

/// Starts `command` in `cwd` and waits until shards `base..base+shards`
/// accept.
fn start_broker(command: &[String], cwd: &Path, base: u16, shards: u16) -> Result<Broker, String> {
    let log = cwd.join("..").join(format!("spoold-{base}.log"));
    let file = std::fs::File::create(&log).unwrap();
    let mut process = Command::new(&command[0]);
    process
        .args(&command[1..])
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    // The user's shell has no SPOOL_* settings; neither does this broker.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|name| name.starts_with("SPOOL_")) {
            process.env_remove(name);
        }
    }
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only prctl(2), which is async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        process.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut broker = Broker { child: Some(process.spawn().unwrap()), log };
    let started = now();
    loop {
        if let Some(status) = broker.child.as_mut().unwrap().try_wait().unwrap() {
            broker.child = None;
            return Err(format!("spoold exited during start ({status}):\n{}", broker.log()));
        }
        let accepting = (0..shards).all(|shard| {
            let addr = SocketAddr::from(([127, 0, 0, 1], base + shard));
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        });
        if accepting {
            return Ok(broker);
        }
        assert!(started.elapsed() < START_TIMEOUT, "spoold did not accept:\n{}", broker.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stdout_of(output: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The cells of a table's data rows, split on whitespace.
fn rows(stdout: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(header), "table header:\n{stdout}");
    lines.map(|line| line.split_whitespace().map(str::to_owned).collect()).collect()
}

/// Checks one quickstart command's output; panics for a command the test
/// has no expectation for. `sample` is the output the README shows for
/// `send`.
fn check_quickstart_line(line: &str, args: &[String], output: &Output, sample: &str) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stdout = stdout_of(output, line);
    // user-42's partition of 2, as the client routes it.
    let partition = spool_client::partition_for_key(b"user-42", 2).0.to_string();
    match args.as_slice() {
        ["queue", "create", "jobs", "--partitions", "2"] => {
            assert_eq!(stdout, "created queue jobs (2 partitions)\n");
        }
        ["send", "jobs", "--key", "user-42", "resize image 17"] => {
            assert_eq!(rows(&stdout, "partition  offset"), vec![vec![partition, "0".to_owned()]]);
            assert_eq!(stdout, sample, "the README shows send's output as it is");
        }
        ["stats", "jobs"] => {
            let header = "queue  ready  scheduled  claimed  quarantined  expired  acked  bytes";
            let rows = rows(&stdout, header);
            assert_eq!(rows.len(), 1, "{stdout}");
            assert_eq!(rows[0][..7], ["jobs", "1", "0", "0", "0", "0", "0"], "{stdout}");
            assert!(rows[0][7].parse::<u64>().unwrap() > 0, "bytes: {stdout}");
        }
        ["recv", "jobs", "-n", "10"] if stdout.contains("resize image 17") => {
            let header = "partition  offset  attempt  key      payload          result";
            let rows = rows(&stdout, header);
            let expected = [&partition, "0", "1", "user-42", "resize", "image", "17", "acked"];
            assert_eq!(rows, vec![expected.map(str::to_owned).to_vec()], "{stdout}");
        }
        ["sub", "create", "jobs", "audit", "--from", "earliest"] => {
            assert_eq!(stdout, "created subscription audit of queue jobs (id 1, from earliest)\n");
        }
        ["send", "jobs", "--key", "user-7", "invoice 9"] => {
            assert_eq!(rows(&stdout, "partition  offset").len(), 1, "{stdout}");
        }
        // After the subscription: each of the two gets the new message.
        ["recv", "jobs", "-n", "10"] | ["recv", "jobs", "--sub", "audit", "-n", "10"] => {
            let header = "partition  offset  attempt  key     payload    result";
            let rows = rows(&stdout, header);
            assert_eq!(rows.len(), 1, "{stdout}");
            assert_eq!(rows[0][2..], ["1", "user-7", "invoice", "9", "acked"], "{stdout}");
        }
        ["sub", "list", "jobs"] => {
            let header =
                "subscription  id  ready  claimed  dead_letters  oldest_ready_age_ms  lost";
            let rows = rows(&stdout, header);
            let names: Vec<&str> = rows.iter().map(|row| row[0].as_str()).collect();
            assert_eq!(names, ["default", "audit"], "{stdout}");
            assert!(rows.iter().all(|row| row[2] == "0" && row[3] == "0"), "{stdout}");
            // No retention window: nothing lost.
            assert!(rows.iter().all(|row| row[6] == "0"), "{stdout}");
        }
        ["queue", "create", "chairs", "--ordered"] => {
            assert_eq!(stdout, "created queue chairs (1 partitions, ordered)\n");
        }
        ["send", "chairs", "--key", "chair-4", payload] => {
            let offset = if *payload == "book 2:00" { "0" } else { "1" };
            assert_eq!(rows(&stdout, "partition  offset"), vec![vec!["0", offset]], "{stdout}");
        }
        ["peek", "chairs"] => {
            let header = "partition  offset  state    attempt  key      payload";
            let rows = rows(&stdout, header);
            let states: Vec<&str> = rows.iter().map(|row| row[2].as_str()).collect();
            assert_eq!(states, ["ready", "waiting"], "{stdout}");
        }
        // One per claim: the cancel is claimable only after the booking's ack.
        ["recv", "chairs", "-n", "10"] => {
            let expected = if stdout.contains("book") { "book" } else { "cancel" };
            let header = "partition  offset  attempt  key      payload";
            let rows: Vec<Vec<String>> = stdout
                .lines()
                .skip_while(|line| !line.starts_with(header))
                .skip(1)
                .map(|line| line.split_whitespace().map(str::to_owned).collect())
                .collect();
            assert_eq!(rows.len(), 1, "{stdout}");
            assert_eq!(rows[0][3..5], ["chair-4", expected], "{stdout}");
            assert_eq!(rows[0].last().map(String::as_str), Some("acked"), "{stdout}");
        }
        _ => panic!(
            "README quickstart line {line:?} has no expectation in tests/tests/readme.rs: \
             add one when the README changes"
        ),
    }
}

// Goal: a new user following the README gets no error: `spoold` started as
// the first command says (from a fresh working directory, default data dir
// ./spool-data, default port or the documented fallback), and each line of
// the CLI quickstart answers as the test expects; the second command is
// what CI runs. Method: parse README.md's blocks, map `cargo run --release`
// to the release binaries, run each line in order and check its output;
// an unknown line fails. Finally SIGTERM: the broker exits 0.
#[test]
fn readme_quickstart_runs_as_written() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();

    let two = sh_block(&readme, "## Two commands");
    let two: Vec<Vec<String>> =
        two.iter().map(|line| shell_words(line)).filter(|words| !words.is_empty()).collect();
    assert_eq!(two.len(), 2, "\"Two commands\" has two commands: {two:?}");
    // The second command is the one CI runs, exactly.
    let ci = std::fs::read_to_string(workspace().join(".ci/run")).unwrap();
    let ci_last =
        ci.lines().map(str::trim).rfind(|line| !line.is_empty() && !line.starts_with('#')).unwrap();
    assert_eq!(shell_words(ci_last), two[1], ".ci/run ends with the README's test command");

    // The first command, from a fresh working directory.
    let root = tempfile::Builder::new().prefix("spool-readme-").tempdir().unwrap();
    let cwd = root.path().join("user");
    std::fs::create_dir(&cwd).unwrap();
    let mut spoold = cargo_run_to_binary(&two[0]);
    assert!(spoold[0].ends_with("/release/spoold"), "first command starts spoold: {two:?}");
    assert!(
        !spoold.iter().any(|arg| arg.starts_with("--data-dir") || arg.starts_with("--listen")),
        "the README's first command uses the defaults: {spoold:?}"
    );
    let shards = default_shards();
    let mut addr_args: Vec<String> = Vec::new();
    // `spool sub` talks to the admin port: given only when it moved.
    let mut admin_args: Vec<String> = Vec::new();
    let broker = if ports_free(DEFAULT_PORT, shards) && ports_free(DEFAULT_ADMIN_PORT, 1) {
        start_broker(&spoold, &cwd, DEFAULT_PORT, shards)
    } else {
        Err(format!("ports {DEFAULT_PORT}..+{shards} are busy"))
    };
    let mut broker = match broker {
        Ok(broker) => broker,
        Err(why) => {
            // The README documents the fallback for a busy port.
            assert!(
                readme.contains("--listen 127.0.0.1:")
                    && readme.contains("--addr 127.0.0.1:")
                    && readme.contains("--admin-listen 127.0.0.1:"),
                "README.md must document --listen/--addr/--admin-listen for a busy port"
            );
            eprintln!("default port unusable ({why}); using the documented --listen/--addr");
            let base = reserve_ports(shards + 1);
            spoold.extend(["--listen".to_owned(), format!("127.0.0.1:{base}")]);
            spoold.extend(["--admin-listen".to_owned(), format!("127.0.0.1:{}", base + shards)]);
            addr_args = vec!["--addr".to_owned(), format!("127.0.0.1:{base}")];
            admin_args = vec!["--admin".to_owned(), format!("127.0.0.1:{}", base + shards)];
            start_broker(&spoold, &cwd, base, shards).unwrap()
        }
    };
    assert!(cwd.join("spool-data").is_dir(), "the default data dir is ./spool-data");

    // The quickstart, line by line.
    let sample = text_block(&readme, "## Quickstart with the CLI");
    let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut checked = 0;
    for line in sh_block(&readme, "## Quickstart with the CLI") {
        let words = shell_words(&line);
        let Some(first) = words.first() else { continue };
        if first == "alias" {
            assert_eq!(words.len(), 2, "alias NAME='...': {line:?}");
            let (name, expansion) = words[1].split_once('=').unwrap();
            let expansion = shell_words(expansion);
            // The alias must stand for the release CLI.
            let command = cargo_run_to_binary(&expansion);
            assert!(command[0].ends_with("/release/spool") && command.len() == 1, "{line:?}");
            aliases.insert(name.to_owned(), command);
            continue;
        }
        let Some(expansion) = aliases.get(first) else {
            panic!("README quickstart line {line:?} runs {first:?}, which is no alias")
        };
        let mut command = expansion.clone();
        let args = words[1..].to_vec();
        command.extend(addr_args.iter().cloned());
        command.extend(args.iter().cloned());
        if args.first().is_some_and(|arg| arg == "sub") {
            command.extend(admin_args.iter().cloned());
        }
        let output = Command::new(&command[0])
            .args(&command[1..])
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        check_quickstart_line(&line, &args, &output, &sample);
        checked += 1;
    }
    assert!(checked >= 9, "the quickstart ran {checked} commands");

    let mut child = broker.child.take().unwrap();
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill(2) on our own child, not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let started = now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "spoold exit after SIGTERM: {status}\n{}", broker.log());
}

// Goal: the README test's shell reading is right, so it runs what a shell
// would. Method: quotes, comments, escapes, and refused syntax.
#[test]
fn shell_words_split_like_a_shell() {
    assert_eq!(
        shell_words("spool send jobs --key user-42 'resize image 17'   # a comment"),
        ["spool", "send", "jobs", "--key", "user-42", "resize image 17"]
    );
    assert_eq!(shell_words(r#"a "b c" d\ e f#g"#), ["a", "b c", "d e", "f#g"]);
    assert_eq!(shell_words("# only a comment"), Vec::<String>::new());
    assert!(std::panic::catch_unwind(|| shell_words("a | b")).is_err());
    assert!(std::panic::catch_unwind(|| shell_words("echo 'open")).is_err());
}
