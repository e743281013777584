//! `POST /rf/iq`: one sample's recordings generated alone, by seed and generator index,
//! for users who want recordings without a dataset job: every receiver's IQ and the
//! sample's truth. The CPU twin is `generate::generate`; on a device the waveform and the
//! recordings are made by `rf_waveform` and `rf_receive`, the dataset path's kernels
//! without its reduction. The same (scenario, seed, index) gives the recordings a dataset
//! of that seed and scenario holds for that generator index.

use super::generate::{draft, plan, receive, samples_per_recording, RxTruth, TxTruth};
use super::gpu::{launch_receive, pack_drafts, unpack};
use super::rng::dataset_key;
use super::scenario::Scenario;
use crate::backend::measure::{CaseInfo, CheckLevel};
use crate::backend::{DeviceError, DeviceLease, Job};
use rayon::prelude::*;
use rustfft::num_complex::Complex32;

/// The op's name in metrics, self-tests and quarantine.
pub const IQ_OP: &str = "rf_iq";

/// How far a device recording may be from the CPU's: each value within this fraction of
/// the CPU recording's RMS. The device's waveform is within 1e-6 of the CPU's (of a unit
/// amplitude) and `rf_receive` within 2e-7 relative of the CPU loop, so a recording's
/// error is a few 1e-6 of its signal and far below its noise.
pub const RECORDING_TOLERANCE: f64 = 1e-5;

/// Sample `sample_index` of the scenario keyed by `seed`, recordings and truth.
pub struct RecordingsJob {
    pub scenario: Scenario,
    pub seed: u64,
    pub sample_index: u64,
}

/// One sample: its transmitter, its receivers and one recording per receiver.
#[derive(Clone, Debug)]
pub struct Recordings {
    pub tx: TxTruth,
    pub receivers: Vec<RxTruth>,
    pub iq: Vec<Vec<Complex32>>,
}

impl RecordingsJob {
    /// The most complex samples the job can produce: every receiver slot's recording (a
    /// sample may draw fewer receivers than `receivers_max`).
    pub fn max_samples(&self) -> usize {
        self.scenario
            .receiver_slots()
            .saturating_mul(samples_per_recording(&self.scenario))
    }
}

impl Job for RecordingsJob {
    type Output = Recordings;

    fn name(&self) -> &'static str {
        IQ_OP
    }

    fn size(&self) -> usize {
        self.max_samples()
    }

    /// The request carries no bulk input; what the job moves is the recordings it writes.
    fn input_bytes(&self) -> usize {
        8 * self.max_samples()
    }

    /// Measured on an H200 host (2026-11-28, `gpu-ops check`, receivers made one after
    /// another then): 640 000 samples took 6.5 ms on the CPU and 1.5 ms on the device
    /// round trip; 16 million took 250 ms and 188 ms (most of it the copy back). With the
    /// receivers in parallel the CPU is several times faster on many cores, so the device
    /// is asked for from a million samples.
    fn gpu_threshold(&self) -> usize {
        1 << 20
    }

    /// `generate::generate` with the receivers in parallel: each recording reads only its
    /// own streams, so the bits are the same.
    fn run_cpu(&self) -> Recordings {
        let plan = plan(&self.scenario, dataset_key(self.seed), self.sample_index);
        let iq = plan
            .plans
            .par_iter()
            .map(|p| receive(p, &plan.wave))
            .collect();
        Recordings {
            tx: plan.tx,
            receivers: plan.receivers,
            iq,
        }
    }

    /// The draws on the CPU (`generate::draft`), the waveform and every receiver's
    /// recording on the device.
    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Recordings, DeviceError> {
        let plan = draft(&self.scenario, dataset_key(self.seed), self.sample_index);
        let batch = pack_drafts(&[&plan]);
        let out = launch_receive(&batch, dev)?;
        let iq = unpack(&batch, &out).pop().unwrap_or_default();
        Ok(Recordings {
            tx: plan.tx,
            receivers: plan.receivers,
            iq,
        })
    }

    /// The same truth (drawn on the CPU either way) and recordings within
    /// `RECORDING_TOLERANCE` of the CPU recording's RMS.
    fn agrees(&self, device: &Recordings, cpu: &Recordings) -> Result<(), String> {
        if device.tx != cpu.tx || device.receivers != cpu.receivers {
            return Err("the truth differs".into());
        }
        if device.iq.len() != cpu.iq.len() {
            return Err(format!(
                "{} recordings vs {}",
                device.iq.len(),
                cpu.iq.len()
            ));
        }
        for (r, (d, c)) in device.iq.iter().zip(&cpu.iq).enumerate() {
            recording_agrees(d, c).map_err(|why| format!("receiver {r}: {why}"))?;
        }
        Ok(())
    }
}

