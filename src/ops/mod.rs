//! The domains: maths only, no HTTP. Each op has a CPU implementation (the oracle)
//! and a GPU launcher.
pub mod dp;
pub mod rf;
pub mod zk;
