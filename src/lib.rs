//! tpu-runner: keeps every chip of a Google Cloud TPU allocation busy.
//!
//! The library holds the pure parts (specs, engine) and the drivers (simulator harness, CLI).
//! See ARCHITECTURE.md for the map and its invariants.

pub mod backend;
pub mod cli;
pub mod controller;
pub mod deploy;
pub mod driver;
pub mod emulator;
pub mod engine;
pub mod files;
pub mod gcp;
pub mod objects;
pub mod parallel;
pub mod simulate;
pub mod spec;
pub mod store;
pub mod submit;
pub mod table;
pub mod worker;
