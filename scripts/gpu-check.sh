#!/usr/bin/env bash
# GPU verification in two halves (see shared/GPU.md):
#   scripts/gpu-check.sh stage        on the development machine: build release binaries
#                                     and test executables into .gpu/ (git-ignored)
#   .gpu/gpu-check.sh run LOGDIR      on the GPU host (no Rust there), from the repo root:
#                                     GPU parity tests, NVRTC compile, benchmarks, the
#                                     server with curl, and the device gauges.
set -euo pipefail
cmd="${1:-}"
case "$cmd" in
stage)
  cd "$(dirname "$0")/.."
  rm -rf .gpu && mkdir -p .gpu/tests
  cargo build --release --bins
  cp target/release/gpu-ops .gpu/
  # Test and bench executables, found from cargo's JSON messages.
  cargo test --release --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] != ["bin"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do cp "$exe" ".gpu/tests/$name"; done
  cargo bench --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["bench"]:
        print(m["target"]["name"], m["executable"])' | while read -r name exe; do cp "$exe" ".gpu/bench-$name"; done
  strip .gpu/gpu-ops .gpu/bench-* .gpu/tests/* 2>/dev/null || true
  cp scripts/gpu-check.sh .gpu/
  du -sh .gpu
  ;;
run)
  logs="${2:-gpu-logs}"
  mkdir -p "$logs"
  here="$(cd "$(dirname "$0")" && pwd)"
  export RUST_BACKTRACE=1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$logs/nvidia-smi.txt" || true
  # Use the host's own NVRTC (the driver must understand the PTX it emits).
  nvrtc_dir="$(dirname "$(ldconfig -p | awk '/libnvrtc.so/{print $NF; exit}')" 2>/dev/null || true)"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $nvrtc_dir; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  status=0
  for t in gpu_parity nvrtc_compile gpu_ops; do
    echo "== test $t"
    REQUIRE_NVRTC=1 "$here/tests/$t" --nocapture --test-threads 1 2>&1 | tee "$logs/test-$t.log" || status=1
  done
  echo "== bench"
  "$here/bench-service" 2>&1 | tee "$logs/bench.md" || status=1
  echo "== bench dp"
  "$here/bench-dp" 2>&1 | tee "$logs/bench-dp.md" || status=1
  echo "== bench zk"
  BENCH_MSM_LOG2=16 "$here/bench-zk" 2>&1 | tee "$logs/bench-zk.md" || status=1
  echo "== bench rf"
  BENCH_RF_SAMPLES=16 "$here/bench-rf" 2>&1 | tee "$logs/bench-rf.md" || status=1
  echo "== server"
  "$here/gpu-ops" --bind 127.0.0.1:18080 --data-dir "$logs/data" --device-sample-interval 1s > "$logs/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -sf localhost:18080/health/ready >/dev/null && break; sleep 0.2; done
  curl -s localhost:18080/device | tee "$logs/device.json"; echo
  body='{"field":"bn254_fr","a":["2","3"],"b":["5"],"backend":"cuda"}'
  curl -s -D - localhost:18080/zk/field_mul -H 'content-type: application/json' -d "$body" | tee "$logs/curl.txt"; echo
  sleep 2
  curl -s localhost:18080/metrics | grep -E '^gpu_ops_(gpu_|device_healthy|jobs_total|fallbacks)' | tee "$logs/gauges.txt"
  kill -TERM "$pid"; wait "$pid" || status=1
  echo "== summary"; grep -hE "test result|SKIP" "$logs"/test-*.log || true
  exit $status
  ;;
*)
  echo "usage: $0 stage | run LOGDIR" >&2
  exit 2
  ;;
esac
