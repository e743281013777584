//! Row lookups in a resident embedding table: out[i] = table[ids[i]], rounded to the
//! output dtype. The device keeps the table cached between requests (`cached_table`,
//! under the table's key), so a lookup uploads only its ids. A gather is exact: both
//! backends give the same bits.

use super::precision::Dtype;
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::invalid::{FieldPath, Invalid};
use crate::wire::Array;
use rayon::prelude::*;

#[derive(Clone, Debug)]
pub struct LookupJob {
    /// Where devices cache the table (unique per table).
    pub key: String,
    /// `vocab × dim` values, row-major: a resident tensor's, shared with it (`Array::shared`:
    /// clones read the same memory).
    pub table: Array<f32>,
    pub dim: usize,
    pub ids: Vec<u32>,
    pub output: Dtype,
}

impl LookupJob {
    /// Checks every id is a row of the table; `ids` paths index the request's flat ids.
    pub fn new(
        key: String,
        table: Array<f32>,
        dim: usize,
        ids: Vec<u32>,
        output: Dtype,
    ) -> Result<Self, Invalid> {
        let vocab = table.len() / dim.max(1);
        if let Some(i) = ids.iter().position(|&id| id as usize >= vocab) {
            return Err(Invalid::new(
                FieldPath::root().field("ids").index(i),
                format!("id {} is not a row of the table (vocab {vocab})", ids[i]),
            ));
        }
        Ok(Self {
            key,
            table,
            dim,
            ids,
            output,
        })
    }

    pub fn round(&self, values: &mut [f32]) {
        self.output.round_all(values);
    }

    pub fn run_cpu(&self) -> Vec<f32> {
        let d = self.dim;
        let mut out = vec![0f32; self.ids.len() * d];
        out.par_chunks_mut(d)
            .zip(&self.ids)
            .with_min_len(256)
            .for_each(|(row, &id)| row.copy_from_slice(&self.table[id as usize * d..][..d]));
        self.round(&mut out);
        out
    }
}

impl Job for LookupJob {
    /// `ids × dim` values, row-major, in the output dtype.
    type Output = Vec<f32>;

    fn name(&self) -> &'static str {
        "embeddings_lookup"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.output.name().into()
    }

    fn size(&self) -> usize {
        self.ids.len() * self.dim
    }

    /// The ids: the table is already resident (or uploaded once on a miss).
    fn input_bytes(&self) -> usize {
        4 * self.ids.len()
    }

    /// A copy of a row costs the CPU little: 2^20 values and up go to the device, where
    /// the table stays between requests.
    fn gpu_threshold(&self) -> usize {
        1 << 20
    }

    fn run_cpu(&self) -> Vec<f32> {
        LookupJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Vec<f32>, DeviceError> {
        super::gpu::launch_lookup(self, dev)
    }

    /// A gather moves values without arithmetic: bit for bit.
    fn agrees(&self, device: &Vec<f32>, cpu: &Vec<f32>) -> Result<(), String> {
        if device.len() != cpu.len() {
            return Err(format!(
                "{} values where the CPU has {}",
                device.len(),
                cpu.len()
            ));
        }
        match (0..cpu.len()).find(|&i| device[i].to_bits() != cpu[i].to_bits()) {
            None => Ok(()),
            Some(i) => Err(format!(
                "value {i}: device {} against CPU {}",
                device[i], cpu[i]
            )),
        }
    }
}
