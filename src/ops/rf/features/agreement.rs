//! How far a device's features may be from the CPU's: the tolerances the device paths
//! are held to (self-tests, shadow checks, `gpu-ops check`, dataset jobs' first batch).

use super::{feature_index, ChunkFeatures, Stats, FEATURE_NAMES};

/// Whether a device's value of feature `name` agrees with the CPU's within the device
/// path's tolerance: 0.1 for frequencies (Hz), 1e-3 plus `extra_db` for the rest (dB and
/// ratios), or 1e-6 relative; equal values (infinities included) always agree.
fn value_agrees(name: &str, device: f64, cpu: f64, extra_db: f64) -> bool {
    let d = (device - cpu).abs();
    d <= tolerance(name, extra_db) || d <= 1e-6 * cpu.abs() || device == cpu
}

fn tolerance(name: &str, extra_db: f64) -> f64 {
    // A frequency, not a density such as psd_dbm_per_hz (dB, held to 1e-3 like the rest).
    if name.ends_with("_hz") && !name.ends_with("_per_hz") {
        0.1
    } else {
        1e-3 + extra_db
    }
}

/// The features read from the noise floor N₀ itself: where N₀ nears the transform's
/// resolution, two f32 transforms (rustfft here, the kernel's radix 2 on a device) put it
/// apart by up to `floor_allowance_db`.
pub const FLOOR_FEATURES: [&str; 3] = ["noise_floor_dbm", "snr_db", "psd_dbm_per_hz"];

/// f32's unit roundoff, 2^-24.
const F32_UNIT_ROUNDOFF: f64 = 1.0 / (1u64 << 24) as f64;

/// How far (dB) two f32 transforms of one chunk may put its noise floor apart, besides
/// 1e-3 dB: 20·log10(1 + 2√r), with r = u²·log2(L)·10^(snr_db/10) and u = 2^-24. An f32 FFT
/// of L points errs by about u·√(log2 L) of the segment's amplitude in every bin; against a
/// floor snr_db under the chunk's power that is √r of the floor's amplitude, twice that
/// between two transforms that err independently, so each bin, and the quartile read from
/// them, may move by (1 + 2√r)² in power. Under 0.004 dB at 60 dB (L = 4096); 0.17 dB at
/// 95 dB and 0.9 dB at 110 dB, where the floor is largely the transforms' own rounding on
/// either side (docs/RF_FEATURES.md, "Precision"). Between the emulated kernel and
/// rustfft the floor stays within about a sixth of this (`check_cases`' tests).
pub fn floor_allowance_db(snr_db: f64, segment_len: usize) -> f64 {
    if !snr_db.is_finite() {
        return 0.0;
    }
    let log2_len = (segment_len.max(2) as f64).log2();
    let r = F32_UNIT_ROUNDOFF * F32_UNIT_ROUNDOFF * log2_len * 10f64.powf(snr_db / 10.0);
    20.0 * (1.0 + 2.0 * r.sqrt()).log10()
}

/// Whether a device's chunk agrees with the CPU's: frequencies within 0.1 Hz, the rest
/// within 1e-3 (dB and ratios) or 1e-6 relative, the floor's features within
/// `floor_allowance_db` more, taken at the CPU's `snr_db`. Equal values always agree.
pub fn chunk_agrees(
    device: &ChunkFeatures,
    cpu: &ChunkFeatures,
    segment_len: usize,
) -> Result<(), String> {
    let snr = cpu[feature_index("snr_db")];
    let extra = floor_allowance_db(snr, segment_len);
    for (name, (x, y)) in FEATURE_NAMES.iter().zip(device.iter().zip(cpu)) {
        let extra_db = if FLOOR_FEATURES.contains(name) {
            extra
        } else {
            0.0
        };
        if !value_agrees(name, *x, *y, extra_db) {
            return Err(format!(
                "{name}: {x} on the device, {y} on the CPU (bound {:.3e})",
                tolerance(name, extra_db)
            ));
        }
    }
    Ok(())
}

/// Whether two summaries of one recording's chunks agree: each statistic of each feature
/// as `chunk_agrees` holds a chunk's, the floor's allowance taken at the CPU's largest
/// `snr_db` of any chunk.
pub fn stats_agree(device: &[Stats], cpu: &[Stats], segment_len: usize) -> Result<(), String> {
    let snr = cpu.get(feature_index("snr_db")).map_or(f64::NAN, |s| s.max);
    let extra = floor_allowance_db(snr, segment_len);
    for (name, (x, y)) in FEATURE_NAMES.iter().zip(device.iter().zip(cpu)) {
        let extra_db = if FLOOR_FEATURES.contains(name) {
            extra
        } else {
            0.0
        };
        for (what, u, v) in [
            ("mean", x.mean, y.mean),
            ("std", x.std, y.std),
            ("min", x.min, y.min),
            ("max", x.max, y.max),
        ] {
            if !value_agrees(name, u, v, extra_db) {
                return Err(format!("{name} {what}: {u} vs {v}"));
            }
        }
    }
    Ok(())
}
