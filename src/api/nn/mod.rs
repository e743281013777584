//! `/nn/...`: neural-network layers, one file per operation.
pub mod attention;
pub mod conv2d;
