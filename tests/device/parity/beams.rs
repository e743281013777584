//! Beam channels and sweeps, within each job's stated tolerance.

use super::on_every_device;
use gpu_ops::ops::beams::{
    Array, ChannelSpec, Channels, ChannelsJob, Codebook, MeasurementNoise, SweepJob,
};
use gpu_ops::ops::linalg::Dtype;
use gpu_ops::ops::FieldPath;

fn array(rows: usize, columns: usize) -> Array {
    Array::new(rows, columns, FieldPath::root()).unwrap()
}

fn spec(tx: Array, rx: Array, paths: usize, count: usize) -> ChannelSpec {
    ChannelSpec {
        tx,
        rx,
        paths,
        azimuth_deg: (-90.0, 90.0),
        elevation_deg: (-30.0, 30.0),
        seed: 5,
        first: 1 << 40,
        count,
    }
}

/// Linear and planar arrays, generated and uploaded channels, DFT and uploaded codebooks,
/// noise, the grid and the best pairs reduced on the device, past grid-stride wraps and
/// in passes under a memory limit.
#[test]
fn beams_agree_with_the_cpu() {
    on_every_device("beams_agree_with_the_cpu", |d| {
        for (tx, rx, paths, count) in d.sizes(
            &[
                (array(8, 8), array(1, 16), 8, 4096),
                (array(1, 64), array(4, 4), 3, 100),
            ],
            &[
                (array(1, 16), array(2, 2), 3, 40),
                (array(2, 4), array(1, 8), 1, 3),
            ],
        ) {
            let channels = ChannelsJob::new(spec(tx, rx, paths, count), Dtype::F32).unwrap();
            d.check(format!("channels {tx:?} {rx:?}"), &channels);
            let f64_channels = ChannelsJob::new(spec(tx, rx, paths, count), Dtype::F64).unwrap();
            for (uploaded, noise, grid, output) in [
                (false, None, true, Dtype::F32),
                (false, Some(0.0), false, Dtype::F32),
                (true, Some(-10.0), true, Dtype::F64),
                (true, None, false, Dtype::F64),
            ] {
                let source = if uploaded {
                    Channels::Uploaded(f64_channels.run_cpu())
                } else {
                    Channels::Generated {
                        spec: f64_channels.spec.clone(),
                        drawn: f64_channels.drawn.clone(),
                        words: f64_channels.words.clone(),
                    }
                };
                // An uploaded receive codebook: the DFT's beams, each scaled differently.
                let dft = Codebook::dft(rx, 1, FieldPath::root()).unwrap();
                let n = rx.elements();
                let scaled: Vec<f64> = dft
                    .values
                    .iter()
                    .enumerate()
                    .map(|(i, x)| x * (1.0 + (i / (2 * n)) as f64 * 0.25))
                    .collect();
                let job = SweepJob::new(
                    source,
                    1 << 40,
                    tx,
                    rx,
                    Codebook::dft(tx, 2, FieldPath::root()).unwrap(),
                    Codebook::new(scaled, n, FieldPath::root()).unwrap(),
                    noise.map(|snr_db| MeasurementNoise { snr_db, seed: 3 }),
                    grid,
                    output,
                )
                .unwrap();
                let case = format!("sweep {tx:?} {rx:?} uploaded {uploaded} noise {noise:?}");
                d.check(case, &job);
            }
        }
        d.in_passes(16 << 10, |d| {
            let s = spec(array(1, 8), array(1, 4), 2, 50);
            let channels = ChannelsJob::new(s.clone(), Dtype::F64).unwrap();
            d.check("channels in passes", &channels);
            let job = SweepJob::new(
                Channels::Generated {
                    spec: s,
                    drawn: channels.drawn.clone(),
                    words: channels.words.clone(),
                },
                1 << 40,
                array(1, 8),
                array(1, 4),
                Codebook::dft(array(1, 8), 4, FieldPath::root()).unwrap(),
                Codebook::dft(array(1, 4), 4, FieldPath::root()).unwrap(),
                Some(MeasurementNoise {
                    snr_db: 20.0,
                    seed: 9,
                }),
                false,
                Dtype::F32,
            )
            .unwrap();
            d.check("sweep in passes", &job);
        });
    });
}
