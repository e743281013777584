#!/usr/bin/env python3
"""Time the shapes of a `gpu-ops check --json` report through PyTorch on the same GPU.

Reads the report, runs each op's `compare` shape through PyTorch's libraries (cuBLAS
matmul, SDPA attention, cuDNN conv2d, embedding gather), measures the copy roofline
(1 GiB device-to-device, host<->device pinned), and writes a markdown table: our
kernel, the library, and the ratio ours / library (> 1: we are slower). Ops without a
PyTorch counterpart (field ops, NTT, MSM, DP, Shamir) are set against the copy
roofline instead: `bytes / d2d copy rate`.

    python3 scripts/torch_compare.py REPORT.json [--out table.md] [--json out.json]
        [--runs N] [--warmup N] [--device cuda|cuda:N|cpu] [--max-seconds S]
        [--half-dtypes f16,bf16]

On the GPU host: standard library + torch only (numpy is not needed). `--device cpu`
is a dry run for a machine without a GPU: wall-clock timings, copies capped at 64 MiB,
no pinned or flash-attention rows.

Exit status: 0 when the table was written (a case that fails, e.g. out of memory or a
backend that refuses, is a row with its error); 2 when the report cannot be read,
torch cannot be imported, or the requested device does not exist.
"""

import argparse
import contextlib
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import warnings

GIB = 1 << 30
CPU_COPY_BYTES = 64 << 20
# Per case: the measured runs are cut (not below MIN_RUNS_*) when they would take longer.
CASE_SECONDS = 5.0
MIN_RUNS_CUDA = 10
MIN_RUNS_CPU = 3

COMPUTE_ALIASES = {
    "f32": "f32", "fp32": "f32", "float32": "f32", "float": "f32", "ieee": "f32",
    "tf32": "tf32",
    "f16": "f16", "fp16": "f16", "float16": "f16", "half": "f16",
    "bf16": "bf16", "bfloat16": "bf16",
    "f64": "f64", "fp64": "f64", "float64": "f64", "double": "f64",
}


# ---------------------------------------------------------------- report reading

class ReportError(Exception):
    pass


