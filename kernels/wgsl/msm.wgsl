// The MSM kernels' shared words (kernels/msm.cuh): a digit's or an entry's sign bit, and
// a slot that holds no bucket's sum.
const MSM_NEG: u32 = 0x80000000u;
const MSM_NO_KEY: u32 = 0xffffffffu;
