"""The peer of `scripts/wire-bench.sh`: the service a team writes instead of gpu-ops,
FastAPI + NumPy, serving `POST /linalg/matmul` in the same two forms as ours, so that one
bench drives both: base64 inside JSON (`{"a": {"encoding": "base64", "dtype": "f32",
"shape", "data"}, ...}`), and the bulk form (docs/WIRE.md, read and written with
tests/client/bulk.py's helper). It states its compute time in `x-compute-time-ms` as
gpu-ops does. Not a test: a reference point, run by the script that measures both."""

import base64
import json
import sys
import time
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request, Response

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "client"))
from bulk import MEDIA_TYPE, bulk_body, read_bulk  # noqa: E402

app = FastAPI()


def packed(a: np.ndarray) -> dict:
    return {"encoding": "base64", "dtype": "f32", "shape": list(a.shape),
            "data": base64.b64encode(a.astype("<f4").tobytes()).decode()}


@app.post("/linalg/matmul")
async def matmul(request: Request) -> Response:
    raw = await request.body()
    bulk = request.headers.get("content-type", "").startswith(MEDIA_TYPE)
    if bulk:
        _, arrays = read_bulk(raw)
        a, b = arrays["a"], arrays["b"]
    else:
        body = json.loads(raw)
        a, b = (np.frombuffer(base64.b64decode(body[k]["data"]), "<f4").reshape(body[k]["shape"])
                for k in ("a", "b"))
    started = time.perf_counter()
    d = np.matmul(a, b)
    compute_ms = (time.perf_counter() - started) * 1e3
    answer = {"shape": list(d.shape), "dtype": "f32",
              "flops": 2.0 * d.size * a.shape[-1]}
    headers = {"x-compute-time-ms": f"{compute_ms:.3f}", "x-backend": "cpu"}
    if MEDIA_TYPE in request.headers.get("accept", ""):
        return Response(bulk_body(answer, {"result": d}), media_type=MEDIA_TYPE, headers=headers)
    answer["result"] = packed(d)
    return Response(json.dumps(answer), media_type="application/json", headers=headers)