def load_report(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ReportError(f"cannot read report {path}: {e.strerror or e}") from e
    except ValueError as e:
        raise ReportError(f"report {path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ReportError(f"report {path}: top level is {type(data).__name__}, not an object")
    ops = data.get("ops")
    if ops is None:
        ops = []
    if not isinstance(ops, list):
        raise ReportError(f"report {path}: 'ops' is {type(ops).__name__}, not a list")
    devices = data.get("devices")
    if not isinstance(devices, list):
        devices = []
    return {
        "level": data.get("level"),
        "devices": [normal_device(d) for d in devices if isinstance(d, dict)],
        "ops": [o for o in ops if isinstance(o, dict)],
        "ignored_ops": sum(1 for o in ops if not isinstance(o, dict)),
    }


def normal_device(d):
    """A report device with `name` and `emulated` at the top level (`gpu-ops check` keeps
    them under `info`, as GpuInfo)."""
    d = dict(d)
    info = d.get("info") if isinstance(d.get("info"), dict) else {}
    if d.get("name") is None and info.get("name") is not None:
        d["name"] = info["name"]
    if d.get("emulated") is None and info.get("emulated") is not None:
        d["emulated"] = info["emulated"]
    return d


def num(x):
    """A finite float from a JSON value, else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def stat_median(v):
    """`{"median": ..}` or a bare number."""
    if isinstance(v, dict):
        return num(v.get("median"))
    return num(v)


def our_time_ms(op):
    """(ms, which): timings.kernel_ms.median when present, else timings.device_ms.median."""
    t = op.get("timings")
    if not isinstance(t, dict):
        return None, None
    for key in ("kernel_ms", "device_ms"):
        v = stat_median(t.get(key))
        if v is not None:
            return v, key
    return None, None


def device_index(report):
    return {str(d.get("label")): d for d in report["devices"] if d.get("label") is not None}


def skip_reason(op, devices):
    """Why an op is not compared (None: compare it)."""
    parity = op.get("parity")
    if parity is not None and parity != "ok":
        why = f" ({op['reason']})" if op.get("reason") else ""
        return f"parity {parity!r}: not compared{why}"
    dev = devices.get(str(op.get("device")))
    if dev is not None and dev.get("emulated") is True:
        return "emulated device: not compared"
    if op.get("emulated") is True:
        return "emulated: not compared"
    return None


# Defaults filled in before shapes are compared, so that `{"batch": 1, ..}` and a compare
# without `batch` are measured once.
KIND_DEFAULTS = {
    "matmul": {"batch": 1, "trans_a": False, "trans_b": False, "compute": "f32"},
    "attention": {"batch": 1, "heads": 1, "causal": False},
    "conv2d": {"n": 1, "stride": 1, "pad": 0, "dilation": 1, "groups": 1},
    "embedding": {},
}


def compare_key(compare):
    c = dict(KIND_DEFAULTS.get(compare.get("kind"), {}))
    c.update(compare)
    if c.get("kind") == "matmul":
        c["compute"] = COMPUTE_ALIASES.get(str(c["compute"]).lower(), c["compute"])
        c["trans_a"], c["trans_b"] = bool(c["trans_a"]), bool(c["trans_b"])
    if c.get("kind") == "attention":
        c.setdefault("seq_k", c.get("seq_q"))
        c.setdefault("kv_heads", c.get("heads"))
        c["causal"] = bool(c["causal"])
    if c.get("kind") == "conv2d":
        c.setdefault("s", c.get("r"))
    return json.dumps(c, sort_keys=True, default=str)


def need_int(c, name, default=None):
    v = c.get(name, default)
    if v is None:
        raise ValueError(f"compare field {name!r} missing")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 0:
        raise ValueError(f"compare field {name!r} = {v!r} is not a non-negative integer")
    return int(v)


def pair(c, name, default):
    """An int or a [h, w] pair (conv stride/pad)."""
    v = c.get(name, default)
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return (need_int({"v": v[0]}, "v"), need_int({"v": v[1]}, "v"))
    n = need_int({name: v}, name)
    return (n, n)


def compute_of(c):
    raw = str(c.get("compute", "f32")).lower()
    if raw not in COMPUTE_ALIASES:
        raise ValueError(f"unknown matmul compute {raw!r} (f32, tf32, f16, bf16, f64)")
    return COMPUTE_ALIASES[raw]


def ratio(ours, ref):
    if ours is None or ref is None or ref <= 0:
        return None
    return ours / ref


def fmt_ms(x):
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}x"


def fmt_gbps(x):
    return "-" if x is None else f"{x:.1f}"


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def short_error(e, limit=160):
    msg = f"{type(e).__name__}: {e}".replace("\n", " ")
    msg = re.sub(r"\s+", " ", msg)
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


# ---------------------------------------------------------------- timing

class Ctx:
    """The torch device, how to synchronise with it and how to time on it."""

    def __init__(self, torch, device, runs, warmup, started, max_seconds):
        self.torch = torch
        self.started = started
        self.deadline = started + max_seconds
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.runs = runs
        self.warmup = warmup
        self.min_runs = min(runs, MIN_RUNS_CUDA if self.cuda else MIN_RUNS_CPU)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def free(self):
        if self.cuda:
            with contextlib.suppress(Exception):  # freeing is best effort
                self.torch.cuda.empty_cache()

    def time_ms(self, fn):
        """Warm-up, then the median of the runs: CUDA events around each call on CUDA,
        perf_counter on the CPU. Returns {median, min, runs}."""
        last = None
        for _ in range(self.warmup):
            t0 = time.perf_counter()
            fn()
            self.sync()
            last = time.perf_counter() - t0
        runs = self.runs
        if last is not None and last * runs > CASE_SECONDS:
            runs = max(self.min_runs, min(runs, int(CASE_SECONDS / max(last, 1e-9))))
        times = []
        if self.cuda:
            torch = self.torch
            with torch.cuda.device(self.device):
                events = [(torch.cuda.Event(enable_timing=True),
                           torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
                self.sync()
                for start, end in events:
                    start.record()
                    fn()
                    end.record()
                self.sync()
                times = [start.elapsed_time(end) for start, end in events]
        else:
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return {"median": statistics.median(times), "min": min(times), "runs": runs}


def lib_result(reference, timing=None, note="", error=None, **extra):
    r = {"reference": reference, "note": note, "error": error}
    if timing:
        r.update(ms=timing["median"], min_ms=timing["min"], runs=timing["runs"])
    r.update(extra)
    return r


# ---------------------------------------------------------------- precision settings

def set_matmul_fp32(torch, tf32):
    """TF32 on or off for fp32 cuBLAS matmuls. Uses the fp32_precision API where it exists
    (torch >= 2.9, which refuses a mix of the old and new APIs), else allow_tf32 and
    set_float32_matmul_precision. Returns a description of the setting."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        m.fp32_precision = "tf32" if tf32 else "ieee"
        return f"matmul.fp32_precision={m.fp32_precision}"
    m.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return f"allow_tf32={m.allow_tf32}"


def set_conv_fp32_ieee(torch):
    c = getattr(torch.backends.cudnn, "conv", None)
    if c is not None and hasattr(c, "fp32_precision"):
        c.fp32_precision = "ieee"
        desc = f"cudnn.conv.fp32_precision={c.fp32_precision}"
    else:
        torch.backends.cudnn.allow_tf32 = False
        desc = "cudnn.allow_tf32=False"
    torch.backends.cudnn.benchmark = True
    return desc + ", benchmark=True"


# ---------------------------------------------------------------- the cases

def run_matmul(ctx, c):
    torch = ctx.torch
    batch = need_int(c, "batch", 1)
    m, n, k = need_int(c, "m"), need_int(c, "n"), need_int(c, "k")
    ta, tb = bool(c.get("trans_a", False)), bool(c.get("trans_b", False))
    compute = compute_of(c)
    dtype = {"f32": torch.float32, "tf32": torch.float32, "f64": torch.float64,
             "f16": torch.float16, "bf16": torch.bfloat16}[compute]
    notes = []
    if ctx.cuda and compute in ("f32", "tf32"):
        notes.append(set_matmul_fp32(torch, compute == "tf32"))
    elif compute == "tf32":
        notes.append("tf32 is CUDA-only: ran f32")
    if compute in ("f16", "bf16"):
        notes.append(f"torch takes {compute} operands; ours converts f32 operands")
    if ta or tb:
        notes.append(f"trans_a={ta} trans_b={tb} as transposed views")
    dev = ctx.device
    shape_a = (k, m) if ta else (m, k)
    shape_b = (n, k) if tb else (k, n)
    if batch > 1:
        shape_a, shape_b, shape_c = (batch,) + shape_a, (batch,) + shape_b, (batch, m, n)
    else:
        shape_c = (m, n)
    a = torch.randn(shape_a, device=dev, dtype=dtype)
    b = torch.randn(shape_b, device=dev, dtype=dtype)
    out = torch.empty(shape_c, device=dev, dtype=dtype)
    a = a.transpose(-1, -2) if ta else a
    b = b.transpose(-1, -2) if tb else b
    name = "torch.bmm" if batch > 1 else "torch.mm"
    mm = torch.bmm if batch > 1 else torch.mm
    try:
        timing = ctx.time_ms(lambda: mm(a, b, out=out))
    finally:
        if ctx.cuda and compute == "tf32":
            set_matmul_fp32(torch, False)  # back to torch's default for the cases after
    lib = "cuBLAS" if ctx.cuda else "CPU BLAS"
    return [lib_result(f"{name} {compute} ({lib})", timing, "; ".join(notes),
                       dtype=str(dtype).replace("torch.", ""))]


def sdp_backend_name(torch, q, k, v, causal):
    """Which backend the default SDPA dispatch picks for these inputs (private API)."""
    try:
        from torch.nn.attention import SDPBackend
        choice = torch._fused_sdp_choice(q, k, v, is_causal=causal)
        return SDPBackend(choice).name
    except Exception:  # noqa: BLE001 - the name is informational
        return "default dispatch"


def run_attention(ctx, c, half_dtypes):
    torch = ctx.torch
    F = torch.nn.functional
    b, h = need_int(c, "batch", 1), need_int(c, "heads", 1)
    kv = need_int(c, "kv_heads", h)
    sq, sk, d = need_int(c, "seq_q"), need_int(c, "seq_k", c.get("seq_q")), need_int(c, "dim")
    causal = bool(c.get("causal", False))
    if kv < 1 or h % kv:
        raise ValueError(f"kv_heads {kv} does not divide heads {h}")
    # Grouped heads: K and V have kv heads, which SDPA shares across each group itself.
    gqa = {"enable_gqa": True} if kv != h else {}
    dev = ctx.device
    results = []
    note_causal = "causal mask top-left aligned (seq_q != seq_k)" if causal and sq != sk else ""

    def inputs(dtype):
        return (torch.randn(b, h, sq, d, device=dev, dtype=dtype),
                torch.randn(b, kv, sk, d, device=dev, dtype=dtype),
                torch.randn(b, kv, sk, d, device=dev, dtype=dtype))

    def sdpa(q, k, v):
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)

    # f32 through the default dispatch (TF32 off, should it fall back to the math backend).
    try:
        if ctx.cuda:
            set_matmul_fp32(torch, False)
        q, k, v = inputs(torch.float32)
        backend = sdp_backend_name(torch, q, k, v, causal)
        timing = ctx.time_ms(sdpa(q, k, v))
        results.append(lib_result(f"sdpa f32 ({backend})", timing, note_causal,
                                  dtype="float32", backend=backend))
    except Exception as e:  # noqa: BLE001 - each row is guarded
        results.append(lib_result("sdpa f32", error=short_error(e)))
    finally:
        q = k = v = None
        ctx.free()

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        results.append(lib_result("sdpa half (flash)", error=f"no torch.nn.attention.sdpa_kernel: {e}"))
        return results
    # The half rows: --half-dtypes, plus the compare's own dtype where it names a half one.
    own = COMPUTE_ALIASES.get(str(c.get("dtype", "")).lower())
    names = list(half_dtypes) + ([own] if own in ("f16", "bf16") and own not in half_dtypes else [])
    for name in names:
        dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[name]
        if not ctx.cuda:
            results.append(lib_result(f"sdpa {name} (FLASH_ATTENTION)",
                                      error="skipped: flash attention rows need a CUDA device"))
            continue
        refused = []
        done = False
        try:
            q, k, v = inputs(dtype)
            for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        with sdpa_kernel([be]):
                            timing = ctx.time_ms(sdpa(q, k, v))
                except RuntimeError as e:
                    if isinstance(e, torch.cuda.OutOfMemoryError):
                        raise
                    refused.append(f"{be.name} refused ({short_error(e, 80)})")
                    ctx.sync()
                    continue
                note = "; ".join(x for x in refused + [note_causal] if x)
                results.append(lib_result(f"sdpa {name} ({be.name})", timing, note,
                                          dtype=str(dtype).replace("torch.", ""), backend=be.name))
                done = True
                break
            if not done:
                results.append(lib_result(f"sdpa {name}", error="; ".join(refused)))
        except Exception as e:  # noqa: BLE001 - each row is guarded
            results.append(lib_result(f"sdpa {name}", error=short_error(e)))
        finally:
            q = k = v = None
            ctx.free()
    return results


def run_conv2d(ctx, c):
    torch = ctx.torch
    n, ch, h, w = need_int(c, "n", 1), need_int(c, "c"), need_int(c, "h"), need_int(c, "w")
    kout = need_int(c, "k")
    r, s = need_int(c, "r"), need_int(c, "s", c.get("r"))
    stride, pad = pair(c, "stride", 1), pair(c, "pad", 0)
    dilation = pair(c, "dilation", 1)
    groups = need_int(c, "groups", 1)
    note = set_conv_fp32_ieee(torch) if ctx.cuda else ""
    x = torch.randn(n, ch, h, w, device=ctx.device)
    wt = torch.randn(kout, ch // max(groups, 1), r, s, device=ctx.device)
    F = torch.nn.functional
    timing = ctx.time_ms(lambda: F.conv2d(x, wt, stride=stride, padding=pad,
                                          dilation=dilation, groups=groups))
    lib = "cuDNN" if ctx.cuda else "CPU"
    return [lib_result(f"F.conv2d f32 ({lib})", timing, note, dtype="float32")]


def run_embedding(ctx, c):
    torch = ctx.torch
    rows, dim = need_int(c, "rows"), need_int(c, "dim")
    ids = c.get("ids")
    nids = len(ids) if isinstance(ids, list) else need_int(c, "ids")
    if rows == 0:
        raise ValueError("compare field 'rows' is 0")
    weight = torch.randn(rows, dim, device=ctx.device)
    idx = torch.randint(0, rows, (nids,), device=ctx.device, dtype=torch.int64)
    F = torch.nn.functional
    timing = ctx.time_ms(lambda: F.embedding(idx, weight))
    return [lib_result("F.embedding f32 (gather)", timing, "random ids", dtype="float32")]


KINDS = {"matmul", "attention", "conv2d", "embedding"}


def run_compare(ctx, compare, half_dtypes):
    kind = compare.get("kind")
    try:
        if kind == "matmul":
            return run_matmul(ctx, compare)
        if kind == "attention":
            return run_attention(ctx, compare, half_dtypes)
        if kind == "conv2d":
            return run_conv2d(ctx, compare)
        if kind == "embedding":
            return run_embedding(ctx, compare)
        return [lib_result(f"torch {kind}", error=f"unknown compare kind {kind!r}")]
    except Exception as e:  # noqa: BLE001 - one failing case is a row, the run goes on
        return [lib_result(f"torch {kind}", error=short_error(e))]
    finally:
        with contextlib.suppress(Exception):  # a sticky CUDA error shows on the next case
            ctx.sync()
        ctx.free()


# ---------------------------------------------------------------- copy roofline

def measure_copies(ctx):
    torch = ctx.torch
    nbytes = GIB if ctx.cuda else CPU_COPY_BYTES
    out = []

    def one(name, make, note):
        if time.monotonic() > ctx.deadline:
            out.append({"copy": name, "bytes": nbytes, "error": "not run: --max-seconds spent"})
            return
        try:
            fn = make()
            t = ctx.time_ms(fn)
            out.append({"copy": name, "bytes": nbytes, "ms": t["median"], "min_ms": t["min"],
                        "runs": t["runs"], "gbps": nbytes / (t["median"] / 1e3) / 1e9,
                        "note": note})
        except Exception as e:  # noqa: BLE001 - guarded like every case
            out.append({"copy": name, "bytes": nbytes, "error": short_error(e)})
        finally:
            ctx.free()

    def d2d():
        src = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device).fill_(1)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    one("d2d", d2d, "bytes copied / s; memory traffic is 2x (read + write)")
    if ctx.cuda:
        def h2d():
            src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(1)
            dst = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
            return lambda: dst.copy_(src, non_blocking=True)

        def d2h():
            src = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device).fill_(1)
            dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            return lambda: dst.copy_(src, non_blocking=True)

        one("h2d_pinned", h2d, "pinned host memory")
        one("d2h_pinned", d2h, "pinned host memory")
    else:
        for name in ("h2d_pinned", "d2h_pinned"):
            out.append({"copy": name, "bytes": nbytes, "error": "skipped: no CUDA device"})
    return out


