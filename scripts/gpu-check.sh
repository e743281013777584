#!/usr/bin/env bash
# The GPU check in two halves (docs/GPU.md, "A session with a GPU"):
#
#   scripts/gpu-check.sh stage   here, with Rust: one stripped release binary and the
#                                arrays bench's, compressed,
#                                and the kernel cache filled for sm_90 (H100, H200) with
#                                NVRTC 13.0, into .gpu/ (git-ignored; at most 48 MiB).
#   scripts/gpu-check.sh run     on the GPU host, from the repository root, with .gpu/
#                                carried: `gpu-ops check --level standard`, the same shapes
#                                through PyTorch, the server with a few requests, its
#                                gauges, a short `gpu-ops bench`, the arrays bench
#                                (issue 59) and the MSM sweep (`check --msm-log2`).
#                                At most 8 files land in
#                                $OUT (default gpu-out/). No Rust, curl or network needed.
#
# `run` on a machine without a GPU (GPU_CHECK_EMULATE=1) checks the emulated device at the
# quick level instead: the dry run that proves the script before a lease is spent on it.
set -uo pipefail

NVRTC13_WHEELS=("nvidia-cuda-nvrtc==13.0.88")
STAGE_LIMIT_BYTES=$((48 << 20))
here="$(cd "$(dirname "$0")/.." && pwd)"

# Seconds since `start`, for the step log.
now() { date +%s.%N; }
took() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

stage() {
  set -e
  cd "$here"
  rm -rf .gpu && mkdir -p .gpu/data
  local t
  t=$(now)
  cargo build --release --locked --bin gpu-ops
  local built="${CARGO_TARGET_DIR:-target}/release/gpu-ops"
  echo "== release build: $(took "$t") s"
  # NVRTC of the device's CUDA major version, from a pinned wheel (as .ci/run does).
  if [ ! -x .venv-nvrtc13/bin/python ]; then
    python3 -m venv .venv-nvrtc13
  fi
  .venv-nvrtc13/bin/pip install -q --disable-pip-version-check "${NVRTC13_WHEELS[@]}"
  local nvrtc_lib
  nvrtc_lib="$(.venv-nvrtc13/bin/python - <<'EOF'
import glob, os, nvidia
roots = [os.path.join(p, '**', 'libnvrtc.so*') for p in nvidia.__path__]
hits = [h for r in roots for h in glob.glob(r, recursive=True) if 'builtins' not in h]
print(os.path.dirname(sorted(hits)[0]))
EOF
)"
  t=$(now)
  LD_LIBRARY_PATH="$nvrtc_lib" "$built" check --compile-only --arch sm_90 \
    --data-dir .gpu/data
  echo "== cubins for sm_90: $(took "$t") s"
  strip -o .gpu/gpu-ops "$built"
  xz -6 -T0 -f .gpu/gpu-ops
  # Issue 59's device figures: `cargo bench --bench arrays`'s harness, built with the
  # release profile so it reuses the library just built (`cargo bench`'s own profile
  # would compile it again).
  t=$(now)
  local bench_bin
  bench_bin="$(cargo build --release --locked --bench arrays --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "arrays" and m.get("executable"):
        print(m["executable"])')"
  [ -x "$bench_bin" ] || { echo "stage: the arrays bench was not built" >&2; exit 1; }
  strip -o .gpu/bench-arrays "$bench_bin"
  xz -6 -T0 -f .gpu/bench-arrays
  echo "== arrays bench build: $(took "$t") s"
  local bytes
  bytes=$(du -sb .gpu | cut -f1)
  echo "== .gpu/: $((bytes >> 20)) MiB (limit $((STAGE_LIMIT_BYTES >> 20)) MiB)"
  ls -l .gpu .gpu/data/kernel-cache
  if [ "$bytes" -gt "$STAGE_LIMIT_BYTES" ]; then
    echo "stage: .gpu/ is over the limit" >&2
    exit 1
  fi
  echo "Run it with the device tool: command 'scripts/gpu-check.sh run', carry ['.gpu']."
}

# The PyTorch venv's NVIDIA library folders (cuBLAS, cuBLASLt, NVRTC, cuDNN live there on
# the lent hosts, off the loader's path), then CUDA's own.
library_path() {
  local python="$1" dirs=()
  if [ -n "$python" ]; then
    mapfile -t dirs < <("$python" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
for root in nvidia.__path__:
    for d in sorted(glob.glob(os.path.join(root, '*', 'lib'))):
        print(d)
EOF
)
  fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
    [ -d "$d" ] && dirs+=("$d")
  done
  local IFS=:
  echo "${dirs[*]}"
}

