//! The GPU launcher for `kernels/he.cu`: the ciphertext sum.

use super::sum::{shoup, CiphertextSumJob};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::{DeviceError, DeviceLease};

const SUM_KERNEL: &str = "he_ciphertext_sum";

pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "he",
        source: include_str!("../../../kernels/he.cu"),
        entry_points: vec![SUM_KERNEL.to_string()],
        // Residues are checked bit for bit; any float it gained would be too.
        exact_floats: true,
    }
}

/// Uploads the ciphertexts in passes of as many as fit, summing each pass into the
/// running result with the previous pass's sum as its first "ciphertext" (weight 1).
pub fn launch_sum(job: &CiphertextSumJob, dev: &DeviceLease<'_>) -> Result<Vec<u64>, DeviceError> {
    let per_ct = job.per_ciphertext();
    let d_moduli = dev.upload(job.moduli())?;
    let levels = job.moduli().len() as u32;
    let degree = job.degree() as u64;
    let per_pass = dev
        .items_per_pass(job.count(), per_ct * 8, 2 * per_ct * 8)
        .max(1);
    let mut running: Option<Vec<u64>> = None;
    for start in (0..job.count()).step_by(per_pass) {
        dev.still_wanted()?;
        let len = per_pass.min(job.count() - start);
        let mut rows = Vec::with_capacity((len + 1) * per_ct);
        let mut weights = Vec::with_capacity(len + 1);
        if let Some(prev) = &running {
            rows.extend_from_slice(prev);
            weights.push(1u64);
        }
        job.write_rows(start..start + len, &mut rows);
        match job.weights() {
            Some(w) => weights.extend_from_slice(&w[start..start + len]),
            None => weights.extend(std::iter::repeat_n(1u64, len)),
        }
        let count = weights.len() as u32;
        // Shoup's quotient of each weight for each modulus, [count][levels].
        let shoup: Vec<u64> = weights
            .iter()
            .flat_map(|&w| job.moduli().iter().map(move |&q| shoup(w, q)))
            .collect();
        let d_rows = dev.upload(&rows)?;
        let d_weights = dev.upload(&weights)?;
        let d_shoup = dev.upload(&shoup)?;
        let mut d_out = dev.alloc_zeros::<u64>(per_ct)?;
        let per = per_ct as u64;
        let mut launch = dev.launch(SUM_KERNEL)?;
        launch
            .arg(&d_rows)
            .arg(&d_moduli)
            .arg(&d_weights)
            .arg(&d_shoup)
            .arg(&mut d_out)
            .arg(&per)
            .arg(&count)
            .arg(&levels)
            .arg(&degree);
        // SAFETY: the kernel reads `count` × per_ct residues, `levels` moduli, `count`
        // weights and `count` × `levels` quotients, and writes per_ct residues; the
        // buffers hold exactly those.
        unsafe { launch.launch(dev.launch_config(per_ct)) }?;
        running = Some(dev.download(&d_out)?);
    }
    Ok(running.unwrap_or_else(|| vec![0; per_ct]))
}