# ---------------------------------------------------------------- environment

def loaded_libraries():
    """Paths of the cuBLAS / cuDNN / CUDA runtime libraries mapped into this process."""
    pat = re.compile(r"/lib(cublas|cublasLt|cudnn[A-Za-z_]*|cudart|nvrtc)\.so[.0-9]*$")
    found = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and pat.search(parts[5].strip()):
                    found.add(parts[5].strip())
    except OSError:
        return None
    return sorted(found)


def environment(torch, ctx):
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "device": str(ctx.device),
        "device_name": platform.processor() or platform.machine(),
    }
    with contextlib.suppress(Exception):  # informational
        if torch.backends.cudnn.is_available():
            env["cudnn"] = torch.backends.cudnn.version()
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            m = re.search(r"Kernel Module\s+(\S+)", f.read())
            if m:
                env["driver"] = m.group(1)
    except OSError:
        pass
    if ctx.cuda:
        try:
            p = torch.cuda.get_device_properties(ctx.device)
            env.update(device_name=p.name, capability=f"{p.major}.{p.minor}",
                       memory_gib=round(p.total_memory / GIB, 1), sms=p.multi_processor_count)
        except Exception as e:  # noqa: BLE001
            env["device_error"] = short_error(e)
        # One small matmul and one conv so that cuBLAS and cuDNN are loaded, then look.
        try:
            a = torch.randn(64, 64, device=ctx.device)
            (a @ a).sum().item()
            x = torch.randn(1, 8, 16, 16, device=ctx.device)
            torch.nn.functional.conv2d(x, torch.randn(8, 8, 3, 3, device=ctx.device)).sum().item()
        except Exception as e:  # noqa: BLE001
            env["warmup_error"] = short_error(e)
        with contextlib.suppress(Exception):  # a private API, informational
            v = torch._C._cuda_getDriverVersion()
            env["driver_cuda"] = f"{v // 1000}.{v % 1000 // 10}"
    env["libraries"] = loaded_libraries()
    return env


