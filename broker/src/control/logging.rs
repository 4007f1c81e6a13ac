//! Process-wide structured logging (tracing + tracing-subscriber).
//!
//! Owns the subscriber: human lines by default, JSON lines on request, the
//! level filter from the config, and one content filter: glommio logs a
//! harmless error when it probes io_uring poll support on a virtio disk
//! (ARCHITECTURE.md, "Platform notes"); that line is dropped so operators do not
//! chase it. glommio logs through the `log` crate; tracing-subscriber's
//! `tracing-log` bridge forwards those records here.
//!
//! Human lines are coloured only when stderr is a terminal and `NO_COLOR`
//! is unset or empty (<https://no-color.org>), so a log written to a file
//! or a pipe holds no escape sequences.

use std::ffi::OsStr;
use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Metadata};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::control::config::LogFormat;

/// Text that identifies glommio's harmless iopoll probe error.
pub const IOPOLL_PROBE_MARKER: &str = "probing iopoll support";

/// Logging could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoggingError {
    #[error("invalid log filter {filter:?}: {reason}")]
    Filter { filter: String, reason: String },
    #[error("a global logger is already installed: {0}")]
    AlreadyInstalled(String),
}

/// Drops events whose message contains [`IOPOLL_PROBE_MARKER`].
#[derive(Debug, Clone, Copy, Default)]
pub struct IopollProbeFilter;

struct MessageContains {
    needle: &'static str,
    found: bool,
}

impl Visit for MessageContains {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" && value.contains(self.needle) {
            self.found = true;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // The `message` field of a formatted event arrives as fmt::Arguments,
        // through record_debug. Only format it when it is the message.
        if field.name() == "message" && format!("{value:?}").contains(self.needle) {
            self.found = true;
        }
    }
}

impl IopollProbeFilter {
    /// Whether `event` is the iopoll probe line.
    pub fn is_probe_line(event: &Event<'_>) -> bool {
        let mut visitor = MessageContains { needle: IOPOLL_PROBE_MARKER, found: false };
        event.record(&mut visitor);
        visitor.found
    }
}

impl<S> Filter<S> for IopollProbeFilter {
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        !Self::is_probe_line(event)
    }
}

/// Whether human log lines carry ANSI colour: only on a terminal, and only
/// while `NO_COLOR` (its value as given) is unset or empty.
pub fn colour_enabled(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Installs the global subscriber writing to stderr.
///
/// # Errors
/// [`LoggingError`] if the filter does not parse or a logger is installed.
pub fn init(format: LogFormat, filter: &str) -> Result<(), LoggingError> {
    let env_filter = EnvFilter::try_new(filter).map_err(|error| LoggingError::Filter {
        filter: filter.to_owned(),
        reason: error.to_string(),
    })?;
    let registry = tracing_subscriber::registry().with(env_filter);
    let ansi =
        colour_enabled(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    let result = match format {
        LogFormat::Human => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(ansi)
                    .with_thread_names(true)
                    .with_filter(IopollProbeFilter),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr)
                    .with_ansi(false)
                    .with_thread_names(true)
                    .with_filter(IopollProbeFilter),
            )
            .try_init(),
    };
    result.map_err(|error| LoggingError::AlreadyInstalled(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    // Goal: colour only on a terminal without NO_COLOR. Method: every
    // combination of terminal / NO_COLOR unset, empty, set.
    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let set = OsStr::new("1");
        let empty = OsStr::new("");
        assert!(colour_enabled(true, None));
        assert!(colour_enabled(true, Some(empty)));
        assert!(!colour_enabled(true, Some(set)));
        assert!(!colour_enabled(false, None));
        assert!(!colour_enabled(false, Some(empty)));
        assert!(!colour_enabled(false, Some(set)));
    }

    // Goal: the iopoll probe line is dropped and other errors pass. Method: a
    // scoped subscriber with the filter writing into a buffer; log both.
    #[test]
    fn iopoll_probe_line_is_filtered_and_others_pass() {
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || writer.clone())
                .with_filter(IopollProbeFilter),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(
                "got unexpected error when probing iopoll support for file \"/x\" (fd: 3)"
            );
            tracing::error!("disk on fire");
        });
        let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains("iopoll"), "{text}");
        assert!(text.contains("disk on fire"), "{text}");
    }
}
