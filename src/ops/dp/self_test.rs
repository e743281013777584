//! The DP ops' self-tests: privatize over uneven layers with rows clipped and not, f32 and
//! f64; both releases past one grid-stride of the device. Noise is bit for bit, so a
//! fixed key is enough: no privacy rests on a self-test's values.

use super::plan::{calibrate_gaussian, calibrate_laplace, GaussianPlan};
use super::{Gradients, Mechanism, NoiseJob, NoiseKey, PrivatizeJob};
use crate::backend::verify::{JobCheck, SelfTest};

/// Rows of norms spread over 1–7, with signs and magnitudes mixed.
fn gradients(rows: usize, cols: usize) -> Vec<f64> {
    (0..rows * cols)
        .map(|i| ((i as f64) * 0.618).sin() * (1.0 + (i / cols % 7) as f64) / (cols as f64).sqrt())
        .collect()
}

pub(crate) fn self_tests() -> Vec<Box<dyn SelfTest>> {
    let key = NoiseKey::from_seed(18);
    let (rows, cols) = (5, 1000);
    let g = gradients(rows, cols);
    let layers = [
        (vec![0, cols as u64], vec![2.0]),
        (vec![0, 1, 300, cols as u64], vec![0.5, 1.0, 2.0]),
    ];
    let mut privatize = Vec::new();
    for (bounds, clip_norms) in layers {
        let c = clip_norms.iter().map(|x| x * x).sum::<f64>().sqrt();
        let plan = GaussianPlan::new(1.1 * c, c / 1024.0 / (cols as f64).sqrt())
            .expect("a positive, finite sigma");
        for gradients in [
            Gradients::F32(g.iter().map(|&x| x as f32).collect::<Vec<_>>().into()),
            Gradients::F64(g.clone().into()),
        ] {
            privatize.push(PrivatizeJob {
                gradients,
                rows,
                cols,
                bounds: bounds.clone(),
                clip_norms: clip_norms.clone(),
                plan,
                divisor: rows as f64,
                key,
            });
        }
    }
    let values: Vec<f64> = (0..3000).map(|i| (i as f64).sqrt() - 20.0).collect();
    let release = |mechanism| {
        JobCheck::boxed(vec![NoiseJob {
            values: values.clone(),
            mechanism,
            key,
        }])
    };
    let gaussian = calibrate_gaussian(values.len(), 1.0, 0.7, 1e-6).expect("valid parameters");
    let laplace = calibrate_laplace(values.len(), 1.0, 0.7).expect("valid parameters");
    vec![
        JobCheck::boxed(privatize),
        release(Mechanism::Gaussian(gaussian.plan)),
        release(Mechanism::Laplace(laplace.plan)),
    ]
}
