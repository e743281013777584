//! What a dataset job may hold in host memory (`--dataset-memory-mib`) and ask of the
//! worker (`--max-tenant-dataset-work`).
//!
//! A batch's samples are evaluated in parallel and kept until they are accepted in index
//! order, so the batch's length bounds what is in flight: each sample is charged its
//! peak (below), and a batch holds no more samples than the budget pays for. A job whose
//! one sample passes the budget is refused at submission, and fails with the figure on a
//! replica whose budget is smaller than the one that admitted it.

use crate::ops::rf::generate::samples_per_recording;
use crate::ops::rf::scenario::Scenario;

/// An upper bound of the host bytes one sample holds at its peak, on the CPU path and in
/// what the device path copies back. With `n` complex samples per recording (8 bytes
/// each as f32 pairs) and `r` receiver slots, a sample holds the padded waveform (n),
/// the recording being evaluated (n; all r of them for `iq_raw`, kept until accepted),
/// the chunk sums of its Welch spectra (at most n: a segment is never longer than its
/// chunk) and a chunk's envelope under evaluation (at most n); the waveform's
/// synthesis, 16-byte values for n, comes before the recordings and fits within these.
pub fn sample_bytes(s: &Scenario, keep_iq: bool) -> u64 {
    let n = samples_per_recording(s) as u64;
    let recordings = if keep_iq {
        s.receiver_slots().max(1) as u64
    } else {
        1
    };
    8u64.saturating_mul(n).saturating_mul(3 + recordings)
}

/// Samples one batch may hold within `budget` bytes; `None` when not even one fits.
pub fn batch_within(per_sample: u64, budget: u64) -> Option<u64> {
    let fits = budget / per_sample.max(1);
    (fits > 0).then_some(fits)
}

/// The work a job asks of the worker: complex samples to synthesise, `num_samples` ×
/// receiver slots × samples per recording (rejected samples cost as much again; this
/// counts what was asked for).
pub fn work(s: &Scenario, num_samples: u64) -> u64 {
    num_samples
        .saturating_mul(s.receiver_slots().max(1) as u64)
        .saturating_mul(samples_per_recording(s) as u64)
}

/// `bytes` in MiB, rounded up, for messages.
pub fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_holds_what_the_budget_pays_for() {
        assert_eq!(batch_within(100, 1000), Some(10));
        assert_eq!(batch_within(100, 1099), Some(10));
        assert_eq!(batch_within(100, 100), Some(1));
        assert_eq!(batch_within(101, 100), None);
    }
}
