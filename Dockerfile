# Build in a Rust image; run on a CUDA runtime image, which carries libnvrtc for
# compiling the kernels at start-up (CUDA 12.9 PTX loads on drivers >= 575).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin gpu-ops

FROM nvidia/cuda:12.9.1-runtime-ubuntu24.04
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /data gpuops \
 && mkdir -p /data && chown gpuops /data
COPY --from=build /src/target/release/gpu-ops /usr/local/bin/gpu-ops
USER gpuops
ENV GPU_OPS_BIND=0.0.0.0:8080 \
    GPU_OPS_DATA_DIR=/data \
    GPU_OPS_LOG_FORMAT=json
VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
  CMD curl -fsS http://127.0.0.1:8080/health/live || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["gpu-ops"]
