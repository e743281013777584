#!/usr/bin/env bash
# Placement's cost in latency (issue "`auto` by measurement", docs/PERFORMANCE.md): one
# mixed load, the same for each server configuration, one configuration at a time on
# this machine:
#   cpu        --backend cpu (no device: nothing to place)
#   measured   --backend auto --emulate-device (placement by measurement, the default)
#   threshold  --backend auto --emulate-device --placement threshold (the old rule)
# The load is several `gpu-ops bench` runs at once against the one server (Goldilocks
# field_add of 2^10 and 2^16 elements, an NTT of 2^12, a 64³ matmul), each at
# concurrency 2. Prints, per configuration and op, p50 and p99 end to end, and which
# backends answered with the placement reasons (`gpu_ops_placements_total`). Reports land
# in target/placement-bench/. PLACEMENT_BENCH_SECONDS is each run's length (default 20).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${GPU_OPS_BIN:-target/release/gpu-ops}"
[ -n "${GPU_OPS_BIN:-}" ] || cargo build --locked --release --quiet
out=target/placement-bench
rm -rf "$out" && mkdir -p "$out"
seconds="${PLACEMENT_BENCH_SECONDS:-20}"

# name op shape
load=(
  "field_add-2^10 field_add 1024"
  "field_add-2^16 field_add 65536"
  "ntt-2^12 ntt 4096"
  "matmul-64 matmul 64,64,64"
)

run_config() {
  local config="$1"; shift
  local log="$out/$config-server.log"
  "$bin" --bind 127.0.0.1:0 --log-format json --job-timeout 120s "$@" 2>"$log" &
  local server=$!
  local port=""
  for _ in $(seq 1 300); do
    port="$(sed -n 's/.*"message":"listening".*"address":"[^"]*:\([0-9]*\)".*/\1/p' "$log" | head -n1)"
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "the $config server did not start:" >&2; cat "$log" >&2; exit 1; }
  local url="http://127.0.0.1:$port"
  "$bin" healthcheck --addr "127.0.0.1:$port" --path /health/ready >/dev/null 2>&1 || true
  for _ in $(seq 1 600); do
    "$bin" healthcheck --addr "127.0.0.1:$port" --path /health/ready >/dev/null 2>&1 && break
    sleep 0.1
  done
  # Calibration runs after readiness: the load starts once it has finished.
  if [ "$config" != cpu ]; then
    for _ in $(seq 1 300); do
      curl -s "$url/device" | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["placement"]["calibrations"] else 1)' && break
      sleep 0.2
    done
  fi
  local pids=()
  for c in "${load[@]}"; do
    read -r name op shape <<<"$c"
    "$bin" bench --url "$url" --op "$op" --shape "$shape" --backend auto --concurrency 2 \
      --warmup 3s --duration "${seconds}s" --json "$out/$config-$name.json" \
      >"$out/$config-$name.txt" 2>&1 &
    pids+=("$!")
  done
  for p in "${pids[@]}"; do wait "$p"; done
  curl -s "$url/metrics" | grep '^gpu_ops_placements_total' >"$out/$config-placements.txt" || true
  curl -s "$url/device" >"$out/$config-device.json"
  kill "$server"; wait "$server" 2>/dev/null || true
}

run_config cpu --backend cpu
run_config measured --backend auto --emulate-device
run_config threshold --backend auto --emulate-device --placement threshold

python3 - "$out" "${load[@]}" <<'EOF'
import json, sys, re
out, cases = sys.argv[1], [c.split()[0] for c in sys.argv[2:]]
print("| configuration | case | answers | p50 ms | p99 ms | placements (backend, reason: count) |")
print("|---|---|---:|---:|---:|---|")
for config in ("cpu", "measured", "threshold"):
    placed = {}
    for line in open(f"{out}/{config}-placements.txt"):
        m = re.match(r'gpu_ops_placements_total\{backend="(\w+)",op="(\w+)",reason="(\w+)"\} (\S+)', line)
        if m:
            placed.setdefault(m.group(2), []).append(f"{m.group(1)} {m.group(3)}: {float(m.group(4)):.0f}")
    for case in cases:
        r = json.load(open(f"{out}/{config}-{case}.json"))
        run = r["runs"][0]
        lat = run["latency_ms"]
        op = {"field_add": "field_add", "ntt": "ntt", "matmul": "matmul"}[case.split("-")[0]]
        print(f"| {config} | {case} | {run['ok']} | {lat['p50']:.2f} | {lat['p99']:.2f} | {'; '.join(placed.get(op, []))} |")
EOF
