# syntax=docker/dockerfile:1
# Build in a Rust image; run on NVIDIA's CUDA runtime image with cuDNN. Its CUDA is the
# one the binary's bindings are built for (cudarc's `cuda-13000`), and it carries what the
# service loads at start-up: libnvrtc (the kernels compiled for the device's exact
# architecture), libcublasLt (matmul's library engine) and libcudnn 9 (conv2d's). CUDA 13
# needs an NVIDIA driver >= 580 on the host. Without a GPU the same image serves
# everything on the CPU fallback. `docker run … gpu-ops check` proves a new GPU host.
#
# AMD GPUs: the same binary, on a ROCm image that carries libamdhip64 and hipRTC, e.g.
#   docker build --build-arg RUNTIME_IMAGE=rocm/dev-ubuntu-24.04:6.4 -t gpu-ops:rocm .
#   docker run --device /dev/kfd --device /dev/dri --group-add video … gpu-ops:rocm
# (docs/GPU.md, "AMD GPUs": no AMD GPU has run the HIP engine yet). The runtime image
# must have glibc 2.36 or later, as the build stage's Debian 12 does.
ARG RUNTIME_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir between builds; the binary is copied
# out of the cached target dir so the next stage can see it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin gpu-ops \
 && install -D -m 0755 target/release/gpu-ops /out/gpu-ops

FROM ${RUNTIME_IMAGE}
# No toolchain and no curl: the health check is the binary's own `healthcheck`.
RUN useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin gpuops \
 && mkdir -p /data /keys \
 && chown gpuops /data /keys
COPY --from=build /out/gpu-ops /usr/local/bin/gpu-ops
USER 10001
# glibc.malloc.hugetlb=1: malloc advises transparent huge pages on its mappings and heap, so
# a large body and its decoded vectors fault in 2 MiB at a time rather than 4 KiB (JSON
# bulk ingest 12-14 % faster, docs/PERFORMANCE.md; no effect where the host's THP is off).
# Bound to every interface, the server refuses to start without keys: mount a key file and
# set GPU_OPS_API_KEYS_FILE (`gpu-ops new-key --tenant NAME --file FILE` makes one), or set
# GPU_OPS_ALLOW_UNAUTHENTICATED=true behind something that authenticates.
ENV GLIBC_TUNABLES=glibc.malloc.hugetlb=1 \
    GPU_OPS_BIND=0.0.0.0:8080 \
    GPU_OPS_DATA_DIR=/data \
    GPU_OPS_LOG_FORMAT=json \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["gpu-ops", "healthcheck", "--addr", "127.0.0.1:8080"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["gpu-ops"]
