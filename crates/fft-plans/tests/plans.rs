//! The planners through their public calls. An integration test, not a unit test: a unit
//! test would compile the whole crate (every rustfft algorithm) once more in test mode,
//! 25 s of CI's build; this binary only links it.

use fft_plans::{F32Planner, F64Planner};
use rustfft::num_complex::Complex;
use std::sync::Arc;

#[test]
fn a_kept_planner_reuses_its_plan_and_the_transform_is_forward() {
    let mut planner = F32Planner::default();
    let plan = planner.forward(8);
    assert!(
        Arc::ptr_eq(&plan, &planner.forward(8)),
        "a size is planned once"
    );
    // One cycle over 8 points: all of it in bin 1 for a forward transform (e^{-iωt}).
    let mut x: Vec<Complex<f32>> = (0..8)
        .map(|t| Complex::from_polar(1.0, std::f32::consts::TAU * t as f32 / 8.0))
        .collect();
    plan.process(&mut x);
    for (bin, v) in x.iter().enumerate() {
        let want = if bin == 1 { 8.0 } else { 0.0 };
        assert!((v.norm() - want).abs() < 1e-5, "bin {bin}: {v}");
    }
    let mut wide = vec![Complex::new(1.0f64, 0.0); 6];
    F64Planner::default().forward(6).process(&mut wide);
    assert!((wide[0].re - 6.0).abs() < 1e-12 && wide[1..].iter().all(|v| v.norm() < 1e-12));
}