# cuDNN opens its sublibraries (libcudnn_graph.so.9, ...) by soname along the loader's
# path, while cudarc opens the main library by its unversioned name first, which the
# wheels do not ship. On a host with a system cuDNN of another version (the lent H200 had
# 9.14 in /usr/lib beside the venv's 9.19, 2026-11-28) the main library of one then meets
# the sublibraries of the other: CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, and conv2d
# keeps im2col. An unversioned link to the venv's libcudnn.so.9, first on the path, keeps
# them one install (the one PyTorch uses). Prints the link's folder, if it made one.
cudnn_link() {
  local python="$1" dir="$2" lib
  [ -n "$python" ] || return 0
  lib="$("$python" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
for root in nvidia.__path__:
    hits = sorted(glob.glob(os.path.join(root, 'cudnn', 'lib', 'libcudnn.so.*')), key=len)
    if hits:
        print(hits[0])
        break
EOF
)"
  [ -n "$lib" ] || return 0
  mkdir -p "$dir" && ln -sf "$lib" "$dir/libcudnn.so" && echo "$dir"
}

# A Python with torch, if the host has one (the lent hosts keep it in a venv).
find_python() {
  local p
  for p in "${GPU_CHECK_PYTHON:-}" python3 /opt/venv/bin/python /opt/conda/bin/python \
           "$HOME"/venv/bin/python "$HOME"/.venv/bin/python /venv/bin/python; do
    if [ -z "$p" ] || ! command -v "$p" >/dev/null 2>&1; then
      continue
    fi
    if "$p" -c 'import torch' >/dev/null 2>&1; then
      echo "$p"
      return
    fi
  done
}

# One HTTP GET or POST without curl: python's urllib. Prints the status, headers of
# interest and the body.
http() {
  python3 - "$@" <<'EOF'
import sys, urllib.request
url = sys.argv[1]
data = sys.argv[2].encode() if len(sys.argv) > 2 else None
req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=120) as r:
        status, headers, body = r.status, r.headers, r.read()
except urllib.error.HTTPError as e:
    status, headers, body = e.code, e.headers, e.read()
print(status, {k: v for k, v in headers.items() if k.startswith("x-")})
# /metrics whole (its gauges and counters are grepped); other answers cut short.
text = body.decode(errors="replace")
print(text if url.endswith("/metrics") else text[:4000])
EOF
}

# Decompresses an xz file without xz (python's lzma): the GPU hosts may lack it.
unxz_to() {
  python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$1" "$2"
}

