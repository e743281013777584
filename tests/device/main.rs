//! The device tests: the emulated device's execution model (`emulated_device`), every
//! domain's jobs against their CPU twins on it and on any GPU present (`parity`, one
//! harness over `Job`), the server with `--emulate-device`
//! (`emulated_http`, resident arrays' device copies in `emulated_arrays`, kept results held on the device in `emulated_kept`, and kept products in `emulated_products`), self-tests, quarantine and faults (`device_faults`), and every kernel
//! through NVRTC and ptxas (`nvrtc_compile`) and through hipRTC for AMD GPUs (`hip_compile`). CI runs this binary again under AddressSanitizer
//! and ThreadSanitizer (`.ci/run`).

#[path = "../common/mod.rs"]
mod common;

mod device_faults;
mod emulated_arrays;
mod emulated_device;
mod emulated_http;
mod emulated_kept;
mod emulated_layers;
mod emulated_products;
mod hip_compile;
mod nvrtc_compile;
mod parity;
mod placement;
mod wgpu_adapter;