def env_lines(env, report):
    lines = [
        f"- torch {env['torch']}, CUDA {env.get('cuda') or '-'}, cuDNN {env.get('cudnn') or '-'}, "
        f"Python {env['python']}" + (f", driver {env['driver']}" if env.get("driver") else "")
        + (f" (CUDA {env['driver_cuda']})" if env.get("driver_cuda") else ""),
        f"- device: {env['device']} = {env.get('device_name')}"
        + (f" (sm_{env['capability'].replace('.', '')}, {env['memory_gib']} GiB, {env['sms']} SMs)"
           if env.get("capability") else ""),
    ]
    for key in ("device_error", "warmup_error"):
        if env.get(key):
            lines.append(f"- {key}: {env[key]}")
    libs = env.get("libraries")
    if libs:
        by_dir = {}
        for path in libs:
            by_dir.setdefault(os.path.dirname(path), []).append(os.path.basename(path))
        for d, names in by_dir.items():
            lines.append(f"- libraries loaded from `{d}/`: {', '.join(names)}")
    elif libs is not None:
        lines.append("- libraries loaded: no cuBLAS/cuDNN found in /proc/self/maps")
    for d in report["devices"]:
        label, name = d.get("label"), d.get("name")
        flag = " (emulated)" if d.get("emulated") else ""
        mism = ""
        if name and env.get("capability") and name != env.get("device_name") and not d.get("emulated"):
            mism = " - **not the GPU measured here**"
        lines.append(f"- report device {label}: {name}{flag}{mism}")
    return lines


