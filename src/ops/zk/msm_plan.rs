//! The MSM's plan: window size, bucket and reduction layout for a chunk of points, shared
//! by the device launcher (`msm_gpu.rs`) and the kernels' host build.

use crate::backend::GpuDevice;

/// `MsmPlan::for_device`'s loops on a device that bounds them.
const SHORT_SEGMENT: u32 = 32;
const SHORT_CHUNK: u32 = 64;

/// Points one pass takes on a device that bounds its loops. A grid-stride kernel's
/// thread takes a further chunk each time the work wraps the grid
/// (`DeviceLease::launch_config` caps it at 32 blocks of 256 a unit, 2^19 threads at
/// wgpu's nominal 64 units), and llvmpipe counts those loops too: at 2^19 points or
/// fewer every bucket-sum thread has one chunk (`short_loop_passes_fit_one_grid`).
pub(crate) const SHORT_LOOP_PASS: usize = 1 << 19;

/// Window size and reduction layout for `n` points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MsmPlan {
    /// Window bits.
    pub c: u32,
    /// Digit windows of a scalar.
    pub windows: u32,
    /// Multiples of each point the MSM adds (`with_multiples`): block j of the points is
    /// 2^(c·block_windows·j) times block 0, the points themselves; 1 without.
    pub blocks: u32,
    /// The buckets' windows: a block's share of the digit windows, ⌈windows / blocks⌉
    /// (the last block's share padded with zero digits).
    pub block_windows: u32,
    /// Buckets per window: signed digits need 2^(c-1).
    pub nb: u32,
    /// Buckets one reduction thread walks.
    pub seg_len: u32,
    /// Sorted entries (or partial sums) one bucket-sum thread adds, whatever the
    /// buckets' sizes (`msm_chunk_sum` in kernels/msm.cuh); at least 4, so that every
    /// level shrinks.
    pub chunk: u32,
}

impl MsmPlan {
    /// c ≈ log2(n) − 3, in [4, 16]: a few points per bucket on average, so the bucket
    /// pass has many threads with similar work and the reduction stays small. The top
    /// window holds at most c − 1 bits plus the carry, so its digit is at most 2^(c-1):
    /// kept positive (bucket nb), no carry is lost.
    pub fn new(n: usize, scalar_bits: u32) -> Self {
        let log2 = usize::BITS - n.max(1).leading_zeros();
        let c = (log2 as i32 - 3).clamp(4, 16) as u32;
        let nb = 1 << (c - 1);
        let windows = scalar_bits / c + 1;
        Self {
            c,
            windows,
            blocks: 1,
            block_windows: windows,
            nb,
            seg_len: nb.min(256),
            chunk: chunk_for(n, nb),
        }
    }

    /// The plan over `factor` precomputed multiples of each of the `n` points (at most
    /// as many as there are windows; 1 or 0: the plan as it is): the same digits and
    /// window size, ⌈windows / factor⌉ bucket windows, so fewer buckets to sort and
    /// reduce and fewer windows to combine, for `factor` times the points in memory.
    pub fn with_multiples(self, n: usize, factor: u32) -> Self {
        let block_windows = self.windows.div_ceil(factor.clamp(1, self.windows));
        let blocks = self.windows.div_ceil(block_windows);
        Self {
            blocks,
            block_windows,
            // Each bucket takes entries from every block's points. (Not for a device that
            // bounds its loops: `for_device`'s shorter chunks are not kept.)
            chunk: chunk_for(n * blocks as usize, self.nb),
            ..self
        }
    }

    /// The doublings between one block of multiples and the next.
    pub fn block_shift(&self) -> u32 {
        self.c * self.block_windows
    }

    /// The plan for `n` points on `dev`: shorter per-thread loops where its driver ends
    /// long ones early (`GpuDevice::bounds_loop_iterations`, llvmpipe: 65,535 iterations
    /// for all the lanes run together, about 210 for one BLS12-381 addition). Each
    /// reduction thread walks 32 buckets (128 additions) and each bucket-sum thread adds
    /// 64 items, so that two lanes' worth of divergent work still fits.
    pub fn for_device(n: usize, scalar_bits: u32, dev: &GpuDevice) -> Self {
        let plan = Self::new(n, scalar_bits);
        if !dev.bounds_loop_iterations() {
            return plan;
        }
        Self {
            seg_len: plan.seg_len.min(SHORT_SEGMENT),
            chunk: plan.chunk.min(SHORT_CHUNK),
            ..plan
        }
    }

    /// Entries a chunk of `n` points can sort: one per point, block and bucket window at
    /// most (with one block, one per point and digit window).
    pub fn terms(&self, n: usize) -> usize {
        n * (self.blocks * self.block_windows) as usize
    }

