//! What the ops' unit tests share.

/// Deterministic values in ±[2^-6, 4), of every sign and spread over eight binades:
/// clear of f16's subnormals, where relative error bounds do not hold.
pub fn spread_values(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let unit = (s >> 11) as f64 / (1u64 << 53) as f64;
            let magnitude = 2f64.powf(-6.0 + 8.0 * unit);
            if s & 1 == 0 {
                magnitude
            } else {
                -magnitude
            }
        })
        .collect()
}

/// `gpu-ops check`'s measurement of `checks` on a fresh emulated device (one timed run),
/// printing each case; every case must agree with its CPU twin. The domains' ignored
/// `quick_level_agrees_on_the_emulated_device` tests call it.
pub fn measure_on_emulated(domain: &str, checks: Vec<Box<dyn crate::backend::verify::SelfTest>>) {
    use crate::backend::measure::Repeats;
    let dev = crate::backend::GpuDevice::emulated(0, 1 << 30);
    let lease = dev.lease().expect("the emulated device");
    let started = std::time::Instant::now();
    let once = Repeats {
        warmup: 0,
        timed: 1,
    };
    for check in &checks {
        for case in check.measure(&lease, once) {
            eprintln!(
                "{} | {} | {:.0} bytes | device {:.1} ms | CPU {:.1} ms | {:?}",
                check.op(),
                case.info.label,
                case.info.bytes.unwrap_or(0.0),
                case.device_ms.first().copied().unwrap_or(f64::NAN),
                case.cpu_ms.unwrap_or(f64::NAN),
                case.outcome
            );
            assert!(
                case.outcome.is_ok(),
                "{}: {:?}",
                case.info.label,
                case.outcome
            );
        }
    }
    eprintln!(
        "all {domain} cases: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