# ---------------------------------------------------------------- rows and tables

def op_row(op, reference, ours, ours_key, ref_ms, note="", status="ok", extra=None):
    case = str(op.get("case", ""))
    if op.get("phase") and op.get("phase") != "parity":
        case = f"{case} [{op['phase']}]".strip()
    row = {
        "op": op.get("op", "?"), "case": case, "device": op.get("device"),
        "reference": reference, "ours_ms": ours, "ours_timing": ours_key,
        "ref_ms": ref_ms, "ratio": ratio(ours, ref_ms), "note": note, "status": status,
    }
    if extra:
        row.update(extra)
    return row


def roofline_ms(nbytes, d2d_gbps):
    """The time a kernel moving `nbytes` of memory traffic (inputs read once, outputs written
    once, as the report counts `bytes`) needs at the copy roofline: a copy of N bytes moves
    2N of traffic, so the memory's rate is twice the copy rate (the report's
    `of_copy_roofline` uses the same rate)."""
    return nbytes / (2.0 * d2d_gbps * 1e9) * 1e3


def roofline_row(op, ours, ours_key, d2d, prefix_note=""):
    nbytes = num(op.get("bytes"))
    if d2d is None:
        return op_row(op, "copy roofline", ours, ours_key, None,
                      "; ".join(x for x in (prefix_note, "no copy rate measured") if x), "error")
    gbps, source = d2d
    ref = roofline_ms(nbytes, gbps)
    note = f"{nbytes:.0f} B at 2 x {gbps:.0f} GB/s ({source})"
    return op_row(op, "copy roofline", ours, ours_key, ref,
                  "; ".join(x for x in (prefix_note, note) if x), extra={"bytes": nbytes})