    /// The lengths of the slot sequences that the levels after the first reduce, for
    /// `terms` entries: each level leaves two slots per chunk, until one chunk holds all.
    pub fn levels(&self, terms: usize) -> Vec<usize> {
        assert!(self.chunk >= 4, "a chunk of 4 or more shrinks every level");
        let chunk = self.chunk as usize;
        let mut lens = Vec::new();
        let mut len = terms;
        while len > chunk {
            len = 2 * len.div_ceil(chunk);
            lens.push(len);
        }
        lens
    }

    /// Slots of the two sequences the levels alternate between: the first level's
    /// output, and the second's (every later level is shorter than one of them).
    pub(crate) fn slot_buffers(&self, terms: usize) -> (usize, usize) {
        let first = 2 * terms.div_ceil(self.chunk as usize).max(1);
        (first, 2 * first.div_ceil(self.chunk as usize))
    }

    pub fn segments(&self) -> u32 {
        self.nb.div_ceil(self.seg_len)
    }

    pub fn buckets(&self) -> usize {
        (self.block_windows * self.nb) as usize
    }

    /// Segment sums the reduction returns.
    pub fn partials(&self) -> usize {
        (self.block_windows * self.segments()) as usize
    }
}

/// A bucket's average share of random scalars' entries over `entries` points, so there
/// are about as many bucket-sum threads as buckets; capped so that 2^24 points still
/// have 2^20 threads.
fn chunk_for(points: usize, nb: u32) -> u32 {
    (points / nb as usize).clamp(16, 256) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_keep_the_top_window_below_half_a_window() {
        for bits in [254u32, 255] {
            for n in [1usize, 31, 1 << 10, 1 << 16, 1 << 20, 1 << 26] {
                let p = MsmPlan::new(n, bits);
                assert!((4..=16).contains(&p.c));
                // The top window holds bits − (windows − 1)·c ≤ c − 1 bits.
                assert!(bits - (p.windows - 1) * p.c < p.c, "{p:?}");
                assert!((p.windows - 1) * p.c < bits, "an empty top window: {p:?}");
                assert_eq!(p.segments() * p.seg_len, p.nb);
                let short = MsmPlan {
                    seg_len: p.seg_len.min(SHORT_SEGMENT),
                    chunk: p.chunk.min(SHORT_CHUNK),
                    ..p
                };
                assert_eq!(short.segments() * short.seg_len, short.nb);
            }
        }
        assert_eq!(MsmPlan::new(1 << 20, 254).c, 16);
        assert_eq!(MsmPlan::new(1 << 10, 254).c, 8);
    }

    /// Multiples leave ⌈windows / factor⌉ bucket windows, no block without a digit
    /// window, and every digit a slot; a factor past the windows is clamped, and 1
    /// changes nothing.
    #[test]
    fn multiples_cover_every_window_with_fewer_buckets() {
        for bits in [254u32, 255] {
            for n in [1usize, 300, 1 << 16, 1 << 20] {
                let plain = MsmPlan::new(n, bits);
                assert_eq!(plain.with_multiples(n, 1), plain);
                for factor in [2u32, 3, 4, 5, 8, 16, 100] {
                    let p = plain.with_multiples(n, factor);
                    assert_eq!(
                        p.block_windows,
                        plain.windows.div_ceil(factor.min(plain.windows))
                    );
                    assert!(p.blocks * p.block_windows >= p.windows, "{p:?}");
                    assert!(
                        (p.blocks - 1) * p.block_windows < p.windows,
                        "an empty block: {p:?}"
                    );
                    assert_eq!(p.buckets(), (p.block_windows * p.nb) as usize);
                    assert_eq!(p.terms(n), n * (p.blocks * p.block_windows) as usize);
                    assert_eq!(p.block_shift(), p.c * p.block_windows);
                    assert!(p.buckets() < plain.buckets() || p.blocks == 1, "{p:?}");
                    assert!(p.chunk >= plain.chunk);
                }
            }
        }
    }

    /// A pass of SHORT_LOOP_PASS points or fewer on a device that bounds its loops gives
    /// every bucket-sum thread one chunk and every reduction thread one segment: no
    /// grid-stride wrap adds a second to one thread's loops.
    #[test]
    fn short_loop_passes_fit_one_grid() {
        let grid = 64 * 32 * 256; // DeviceLease::launch_config at wgpu's nominal 64 units
        for bits in [254u32, 255] {
            for log2 in 1..=19 {
                let k = 1usize << log2;
                for n in [k - 1, k, k + 1, k + k / 2, 2 * k - 1] {
                    let n = n.min(SHORT_LOOP_PASS);
                    let p = MsmPlan::new(n, bits);
                    let chunk = p.chunk.min(SHORT_CHUNK) as usize;
                    assert!(p.terms(n).div_ceil(chunk) <= grid, "n = {n}");
                    let segs = p.nb.div_ceil(p.seg_len.min(SHORT_SEGMENT));
                    assert!((p.windows * segs) as usize <= grid, "n = {n}");
                }
            }
        }
    }
}