/// One device recording against the CPU's: the same length, every value within
/// `RECORDING_TOLERANCE` of the CPU recording's RMS.
fn recording_agrees(device: &[Complex32], cpu: &[Complex32]) -> Result<(), String> {
    if device.len() != cpu.len() {
        return Err(format!("{} samples vs {}", device.len(), cpu.len()));
    }
    let power = cpu.iter().map(|c| f64::from(c.norm_sqr())).sum::<f64>() / cpu.len().max(1) as f64;
    let bound = RECORDING_TOLERANCE * power.sqrt();
    match device.iter().zip(cpu).position(|(d, c)| {
        let err = f64::from((d - c).norm());
        err.is_nan() || err > bound
    }) {
        None => Ok(()),
        Some(i) => Err(format!(
            "sample {i}: {} vs {} (bound {bound:e})",
            device[i], cpu[i]
        )),
    }
}

/// `gpu-ops check`'s cases: at the standard level 16 receivers × 1 s at 1 MHz (2^24
/// samples less a little: the service's --max-elements default) and 64 receivers × 50 ms
/// at 200 kHz; at the quick level (the emulated device) 3 receivers × 20 000 samples, past
/// one grid stride of `rf_receive`.
pub(crate) fn check_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, RecordingsJob)> {
    let shapes: &[(usize, f64, f64)] = match level {
        CheckLevel::Quick => &[(3, 200e3, 100.0)],
        CheckLevel::Standard => &[(16, 1e6, 1000.0), (64, 200e3, 50.0)],
    };
    shapes
        .iter()
        .enumerate()
        .map(|(i, &(receivers, fs, ms))| {
            let mut scenario = super::check_cases::scenario(receivers, fs, ms, ms.min(200.0));
            if fs > 200e3 {
                scenario.signal.bandwidth_hz = 200e3;
            }
            let job = RecordingsJob {
                scenario,
                seed: seed ^ i as u64,
                sample_index: seed % 1000,
            };
            // The recordings written once.
            let info = CaseInfo::labelled(format!(
                "{receivers} receivers × {ms} ms at {}",
                super::check_cases::rate_label(fs)
            ))
            .with_bytes(8.0 * job.max_samples() as f64);
            (info, job)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> RecordingsJob {
        let mut scenario = Scenario::default();
        scenario.signal.duration_ms = 20.0;
        scenario.chunk_ms = 20.0;
        RecordingsJob {
            scenario,
            seed: 7,
            sample_index: 3,
        }
    }

    /// What a dataset job of the same seed and scenario makes for that index.
    #[test]
    fn the_recordings_are_the_dataset_generators_for_that_index() {
        let j = job();
        let got = j.run_cpu();
        let (record, _, _) = super::super::dataset::sample(&j.scenario, dataset_key(7), 3, true);
        assert_eq!(got.tx, record.tx);
        assert_eq!(got.receivers, record.receivers);
        if let Some(kept) = record.iq {
            assert_eq!(got.iq, kept);
        }
        assert_eq!(got.iq.len(), got.receivers.len());
        let len = samples_per_recording(&j.scenario);
        assert!(got.iq.iter().all(|x| x.len() == len));
        assert!(got.iq.len() * len <= j.max_samples());
    }

    #[test]
    fn a_value_past_the_tolerance_disagrees_and_names_where() {
        let j = job();
        let cpu = j.run_cpu();
        j.agrees(&cpu, &cpu).unwrap();
        let mut off = cpu.clone();
        let x = &mut off.iq[1][500];
        let rms = (cpu.iq[1]
            .iter()
            .map(|c| f64::from(c.norm_sqr()))
            .sum::<f64>()
            / cpu.iq[1].len() as f64)
            .sqrt();
        x.re += (3.0 * RECORDING_TOLERANCE * rms) as f32;
        let why = j.agrees(&off, &cpu).unwrap_err();
        assert!(why.starts_with("receiver 1: sample 500"), "{why}");
        let mut nan = cpu.clone();
        nan.iq[0][0].im = f32::NAN;
        assert!(j.agrees(&nan, &cpu).is_err());
        let mut short = cpu.clone();
        short.iq[2].pop();
        assert!(j.agrees(&short, &cpu).is_err());
        let mut moved = cpu.clone();
        moved.tx.power_dbm += 1.0;
        assert_eq!(j.agrees(&moved, &cpu).unwrap_err(), "the truth differs");
    }
}
