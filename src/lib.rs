//! gpu-ops: GPU operations behind REST, with a CPU fallback that gives the same answers.
//!
//! `App::start` builds everything; tests use it in-process and over a real socket.
//!
//! The `openapi` feature (on by default) is the HTTP service: the API, its OpenAPI
//! schemas and `App`. Without it the library is the domains, the engines, the pool and
//! the stores, and none of them names `utoipa` (CI compiles the library and its unit
//! tests with `--no-default-features`): the domains' schema derives are `cfg_attr`s of
//! the feature.

#[cfg(feature = "openapi")]
pub mod api;
#[cfg(feature = "openapi")]
mod app;
pub mod arrays;
pub mod backend;
pub mod bench;
pub mod check;
pub mod config;
pub mod datasets;
mod durable;
pub mod huge_pages;
#[cfg(test)]
mod layering;
pub mod metrics;
pub mod new_key;
pub mod ops;
pub mod pool;
pub mod secagg_client;
#[cfg(feature = "openapi")]
mod serve;
pub mod skips;
pub mod store;
pub mod tables;
pub mod wire;

#[cfg(feature = "openapi")]
pub use app::App;

/// Pretend memory of the `--emulate-device` device: allocations are real host memory.
pub(crate) const EMULATED_DEVICE_BYTES: u64 = 1 << 30;
