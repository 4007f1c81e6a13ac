//! Control plane of one broker process: configuration, the data directory's
//! lock and secret, the assignment table, logging.
//!
//! Off the data path: nothing here runs per request. The assignment table is
//! pure; config, data-dir and logging touch the environment once, at start.

pub mod assignment;
pub mod config;
pub mod data_dir;
pub mod logging;