run() {
  local emulate="${GPU_CHECK_EMULATE:-0}"
  out="${OUT:-$here/gpu-out}" # global, as work and server_pid: the EXIT trap reads them
  mkdir -p "$out"
  local logs status=0
  work="$(mktemp -d)"

  logs="$work/logs"
  mkdir -p "$logs"
  # Everything below runs under its own timeout; nothing here may leave a server behind
  # (server_pid is global: the trap runs after this function has returned).
  server_pid=""
  # Killed or not, the logs come back (packed before the work folder goes), and a TERM
  # from the device call's own timeout ends the run through this trap.
  trap 'if [ -n "${server_pid:-}" ]; then kill -9 "$server_pid" 2>/dev/null; fi; if [ -d "${work:-/nonexistent}/logs" ] && [ ! -f "${out:-.}/logs.tar.gz" ]; then tar -czf "$out/logs.tar.gz" -C "$work" logs; fi; rm -rf "${work:-/nonexistent}"' EXIT
  trap 'exit 143' TERM INT
  local steps="$out/steps.txt"
  : > "$steps"
  # The whole run ends by GPU_CHECK_DEADLINE seconds (default 510: a device command may
  # take 600, and the machine's start and the files' return take their share): each step
  # gets at most what is left, and one with under 20 s left is skipped.
  local deadline
  deadline=$(( $(date +%s) + ${GPU_CHECK_DEADLINE:-510} ))
  step() { # name seconds command...
    local name="$1" limit="$2" t rc left
    shift 2
    left=$(( deadline - $(date +%s) - 10 ))
    if [ "$left" -lt 20 ]; then
      printf '%-28s skipped: the run'"'"'s deadline\n' "$name" | tee -a "$steps"
      status=1
      return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    t=$(now)
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    printf '%-28s %6s s  exit %s\n' "$name" "$(took "$t")" "$rc" | tee -a "$steps"
    [ "$rc" -eq 0 ] || status=1
    return 0
  }

  local bin="$work/gpu-ops"
  if [ -f "$here/.gpu/gpu-ops.xz" ]; then
    unxz_to "$here/.gpu/gpu-ops.xz" "$bin"
  elif [ -x "$here/.gpu/gpu-ops" ]; then
    cp "$here/.gpu/gpu-ops" "$bin"
  else
    echo "run: no .gpu/gpu-ops.xz (run 'scripts/gpu-check.sh stage' here first and carry .gpu)" >&2
    exit 2
  fi
  chmod +x "$bin"
  # The kernel cache travels read-only; the check and the server write beside it.
  mkdir -p "$work/data"
  [ -d "$here/.gpu/data/kernel-cache" ] && cp -r "$here/.gpu/data/kernel-cache" "$work/data/"

  local python level device_flag=() backend=cuda
  python="$(find_python)"
  local links
  links="$(cudnn_link "$python" "$work/lib-links")"
  export LD_LIBRARY_PATH
  LD_LIBRARY_PATH="${links:+$links:}$(library_path "$python")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ "$emulate" = 1 ]; then
    level=quick device_flag=(--emulate-device)
  else
    level=standard
  fi
  {
    date -u +"date %Y-%m-%dT%H:%M:%SZ"
    echo "host $(uname -a)"
    echo "LD_LIBRARY_PATH $LD_LIBRARY_PATH"
    echo "python ${python:-none}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
      --format=csv 2>&1 || echo "nvidia-smi: not available"
    [ -n "$python" ] && "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpu", torch.cuda.is_available())' 2>&1
  } > "$out/environment.txt"
  cat "$out/environment.txt"

  # GPU_CHECK_OPS=a,b checks only those ops (a rerun after a fix, within what is left of
  # the lease); the PyTorch comparison, server and bench steps run as always.
  local only=()
  [ -n "${GPU_CHECK_OPS:-}" ] && only=(--ops "$GPU_CHECK_OPS")
  step "check --level $level" 330 "$bin" check --level "$level" "${device_flag[@]}" "${only[@]}" \
    --data-dir "$work/data" --json "$out/check.json" --markdown "$out/check.md" \
    > "$logs/check.log" 2>&1
  tail -n 5 "$logs/check.log"

  if [ -n "$python" ] && [ -s "$out/check.json" ]; then
    local torch_device=cuda
    [ "$emulate" = 1 ] && torch_device=cpu
    step "torch_compare ($torch_device)" 150 "$python" "$here/scripts/torch_compare.py" \
      "$out/check.json" --device "$torch_device" --out "$out/torch.md" --json "$logs/torch.json" \
      > "$logs/torch.log" 2>&1
  else
    echo "torch_compare: skipped (no python with torch, or no check report)" | tee -a "$steps"
  fi

  # The server as an operator runs it, with a few requests and its gauges.
  # Limits for issue 57's privatize case below: a 1 GiB bulk body, read into page-locked
  # memory (--gpu-pinned-body-mib), 2^28 gradients.
  local port=18080 url="http://127.0.0.1:18080" serve_flags=(--backend gpu
    --max-body-bytes 2147483648 --max-inflight-body-bytes 8589934592
    --max-elements 33554432 --max-tensor-elements 268435456 --gpu-pinned-body-mib 2048)
  [ "$emulate" = 1 ] && serve_flags=(--emulate-device --backend auto "${serve_flags[@]:2}")
  "$bin" serve --bind "127.0.0.1:$port" --data-dir "$work/data" --device-sample-interval 1s \
    "${serve_flags[@]}" > "$logs/server.log" 2>&1 &
  server_pid=$!
  step "server ready" 130 bash -c "for _ in \$(seq 1 240); do
      '$bin' healthcheck --addr 127.0.0.1:$port --path /health/ready 2>/dev/null && exit 0
      kill -0 $server_pid 2>/dev/null || exit 1
      sleep 0.5
    done; exit 1"
  {
    echo "## GET /device"; http "$url/device"
    echo "## GET /device/bandwidth"; http "$url/device/bandwidth"
    echo "## POST /zk/field_mul (backend gpu)"
    http "$url/zk/field_mul" '{"field":"bn254_fr","a":["2","3"],"b":["5"],"backend":"cuda"}'
    sleep 2
    echo "## gauges"; http "$url/metrics" | grep -E '^gpu_ops_(gpu_|device_healthy|kernel_verified|jobs_total|fallbacks)'
  } > "$out/server.txt" 2>&1
  [ "$emulate" = 1 ] && backend=auto
  local dur=3s specs=("matmul 2048,2048,2048" "attention 1,8,2048,64" "ntt 1048576")
  [ "$emulate" = 1 ] && specs=("matmul 128,128,128" "attention 1,2,64,32" "ntt 4096")
  for spec in "${specs[@]}"; do
    step "bench ${spec% *}" 40 "$bin" bench --url "$url" --op "${spec% *}" --shape "${spec#* }" \
      --backend "$backend" \
      --duration "$dur" --warmup 1s >> "$out/bench.md" 2>> "$logs/bench.log"
  done
  # Issue 57's privatize aim end to end (round trip <= 30 ms on the device): 256 x 2^20
  # f32 gradients in the bulk form, their body page-locked, on the device and on the CPU
  # of the same host, one request at a time.
  local dp_shape="256,1048576"
  [ "$emulate" = 1 ] && dp_shape="16,65536"
  for side in "$backend" cpu; do
    step "bench dp_privatize ($side)" 60 "$bin" bench --url "$url" --op dp_privatize \
      --shape "$dp_shape" --wire binary --backend "$side" --concurrency 1 \
      --duration 5s --warmup 1s >> "$out/bench.md" 2>> "$logs/bench.log"
  done
  { echo "## copies after the benches"; http "$url/metrics" |
    grep -E '^gpu_ops_(device_copy_bytes_total|pinned_body|staging_)'; } >> "$out/server.txt" 2>&1
  kill -TERM "$server_pid" 2>/dev/null
  timeout 20 tail --pid="$server_pid" -f /dev/null 2>/dev/null || kill -9 "$server_pid" 2>/dev/null
  server_pid=""
  # Issue 59's device figures (the arrays bench, staged): MSM in the bulk form at 2^16 and
  # 2^18 points on both curves, points sent each call against a resident array, and the
  # polynomial product (2^20) with its intermediates kept on the device against sent
  # back and forth, and a model's layers (three bf16 products of 4096 × 1024 tokens, two
  # 3 × 3 convolutions of 32 × 64 × 56 × 56) with their outputs kept against sent; its own
  # server in process, the staged kernel cache; into bench.md.
  if [ -f "$here/.gpu/bench-arrays.xz" ]; then
    unxz_to "$here/.gpu/bench-arrays.xz" "$work/bench-arrays"
    chmod +x "$work/bench-arrays"
    local bench_env=(BENCH_BACKEND=gpu "BENCH_CASES=msm,chain,layers" BENCH_RUNS=5
      GPU_OPS_DATA_DIR="$work/data")
    [ "$emulate" = 1 ] && bench_env+=(BENCH_EMULATE=1 BENCH_MSM_LOG2=10 BENCH_CHAIN_LOG2=12
      BENCH_LAYERS_TOKENS=128 BENCH_LAYERS_HIDDEN=64 BENCH_LAYERS_IMAGES=2
      BENCH_LAYERS_CHANNELS=4 BENCH_LAYERS_SIDE=12)
    step "bench arrays (issue 59)" 180 env "${bench_env[@]}" "$work/bench-arrays" --bench \
      >> "$out/bench.md" 2>> "$logs/bench-arrays.log"
  else
    echo "bench arrays: skipped (no .gpu/bench-arrays.xz: stage it)" | tee -a "$steps"
  fi
  # Issue 58's MSM sweep: 2^16, 2^18 and 2^22 points (2^20 is in the check above) on both
  # curves, sent and resident with precomputed multiples, appended to check.md. Last, so
  # a short lease loses only this; skipped when GPU_CHECK_OPS leaves msm out.
  local sweep="16,18,22"
  [ "$emulate" = 1 ] && sweep="8,12"
  if [ -z "${GPU_CHECK_OPS:-}" ] || [[ ",$GPU_CHECK_OPS," == *,msm,* ]]; then
    step "check msm sweep" 240 "$bin" check --level "$level" "${device_flag[@]}" --ops msm \
      --msm-log2 "$sweep" --runs 3 --data-dir "$work/data" --json "$logs/msm-sweep.json" \
      --markdown "$logs/msm-sweep.md" > "$logs/msm-sweep.log" 2>&1
    if [ -s "$logs/msm-sweep.md" ]; then
      { echo; echo "# MSM sweep (--msm-log2 $sweep)"; echo; cat "$logs/msm-sweep.md"; } >> "$out/check.md"
    fi
  fi
  # The library algorithms each shape was given by measurement (backend/cuda/measured.rs),
  # in the check and the server: with their times, what the next session compares.
  local chosen
  chosen=$(grep -h "chosen by measurement" "$logs"/*.log 2>/dev/null || true)
  if [ -n "$chosen" ]; then
    { echo; echo "# Library algorithms chosen by measurement"; echo; echo '```';
      echo "$chosen"; echo '```'; } >> "$out/check.md"
  fi
  tar -czf "$out/logs.tar.gz" -C "$work" logs
  echo "== steps"; cat "$steps"
  echo "files in $out:"
  find "$out" -maxdepth 1 -type f -printf '  %f (%s bytes)\n'
  local count
  count=$(find "$out" -maxdepth 1 -type f | wc -l)
  if [ "$count" -gt 8 ]; then
    echo "run: $count files in $out, more than the 8 a device call brings back" >&2
    status=1
  fi
  return $status
}

case "${1:-}" in
stage) stage ;;
run) run ;;
*)
  echo "usage: $0 stage | run   (see the comment at the top)" >&2
  exit 2
  ;;
esac
