//! The GPU launcher for `kernels/he.cu`: the ciphertext sum.

use super::sum::{shoup, CiphertextSumJob};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::Operand;
use crate::backend::{DeviceBuffer, DeviceError, DeviceLease};

const SUM_KERNEL: &str = "he_ciphertext_sum";

pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "he",
        source: include_str!("../../../kernels/he.cu"),
        entry_points: vec![SUM_KERNEL.to_string()],
        // Residues are checked bit for bit; any float it gained would be too.
        exact_floats: true,
        nvidia_only: false,
    }
}

/// The ciphertexts streamed in chunks (`DeviceLease::stream_items`, as a reduction):
/// each chunk's rows written by the host straight into page-locked staging, uploaded and
/// added onto its lane's running sum while the other lane's chunk is copied; then lane
/// 1's sum is folded into lane 0's on the device and that one ciphertext downloaded.
/// The weights (1 where the request gave none, and one more 1 for the fold) and their
/// Shoup quotients are uploaded once.
pub fn launch_sum(job: &CiphertextSumJob, dev: &DeviceLease<'_>) -> Result<Vec<u64>, DeviceError> {
    let (per_ct, count) = (job.per_ciphertext(), job.count());
    let mut weights = job
        .weights()
        .map_or_else(|| vec![1u64; count], <[u64]>::to_vec);
    weights.push(1);
    // Shoup's quotient of each weight for each modulus, [weight][level].
    let shoup: Vec<u64> = weights
        .iter()
        .flat_map(|&w| job.moduli().iter().map(move |&q| shoup(w, q)))
        .collect();
    let d_moduli = dev.upload(job.moduli())?;
    let d_weights = dev.upload(&weights)?;
    let d_shoup = dev.upload(&shoup)?;
    // Zeroed on this lane before the stream starts, so both lanes' sums start from zero.
    let mut sums = [
        dev.alloc_zeros::<u64>(per_ct)?,
        dev.alloc_zeros::<u64>(per_ct)?,
    ];
    let fixed = 8 * (job.moduli().len() + weights.len() + shoup.len() + 2 * per_ct);
    let write = |items: std::ops::Range<usize>, into: &mut [u64]| job.write_rows(items, into);
    let rows = [Operand::written(per_ct, &write)];
    let add = |rows: &DeviceBuffer<u64>,
               sum: &mut DeviceBuffer<u64>,
               count: usize,
               first: usize|
     -> Result<(), DeviceError> {
        let (per, count, first) = (per_ct as u64, count as u32, first as u64);
        let (levels, degree) = (job.moduli().len() as u32, job.degree() as u64);
        let mut launch = dev.launch(SUM_KERNEL)?;
        launch
            .arg(rows)
            .arg(&d_moduli)
            .arg(&d_weights)
            .arg(&d_shoup)
            .arg(sum)
            .arg(&per)
            .arg(&count)
            .arg(&first)
            .arg(&levels)
            .arg(&degree);
        // SAFETY: the kernel reads `count` × per_ct residues of `rows`, `levels` moduli,
        // weights first..first + count and their quotients (`first + count` is at most
        // the weights' length), and adds onto per_ct residues of `sum`; the buffers hold
        // at least those.
        unsafe { launch.launch(dev.launch_config(per_ct)) }
    };
    dev.stream_items::<u64, u64>(count, &rows, 0, fixed, |d_rows, _, chunk| {
        add(
            &d_rows[0],
            &mut sums[chunk.lane],
            chunk.len(),
            chunk.items.start,
        )
    })?;
    // Both lanes have finished (the reduction's contract): lane 1's sum is one more
    // ciphertext of weight 1 (the last weight) for lane 0's.
    let [sum, other] = &mut sums;
    add(other, sum, 1, count)?;
    dev.download(sum)
}
