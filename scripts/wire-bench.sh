#!/usr/bin/env bash
# The wire forms side by side (issue "Bulk data at wire speed", docs/PERFORMANCE.md):
# starts the release server on the CPU backend and the FastAPI + NumPy peer
# (benches/peer/fastapi_numpy.py), then runs `gpu-ops bench` for each case in each wire
# form (nested JSON, base64 in JSON, the bulk form), one after another on this machine,
# and prints one table: body and answer bytes, the median end-to-end latency, the
# server's median compute time, one memcpy of the body and answer, and the latency over
# (compute + that copy), the issue's aim being at most 1.25 for the bulk form.
# Reports land in target/wire-bench/. WIRE_BENCH_CASES picks cases by name (default all);
# WIRE_BENCH_REQUESTS is each run's request count (default 10). The server's peak RSS
# over the cases run is printed after them (target/wire-bench/server-peak-rss.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${GPU_OPS_BIN:-target/release/gpu-ops}"
[ -n "${GPU_OPS_BIN:-}" ] || cargo build --locked --release --quiet
out=target/wire-bench
rm -rf "$out" && mkdir -p "$out"
requests="${WIRE_BENCH_REQUESTS:-10}"

venv=.venv-peer
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check fastapi==0.165.0 uvicorn==0.54.0 numpy==2.3.5

log="$out/server.log"
# Limits wide enough for the largest cases: 2^24 Goldilocks pairs as decimal JSON, and
# DP's 256 × 2^20 f32 gradients (a 1 GiB bulk body; its JSON forms would be 1.4–3 GB and
# are not run).
"$bin" --bind 127.0.0.1:0 --backend cpu --log-format json --max-body-bytes 2147483648 \
  --max-inflight-body-bytes 8589934592 --max-elements 33554432 \
  --max-tensor-elements 268435456 --job-timeout 600s 2>"$log" &
server=$!
"$venv/bin/python" -m uvicorn --app-dir benches/peer fastapi_numpy:app --host 127.0.0.1 \
  --port 18931 --log-level warning &
peer=$!
trap 'kill "$server" "$peer" 2>/dev/null; wait 2>/dev/null' EXIT
port=""
for _ in $(seq 1 300); do
  port="$(sed -n 's/.*"message":"listening".*"address":"[^"]*:\([0-9]*\)".*/\1/p' "$log" | head -n1)"
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "the server did not start:" >&2; cat "$log" >&2; exit 1; }
for _ in $(seq 1 100); do
  curl -s -o /dev/null "http://127.0.0.1:18931/docs" && break
  sleep 0.1
done

# name op shape wires [peer|-] [requests, when fewer than WIRE_BENCH_REQUESTS]
cases=(
  "matmul-1024 matmul 1024,1024,1024 json,base64,binary peer"
  "matmul-2048 matmul 2048,2048,2048 json,base64,binary peer"
  "conv2d-resnet50 conv2d 8,64,56,56,64,3,3 base64,binary - 5"
  "attention attention 8,16,2048,64 base64,binary - 3"
  "field_add-2^20 field_add 1048576 json,base64,binary"
  "field_add-2^24 field_add 16777216 base64,binary - 5"
  "msm-2^20 msm 1048576 base64,binary - 3"
  "dp-256x2^20 dp_privatize 256,1048576 binary - 3"
)
for c in "${cases[@]}"; do
  read -r name op shape wires peer_too n <<<"$c"
  n="${n:-$requests}"; [ "$n" -lt "$requests" ] || n="$requests"
  if [ -n "${WIRE_BENCH_CASES:-}" ] && [[ ",$WIRE_BENCH_CASES," != *",$name,"* ]]; then
    continue
  fi
  for wire in ${wires//,/ }; do
    urls=("ours http://127.0.0.1:$port")
    [ "${peer_too:-}" = peer ] && [ "$wire" != json ] && urls+=("peer http://127.0.0.1:18931")
    for u in "${urls[@]}"; do
      read -r who url <<<"$u"
      echo "== $name $wire ($who)" >&2
      "$bin" bench --url "$url" --op "$op" --shape "$shape" --wire "$wire" --backend cpu \
        --warmup 1 --duration "$n" --timeout 600s --json "$out/$name-$wire-$who.json" >&2
    done
  done
done

# The server's peak resident memory over every case run (the issue's memory bound: the
# largest body plus its answer plus a constant).
grep VmHWM "/proc/$server/status" | tee "$out/server-peak-rss.txt" >&2

python3 - "$out" <<'PY'
import json, pathlib, sys
rows = []
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    r = json.loads(f.read_text())
    run = r["runs"][0]
    lat, comp = run["latency_ms"], run["compute_ms"]
    name, wire, who = f.stem.rsplit("-", 2)
    rows.append((name, {"ours": "gpu-ops", "peer": "FastAPI + NumPy"}[who], wire, r["body_bytes"], r["answer_bytes"], lat["p50"],
                 comp["p50"] if comp else float("nan"), r["memcpy_ms"],
                 run["over_compute_and_copy"] or float("nan")))
print("| case | server | wire | body bytes | answer bytes | p50 end to end ms | p50 compute ms | one memcpy ms | p50 / (compute + memcpy) |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:,} | {r[4]:,} | {r[5]:.1f} | {r[6]:.1f} | {r[7]:.2f} | {r[8]:.2f} |")
PY
