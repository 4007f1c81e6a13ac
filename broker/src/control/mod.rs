//! Control plane of one broker process: configuration, the data directory's
//! lock and secret, the assignment table, the queue catalog, logging.
//!
//! Off the data path: nothing here runs per request. The assignment table is
//! pure; config, data-dir and logging touch the environment once, at start;
//! the catalog is read at start and rewritten by the coordinator on
//! each queue create/delete.

pub mod assignment;
pub mod catalog;
pub mod cluster;
pub mod config;
pub mod controller;
pub mod data_dir;
pub mod host;
pub mod layers;
pub mod logging;
