//! The HTTP tests: every domain's routes served in process (or, for `bench_cli`, the
//! binary against an in-process server) on the CPU backend, one module per domain, plus
//! the service as a whole (`service`: auth, limits, metrics, the spec). Nothing here needs
//! a device, PostgreSQL or an object store.

#[path = "../common/mod.rs"]
mod common;

mod arrays;
mod beams;
mod bench_cli;
mod bulk;
mod datasets;
mod device_measurements;
mod dp;
mod embedding_tables;
mod embeddings;
mod field_ops;
mod he;
mod linalg;
mod mpc;
mod msm;
mod nn;
mod recording_arrays;
mod rf;
mod secagg;
mod service;
mod tensor_arrays;