def build_rows(report, ctx, half_dtypes, log, d2d):
    devices = device_index(report)
    cache = {}
    rows = []
    for op in report["ops"]:
        ours, ours_key = our_time_ms(op)
        reason = skip_reason(op, devices)
        if reason:
            rows.append(op_row(op, "-", ours, ours_key, None, reason, "skipped"))
            continue
        base_note = "parity not reported" if op.get("parity") is None else ""
        if ours is None:
            base_note = "; ".join(x for x in (base_note, "no timing in report") if x)
        compare = op.get("compare")
        if isinstance(compare, dict) and compare.get("kind") in KINDS:
            key = (str(ctx.device), compare_key(compare))
            first = key not in cache
            if first:
                if time.monotonic() > ctx.deadline:
                    rows.append(op_row(op, f"torch {compare.get('kind')}", ours, ours_key, None,
                                       "not run: --max-seconds spent", "not run"))
                    continue
                log(f"[{time.monotonic() - ctx.started:5.1f}s] {op.get('op')} {op.get('case', '')}")
                cache[key] = run_compare(ctx, compare, half_dtypes)
            for lib in cache[key]:
                notes = [base_note, lib.get("note", "")]
                if not first:
                    notes.append("same shape as above, measured once")
                if lib.get("error"):
                    rows.append(op_row(op, lib["reference"], ours, ours_key, None,
                                       "; ".join(x for x in notes + [lib["error"]] if x),
                                       "skipped" if lib["error"].startswith("skipped") else "error"))
                    continue
                if lib.get("runs") is not None and lib["runs"] < ctx.runs:
                    notes.append(f"{lib['runs']} runs")
                nbytes = num(op.get("bytes"))
                if nbytes and d2d:
                    notes.append(f"roofline {fmt_ms(roofline_ms(nbytes, d2d[0]))} ms")
                extra = {k: lib[k] for k in ("min_ms", "runs", "dtype", "backend") if k in lib}
                flops = num(op.get("flops"))
                if flops and lib.get("ms"):
                    extra["ref_tflops"] = flops / (lib["ms"] / 1e3) / 1e12
                    if ours:
                        extra["ours_tflops"] = flops / (ours / 1e3) / 1e12
                rows.append(op_row(op, lib["reference"], ours, ours_key, lib["ms"],
                                   "; ".join(x for x in notes if x), extra=extra))
            continue
        prefix = base_note
        if isinstance(compare, dict):
            what = f"unknown compare kind {compare.get('kind')!r}"
            prefix = "; ".join(x for x in (prefix, what) if x)
        elif compare is not None:
            what = f"compare is a {type(compare).__name__}, not an object"
            prefix = "; ".join(x for x in (prefix, what) if x)
        if num(op.get("bytes")):
            rows.append(roofline_row(op, ours, ours_key, d2d, prefix))
        else:
            rows.append(op_row(op, "-", ours, ours_key, None,
                               "; ".join(x for x in (prefix, "no compare shape and no bytes") if x),
                               "skipped"))
    return rows


