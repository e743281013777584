//! Secure aggregation (Bonawitz et al., CCS 2017) with SecAgg+ neighbourhoods (Bell et
//! al., CCS 2020): the protocol's keys, graph and share messages (`protocol`), its masks
//! and the server's unmasking job (`masks`), and the round's state machine (`round`).
//! The server and the reference client (`crate::secagg_client`) share all three.

pub mod masks;
pub mod protocol;
pub mod round;
pub mod unmask;

#[cfg(test)]
mod tests;

pub use masks::{apply_masks, MaskTerm, UnmaskJob};
