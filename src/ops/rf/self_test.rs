//! The RF ops' self-tests: `/rf/features` of a generated recording, and a dataset batch
//! (waveforms, receivers and chunk sums on the device) against the CPU's records of the
//! same samples, within the device path's tolerances; and one sample's recordings alone
//! (`/rf/iq`).

use super::dataset::{records_agree, sample, samples_on_device, segment_len, DATASET_OP};
use super::generate::generate;
use super::recordings::RecordingsJob;
use super::rng::dataset_key;
use super::scenario::Scenario;
use super::{ExtractConfig, FeaturesJob};
use crate::backend::verify::{JobCheck, SelfTest};
use crate::backend::DeviceLease;

/// A short scenario (100 ms, four receivers) that still crosses chunks and segments.
fn scenario() -> Scenario {
    let mut s = Scenario::default();
    s.signal.duration_ms = 100.0;
    s.chunk_ms = 50.0;
    (s.geometry.receivers_min, s.geometry.receivers_max) = (4, 4);
    s
}

struct DatasetCheck;

impl SelfTest for DatasetCheck {
    fn op(&self) -> &'static str {
        DATASET_OP
    }

    fn run(&self, dev: &DeviceLease<'_>) -> Result<(), String> {
        let (s, key) = (scenario(), dataset_key(18));
        let records = samples_on_device(&s, key, 0..2, false, dev)
            .map_err(|e| format!("the device failed: {e}"))?;
        for (n, got) in records.iter().enumerate() {
            records_agree(got, &sample(&s, key, n as u64, false).0, segment_len(&s))
                .map_err(|why| format!("sample {n}: {why}"))?;
        }
        Ok(())
    }
}

pub(crate) fn self_tests() -> Vec<Box<dyn SelfTest>> {
    let s = Scenario::default();
    let recording = generate(&s, dataset_key(18), 0);
    let features = FeaturesJob {
        iq: recording.iq[0].clone(),
        config: ExtractConfig {
            sample_rate_hz: s.signal.sample_rate_hz,
            chunk_ms: 150.0,
        },
    };
    let recordings = RecordingsJob {
        scenario: scenario(),
        seed: 18,
        sample_index: 1,
    };
    vec![
        JobCheck::boxed(vec![features]),
        Box::new(DatasetCheck),
        JobCheck::boxed(vec![recordings]),
    ]
}