def copy_table(copies, report, env_device_name):
    ours_by = {}
    for d in report["devices"]:
        if d.get("emulated") or not isinstance(d.get("copy"), dict):
            continue
        same = not env_device_name or d.get("name") in (None, env_device_name)
        if same and not ours_by:
            ours_by = {"d2d": num(d["copy"].get("d2d_gbps")),
                       "h2d_pinned": num(d["copy"].get("h2d_pinned_gbps")),
                       "d2h_pinned": num(d["copy"].get("d2h_pinned_gbps")),
                       "_label": d.get("label")}
    lines = ["| Copy | Size | torch GB/s | torch ms | ours GB/s (report) | time ours/torch | Note |",
             "|---|---|---|---|---|---|---|"]
    for c in copies:
        ours = ours_by.get(c["copy"])
        size = f"{c['bytes'] / (1 << 20):.0f} MiB"
        if c.get("error"):
            lines.append(f"| {c['copy']} | {size} | - | - | {fmt_gbps(ours)} | - | {cell(c['error'])} |")
            continue
        r = ratio(c["gbps"], ours)  # time ours / time torch = torch GB/s / our GB/s
        lines.append(f"| {c['copy']} | {size} | {fmt_gbps(c['gbps'])} | {fmt_ms(c['ms'])} | "
                     f"{fmt_gbps(ours)} | {fmt_ratio(r)} | {cell(c.get('note', ''))} |")
    return lines


