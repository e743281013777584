//! The process tests: the real binary as a process (`server`: start-up, signals, crash
//! safety, connection and memory limits), replicas sharing PostgreSQL and an S3-compatible
//! store (`scale_out`, `shared_store`, `shared_arrays`), and the shipped Prometheus configuration against a
//! running Prometheus (`observability`).

#[path = "../common/mod.rs"]
mod common;

mod observability;
mod scale_out;
mod server;
mod shared_arrays;
mod shared_store;
