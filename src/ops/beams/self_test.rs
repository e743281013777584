//! The beams self-tests: channels between linear and planar arrays (several paths, both
//! output dtypes, a batch past one grid stride of the steering kernel); sweeps of
//! generated and of uploaded channels with DFT (oversampled) and uploaded codebooks, with
//! and without noise, best pairs from the grid and reduced on the device.

use super::{Array, ChannelSpec, Channels, ChannelsJob, Codebook, MeasurementNoise, SweepJob};
use crate::backend::verify::{JobCheck, SelfTest};
use crate::ops::invalid::FieldPath;
use crate::ops::linalg::Dtype;

pub(crate) fn spec(tx: Array, rx: Array, paths: usize, count: usize) -> ChannelSpec {
    ChannelSpec {
        tx,
        rx,
        paths,
        azimuth_deg: (-60.0, 60.0),
        elevation_deg: (-20.0, 30.0),
        seed: 7,
        first: 3,
        count,
    }
}

pub(crate) fn array(rows: usize, columns: usize) -> Array {
    Array::new(rows, columns, FieldPath::root()).expect("a valid array")
}

/// A sweep of `spec`'s channels (generated, or formed on the CPU and uploaded).
pub(crate) fn sweep(
    spec: ChannelSpec,
    uploaded: bool,
    oversampling: usize,
    noise: Option<f64>,
    grid: bool,
    output: Dtype,
) -> SweepJob {
    let generated = ChannelsJob::new(spec.clone(), Dtype::F64).expect("a valid spec");
    let channels = if uploaded {
        Channels::Uploaded(generated.run_cpu())
    } else {
        Channels::Generated {
            spec: spec.clone(),
            drawn: generated.drawn,
            words: generated.words,
        }
    };
    let root = FieldPath::root();
    SweepJob::new(
        channels,
        spec.first,
        spec.tx,
        spec.rx,
        Codebook::dft(spec.tx, oversampling, root.clone()).expect("a DFT codebook"),
        Codebook::dft(spec.rx, oversampling, root).expect("a DFT codebook"),
        noise.map(|snr_db| MeasurementNoise { snr_db, seed: 11 }),
        grid,
        output,
    )
    .expect("a valid sweep")
}

pub(crate) fn self_tests() -> Vec<Box<dyn SelfTest>> {
    let channels = [
        (spec(array(1, 8), array(1, 4), 3, 70), Dtype::F64),
        (spec(array(2, 4), array(3, 2), 5, 9), Dtype::F32),
    ]
    .into_iter()
    .map(|(s, out)| ChannelsJob::new(s, out).expect("a valid spec"))
    .collect();
    let sweeps = vec![
        sweep(
            spec(array(1, 8), array(1, 4), 2, 5),
            false,
            2,
            None,
            true,
            Dtype::F32,
        ),
        sweep(
            spec(array(2, 3), array(1, 5), 4, 6),
            true,
            1,
            Some(5.0),
            false,
            Dtype::F64,
        ),
        sweep(
            spec(array(1, 16), array(2, 2), 1, 300),
            false,
            1,
            Some(-3.0),
            false,
            Dtype::F32,
        ),
    ];
    vec![JobCheck::boxed(channels), JobCheck::boxed(sweeps)]
}
