#!/usr/bin/env bash
# The OpenAPI document as the wire contract, checked from outside (issue: clients generated
# from openapi/openapi.json must work):
#  1. openapi-python-client generates a client (no warning allowed) and tests/client
#     round-trips every operation through it against a real server, and checks that every
#     example in the spec validates against its schema;
#  2. @hey-api/openapi-ts, an independent generator, must produce every operation, and its
#     client must type-check;
#  3. schemathesis fuzzes the whole spec (every phase, every check) against a real server,
#     which must still be serving afterwards.
# Versions are pinned in tests/client/requirements.txt and tests/client/ts/package-lock.json.
# Needs python3 and node/npm; builds target/debug/gpu-ops when GPU_OPS_BIN is not given.
# ST_MAX_EXAMPLES (default 40) and ST_SEED tune the fuzzing. CI keeps the default seed so
# that a run is reproducible; ST_SEED=random explores new cases (the seed is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

bin="${GPU_OPS_BIN:-target/debug/gpu-ops}"
if [ -z "${GPU_OPS_BIN:-}" ]; then
  cargo build --locked --quiet
fi
bin="$(realpath "$bin")"

venv=.venv-client
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r tests/client/requirements.txt \
  -c tests/client/constraints.txt

echo "== Python client (openapi-python-client) round trip"
rm -rf target/python-client
"$venv/bin/openapi-python-client" generate --path openapi/openapi.json \
  --output-path target/python-client/gpu_ops_client --meta none \
  --config tests/client/openapi-python-client.yaml --fail-on-warning
GPU_OPS_CLIENT_DIR="$root/target/python-client" GPU_OPS_BIN="$bin" \
  "$venv/bin/python" -m pytest tests/client -q -p no:cacheprovider

echo "== TypeScript client (@hey-api/openapi-ts)"
# The pinned generator needs node >= 20.19.
# shellcheck disable=SC2016 # JavaScript, not shell.
node -e 'const [a, b] = process.versions.node.split(".").map(Number);
  if (a < 20 || (a === 20 && b < 19)) { console.error(`node ${process.versions.node}: 20.19 or newer is needed`); process.exit(1); }' 
rm -rf target/ts-client
(
  cd tests/client/ts
  npm ci --no-audit --no-fund --loglevel=error
  npx openapi-ts -i "$root/openapi/openapi.json" -o "$root/target/ts-client" --no-log-file >/dev/null
  npx tsc --noEmit -p tsconfig.json
  node check-operations.mjs "$root/openapi/openapi.json" "$root/target/ts-client/sdk.gen.ts"
)

echo "== schemathesis over the whole spec"
data="$(mktemp -d)"
log="$data/server.log"
# Dataset jobs are kept small (schema-valid configs can ask for hours of work and
# gigabytes of files) and may all queue, the service's and the tenant's queue alike, so
# the fuzzer never meets a full dataset queue however slowly the jobs drain (CI runs this
# beside `cargo test`); jobs give up well before the client's 30 s request timeout.
"$bin" --bind 127.0.0.1:0 --backend cpu --cpu-threads 1 --log-format json \
  --data-dir "$data/data" --max-dataset-samples 2 --max-dataset-jobs 100000 \
  --max-tenant-queued-datasets 100000 --max-dataset-bytes 67108864 --job-timeout 10s \
  2>"$log" &
server=$!
trap 'kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; rm -rf "$data"' EXIT
port=""
for _ in $(seq 1 300); do
  kill -0 "$server" 2>/dev/null || break
  port="$(sed -n 's/.*"message":"listening".*"address":"[^"]*:\([0-9]*\)".*/\1/p' "$log" | head -n1)"
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "the server did not start:" >&2; cat "$log" >&2; exit 1; }
seed="${ST_SEED:-20261123}"
[ "$seed" = random ] && seed="$RANDOM$RANDOM"
echo "schemathesis seed: $seed (ST_SEED=$seed reproduces this run)"
(
  cd tests/client
  SCHEMATHESIS_HOOKS=st_hooks "$root/$venv/bin/schemathesis" --config-file schemathesis.toml \
    run "$root/openapi/openapi.json" --url "http://127.0.0.1:$port" \
    --phases examples,coverage,fuzzing,stateful --checks all \
    --max-examples "${ST_MAX_EXAMPLES:-40}" --seed "$seed" --request-timeout 30 \
    --generation-database none --no-color
)
# The server must have survived the run.
"$venv/bin/python" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=10)" \
  "http://127.0.0.1:$port/health/live" || {
  echo "the server stopped serving during the fuzzing run" >&2
  exit 1
}
echo "the server is still serving"
