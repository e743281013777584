//! `kernels/rf.cuh` compiled for the host (kernels/host/rf_host.cpp) against the CPU twin
//! `generate::receive`, on packed batches exactly as `gpu::receive_cuda` uploads them.

use super::generate::{plan, receive};
use super::gpu::{pack, unpack, Batch, RfReceiver};
use super::rng::dataset_key;
use super::scenario::{Environment, Scenario};

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn gpu_ops_host_rf_receive(
        receivers: *const RfReceiver,
        count: usize,
        wave_re: *const f32,
        wave_im: *const f32,
        coeff_offset: *const i64,
        coeff_re: *const f32,
        coeff_im: *const f32,
        gains: *const f64,
        out: *mut f32,
    );
}

fn host_receive(b: &Batch) -> Vec<f32> {
    let mut out = vec![f32::NAN; 2 * b.out_len as usize];
    // SAFETY: the arrays are the packed batch's (offsets made by `pack` over them) and out
    // holds 2·out_len floats.
    unsafe {
        gpu_ops_host_rf_receive(
            b.receivers.as_ptr(),
            b.receivers.len(),
            b.wave_re.as_ptr(),
            b.wave_im.as_ptr(),
            b.coeff_offset.as_ptr(),
            b.coeff_re.as_ptr(),
            b.coeff_im.as_ptr(),
            b.gains.as_ptr(),
            out.as_mut_ptr(),
        )
    };
    out
}

#[test]
fn the_kernel_arithmetic_matches_the_cpu_twin_on_a_packed_batch() {
    let mut s = Scenario::default();
    s.signal.duration_ms = 30.0;
    s.propagation.coherence_time_ms = 7.0;
    // Urban delays reach several samples at a high rate, so the FIR has far taps too.
    s.propagation.environment = Environment::Urban;
    s.signal.sample_rate_hz = 2e6;
    s.signal.bandwidth_hz = 200e3;
    let key = dataset_key(21);
    let plans: Vec<_> = (0..4).map(|n| plan(&s, key, n)).collect();
    let batch = pack(&plans.iter().collect::<Vec<_>>());
    assert_eq!(
        batch.receivers.len(),
        plans.iter().map(|p| p.plans.len()).sum::<usize>()
    );
    let got = unpack(&batch, &host_receive(&batch));
    let (mut worst, mut identical, mut total) = (0.0f64, 0usize, 0usize);
    for (sample, recordings) in plans.iter().zip(&got) {
        for (p, rec) in sample.plans.iter().zip(recordings) {
            let want = receive(p, &sample.wave);
            assert_eq!(rec.len(), want.len());
            for (a, b) in rec.iter().zip(&want) {
                let scale = f64::from(b.norm()).max(p.noise_sigma);
                worst = worst.max(f64::from((a - b).norm()) / scale);
                identical += usize::from(a == b);
                total += 1;
            }
        }
    }
    // Only the rotation differs (direct vs recurrence, ~1e-12): at most an f32 rounding,
    // and rarely (about 1 output in 10⁴ here).
    assert!(worst < 2e-7, "worst relative difference {worst}");
    assert!(
        identical * 1000 > total * 999,
        "{identical} of {total} bit-identical"
    );
}
