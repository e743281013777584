// Compiles the kernels' field arithmetic and noise samplers for the host, so unit tests
// check the exact code the GPU runs against the CPU twin even on machines without a GPU.
fn main() {
    println!("cargo:rerun-if-changed=kernels");
    cc::Build::new()
        .cpp(true)
        .file("kernels/host/field_host.cpp")
        .file("kernels/host/dp_host.cpp")
        .file("kernels/host/msm_host.cpp")
        .file("kernels/host/ntt_host.cpp")
        .file("kernels/host/rf_host.cpp")
        .flag_if_supported("-ffp-contract=off")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .compile("gpu_ops_kernel_host");
}
