//! `spoold`: the Spool broker daemon.
//!
//! Parses flags, builds the config (flags > `SPOOL_*` env > TOML file >
//! defaults), starts logging and the broker, turns SIGTERM/SIGINT into a
//! graceful drain, and exits 0 after a clean stop or with a
//! [`FatalReason`] code otherwise. A second SIGTERM/SIGINT during the drain
//! exits at once (code 1). SIGHUP reads the auth file again
//! (`CoordinatorHandle::reload_auth`): a file that does not load is logged and
//! the policy in force kept.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Parser;
use spool_broker::admin::node::Node;
use spool_broker::control::config::BrokerConfig;
use spool_broker::control::layers::Cli;
use spool_broker::control::logging;
use spool_broker::fatal::{fatal, FatalReason};
use spool_broker::limits::SIGNAL_POLL;
use spool_broker::server::SpoolHooksFactory;
use spool_broker::shard::cpus;

/// mimalloc instead of glibc malloc: per-request buffers and the queue
/// state's chunks are allocated and freed on the shard threads at tens of
/// thousands a second; glibc spent ≈10 % of a shard's CPU there
/// (`unlink_chunk`, `malloc_consolidate`), see docs/performance.md, "Allocator".
/// Counted (`spool_heap_live_bytes`), see `spool_broker::alloc`.
#[global_allocator]
static ALLOCATOR: spool_broker::alloc::CountingMimalloc = spool_broker::alloc::CountingMimalloc;

/// Exit code of a second signal during the drain.
const FORCED_EXIT_CODE: i32 = 1;

fn install_signal_handlers(
    stop: &Arc<AtomicBool>,
    reload: &Arc<AtomicBool>,
) -> Result<(), std::io::Error> {
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())?;
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // Registered first, so it sees the flag before the second handler
        // sets it: a repeated signal exits immediately.
        signal_hook::flag::register_conditional_shutdown(signal, FORCED_EXIT_CODE, stop.clone())?;
        signal_hook::flag::register(signal, stop.clone())?;
    }
    Ok(())
}

pub fn main() {
    spool_broker::alloc::configure();
    ALLOCATOR.installed();
    let cli = Cli::parse();
    let allowed_cpus = cpus::allowed_cpus().len();
    let config = match BrokerConfig::load(&cli, std::env::vars(), allowed_cpus) {
        Ok(config) => config,
        Err(error) => fatal(FatalReason::Config, error),
    };
    if let Err(error) = logging::init(config.log_format, &config.log_filter) {
        fatal(FatalReason::Logging, error);
    }
    announce_auth(&config);
    announce_tls(&config);
    // Parsed before anything touches the disk: a bad value exits with 2.
    let armed = spool_broker::failpoint::init();
    if !armed.is_empty() {
        tracing::warn!(?armed, "failpoints armed");
    } else if cfg!(not(feature = "failpoints"))
        && std::env::var_os(spool_broker::failpoint::FAILPOINTS_ENV).is_some()
    {
        tracing::warn!("SPOOL_FAILPOINTS ignored: this spoold is built without failpoints");
    }
    // Handlers go in before the executors start so an early SIGTERM is not
    // lost (the default action would kill us mid-start).
    let stop = Arc::new(AtomicBool::new(false));
    let reload = Arc::new(AtomicBool::new(false));
    if let Err(error) = install_signal_handlers(&stop, &reload) {
        fatal(FatalReason::Signals, error);
    }
    let node = match Node::start(config, SpoolHooksFactory::default()) {
        Ok(node) => node,
        Err(error) => fatal(error.fatal_reason(), error),
    };
    // Forward the early flag into the broker's own flag. The executors see
    // the broker's flag at their next housekeeping tick (at most
    // HOUSEKEEPING_IDLE_MAX later), so polling faster than that buys nothing
    // but wake-ups of an idle process.
    let broker_stop = node.broker().stop_flag();
    let coordinator = node.coordinator();
    std::thread::Builder::new()
        .name("spool-signals".to_owned())
        .spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::sleep(SIGNAL_POLL);
                if reload.swap(false, std::sync::atomic::Ordering::AcqRel) {
                    tracing::info!("SIGHUP: reloading the auth file");
                    // Logged and counted by reload_auth, either way.
                    let _ = coordinator.reload_auth();
                }
            }
            broker_stop.store(true, std::sync::atomic::Ordering::Release);
        })
        .unwrap_or_else(|error| fatal(FatalReason::Signals, error));
    if let Err(error) = node.wait() {
        fatal(error.fatal_reason(), error);
    }
}

/// Says at start whether the ports speak TLS, and which.
fn announce_tls(config: &BrokerConfig) {
    let first = config.shard_listen(0);
    let last = config.shard_listen(config.shards - 1);
    match &config.tls {
        Some(tls) => tracing::info!(
            shard_ports = %format_args!("{first}..={}", last.port()),
            admin_port = ?config.admin_listen,
            "TLS ON: every shard port and the admin port speak TLS only; {}",
            spool_broker::net::tls::describe(tls.files())
        ),
        None => tracing::info!(
            shard_ports = %format_args!("{first}..={}", last.port()),
            "TLS off: the shard ports and the admin port are plain TCP; set tls_cert_file and \
             tls_key_file to turn it on"
        ),
    }
}

/// Says at start whether clients must authenticate: loudly when they need
/// not (the single-node default), so an exposed broker is noticed.
fn announce_auth(config: &BrokerConfig) {
    match config.auth_file.as_deref() {
        Some(path) if config.auth.is_enabled() => tracing::info!(
            auth_file = %path.display(),
            principals = config.auth.principal_count(),
            "authentication ON: every connection must authenticate; ACLs apply"
        ),
        _ => tracing::warn!(
            listen = %config.listen,
            admin_listen = ?config.admin_listen,
            "AUTHENTICATION IS OFF: any process that reaches the shard ports or the admin port \
             can create, purge and delete every queue; set auth_file (--auth-file, \
             SPOOL_AUTH_FILE) to turn it on (docs/operations.md, \"Authentication and ACLs\")"
        ),
    }
}