def fmt_tflops(x):
    return "-" if x is None else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def ops_table(rows):
    """One line per row; TFLOP/s beside the times where the report counts the op's flops
    (the rows against a roofline have none)."""
    lines = ["| Op | Case | Reference | Ours ms | Ref ms | Ours/Ref | Ours TFLOP/s | Ref TFLOP/s | Note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ours = fmt_ms(r["ours_ms"])
        if r["ours_ms"] is not None and r.get("ours_timing") == "device_ms":
            ours += " (device)"
        lines.append(f"| {cell(r['op'])} | {cell(r['case'])} | {cell(r['reference'])} | {ours} | "
                     f"{fmt_ms(r['ref_ms'])} | {fmt_ratio(r['ratio'])} | "
                     f"{fmt_tflops(r.get('ours_tflops'))} | {fmt_tflops(r.get('ref_tflops'))} | "
                     f"{cell(r['note'])} |")
    return lines


def summary_lines(rows):
    ok = [r for r in rows if r["ratio"] is not None]
    lines = []
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("Rows: " + (", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none") + ".")
    if ok:
        geo = math.exp(sum(math.log(r["ratio"]) for r in ok) / len(ok))
        worst = max(ok, key=lambda r: r["ratio"])
        lines.append(f"Geometric mean of ours/ref over {len(ok)} rows: {geo:.2f}x; slowest: "
                     f"{worst['op']} {worst['case']} vs {worst['reference']} at {worst['ratio']:.2f}x.")
    return lines


NOTES = [
    ("Ours/Ref = our time / reference time: above 1 we are slower. Our time is the report's "
     "`timings.kernel_ms.median` (else `device_ms.median`, marked `(device)`); the reference's is "
     "the median of the runs, CUDA events around each call on tensors already on the device, "
     "after warm-up, inputs resident (warm L2 for small shapes, as for ours)."),
    ("Matmul f32 runs with TF32 off, tf32 with it on; f16/bf16 rows give torch half operands, "
     "while our kernel takes f32 operands and converts. Conv2d is f32 with cuDNN TF32 off and "
     "`cudnn.benchmark` on (the algorithm search happens in the warm-up)."),
    ("Attention: the f32 row uses SDPA's default dispatch (the backend it chose is named); the "
     "half rows force FLASH_ATTENTION, falling back to EFFICIENT_ATTENTION then MATH where a "
     "backend refuses."),
    ("Copy roofline: `bytes / (2 x d2d copy rate)`. The copy rate counts bytes copied per "
     "second; a copy reads and writes each byte, so memory traffic runs at twice that, and the "
     "report's `bytes` is traffic (inputs read once, outputs written once), as in its "
     "`of_copy_roofline`. Ops without a PyTorch counterpart (field ops, NTT, MSM, DP, Shamir) "
     "are set against it."),
]


def render(report_path, env_lines_, copies, rows, report, env, elapsed, deadline_hit):
    out = [f"# PyTorch comparison for `{os.path.basename(report_path)}`", ""]
    if report.get("level"):
        out.append(f"Report level: {report['level']}.")
        out.append("")
    out += ["## Environment", ""] + env_lines_ + [""]
    gpu_name = env.get("device_name") if env.get("capability") else None
    out += ["## Copy roofline", ""] + copy_table(copies, report, gpu_name) + [""]
    out += ["## Ops", ""] + ops_table(rows) + [""]
    out += [f"{line}\n" for line in summary_lines(rows)]
    out.append(f"Measured in {elapsed:.1f} s"
               + (" (stopped starting cases at --max-seconds)." if deadline_hit else ".") + "\n")
    out += [f"- {n}" for n in NOTES]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="the JSON report of `gpu-ops check --json`")
    p.add_argument("--out", help="also write the markdown table here")
    p.add_argument("--json", dest="json_out", help="write the measurements as JSON here")
    p.add_argument("--runs", type=int, default=20, help="timed runs per case (default 20; median)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up runs per case (default 3)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (a dry run; default cuda)")
    p.add_argument("--max-seconds", type=float, default=90.0,
                   help="start no new case past this many seconds (default 90)")
    p.add_argument("--half-dtypes", default="f16",
                   help="dtypes of the forced flash-attention rows: f16, bf16 or f16,bf16 (default f16)")
    a = p.parse_args(argv)
    if a.runs < 1 or a.warmup < 0:
        p.error("--runs must be >= 1 and --warmup >= 0")
    a.half_dtypes = [x.strip() for x in a.half_dtypes.split(",") if x.strip()]
    bad = [x for x in a.half_dtypes if x not in ("f16", "bf16")]
    if bad:
        p.error(f"--half-dtypes: unknown {', '.join(bad)} (f16, bf16)")
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    try:
        report = load_report(args.report)
    except ReportError as e:
        log(f"torch_compare: {e}")
        return 2
    if report["ignored_ops"]:
        log(f"torch_compare: ignored {report['ignored_ops']} entries of 'ops' that are not objects")
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - ImportError or a broken install
        log(f"torch_compare: cannot import torch ({short_error(e)}); install PyTorch or use its venv")
        return 2

    try:
        dev = torch.device(args.device)
    except (RuntimeError, ValueError) as e:
        log(f"torch_compare: bad --device {args.device!r}: {e}")
        return 2
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            log("torch_compare: --device cuda but torch sees no CUDA device "
                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
                "use --device cpu for a dry run")
            return 2
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            log(f"torch_compare: {dev} does not exist ({torch.cuda.device_count()} CUDA devices)")
            return 2
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    elif dev.type != "cpu":
        log(f"torch_compare: --device {args.device!r}: only cuda and cpu are supported")
        return 2

    ctx = Ctx(torch, dev, args.runs, args.warmup, started, args.max_seconds)
    torch.manual_seed(0)

    env = environment(torch, ctx)
    env_lines_ = env_lines(env, report)
    print("## Environment\n\n" + "\n".join(env_lines_) + "\n", flush=True)

    log(f"[{time.monotonic() - started:5.1f}s] copies")
    copies = measure_copies(ctx)
    d2d = None
    for c in copies:
        if c["copy"] == "d2d" and c.get("gbps"):
            d2d = (c["gbps"], f"torch d2d on {'this GPU' if ctx.cuda else 'the CPU'}")
    if d2d is None:
        for d in report["devices"]:
            g = num((d.get("copy") or {}).get("d2d_gbps")) if isinstance(d.get("copy"), dict) else None
            if g and not d.get("emulated"):
                d2d = (g, f"report's own d2d on {d.get('label')}")
                break

    rows = build_rows(report, ctx, args.half_dtypes, log, d2d)
    elapsed = time.monotonic() - started
    deadline_hit = any(r["status"] == "not run" for r in rows) or any(
        "not run" in (c.get("error") or "") for c in copies)
    md = render(args.report, env_lines_, copies, rows, report, env, elapsed, deadline_hit)
    # The environment went out first; print the rest.
    print("## Copy roofline" + md.split("## Copy roofline", 1)[1], end="")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(md)
        log(f"wrote {args.out}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"report": args.report, "environment": env, "copies": copies, "rows": rows,
                       "runs": args.runs, "warmup": args.warmup, "elapsed_s": elapsed,
                       "d2d_rate": {"gbps": d2d[0], "source": d2d[1]} if d2d else None},
                      f, indent=2, default=str)
            f.write("\n")
        log(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
