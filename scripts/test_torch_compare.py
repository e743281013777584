"""Tests for scripts/torch_compare.py.

    python3 -m unittest scripts/test_torch_compare.py     (or pytest scripts/)

The report-reading and table logic needs only the standard library. The end-to-end cases
run the script with `--device cpu` and skip themselves when torch cannot be imported
(set TORCH_PYTHON to an interpreter that has it, e.g. a throwaway venv).
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torch_compare.py")
_spec = importlib.util.spec_from_file_location("torch_compare", SCRIPT)
tc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tc)

MATMUL = {"kind": "matmul", "batch": 1, "m": 64, "n": 32, "k": 16,
          "trans_a": False, "trans_b": True, "compute": "f32"}

REPORT = {
    "level": "quick",
    "devices": [
        {"label": "cuda:0", "name": "NVIDIA H100 80GB HBM3", "emulated": False,
         "copy": {"bytes": 1 << 30, "d2d_gbps": 1500.0, "h2d_pinned_gbps": 50.0,
                  "d2h_pinned_gbps": 50.0}},
        # As `gpu-ops check` writes it: name and emulated under `info`.
        {"label": "emulated:0", "info": {"name": "emulated", "emulated": True}},
    ],
    "ops": [
        {"op": "matmul", "case": "a", "device": "cuda:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 0.5}, "device_ms": {"median": 0.9}},
         "bytes": 14336, "flops": 65536, "compare": MATMUL},
        {"op": "matmul", "case": "same shape, fewer fields", "device": "cuda:0", "parity": "ok",
         "timings": {"device_ms": {"median": 0.7}},
         "compare": {"kind": "matmul", "m": 64, "n": 32, "k": 16, "trans_b": True, "compute": "fp32"}},
        {"op": "attention", "case": "small", "device": "cuda:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 0.2}},
         "compare": {"kind": "attention", "batch": 1, "heads": 2, "seq_q": 32, "seq_k": 48,
                     "dim": 16, "causal": True}},
        {"op": "conv2d", "case": "small", "device": "cuda:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 0.2}},
         "compare": {"kind": "conv2d", "n": 1, "c": 4, "h": 9, "w": 9, "k": 8, "r": 3, "s": 3,
                     "stride": 2, "pad": 1}},
        {"op": "embedding", "case": "small", "device": "cuda:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 0.01}},
         "compare": {"kind": "embedding", "rows": 100, "dim": 8, "ids": 50}},
        {"op": "ntt", "case": "2^10", "device": "cuda:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 0.05}}, "bytes": 65536},
        {"op": "fft", "case": "unknown kind", "device": "cuda:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 0.05}}, "bytes": 4096,
         "compare": {"kind": "fft", "n": 512}},
        {"op": "matmul", "case": "bad parity", "device": "cuda:0", "parity": "mismatch",
         "timings": {"kernel_ms": {"median": 1.0}}, "compare": MATMUL},
        {"op": "msm", "case": "emulated", "device": "emulated:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 1.0}}, "bytes": 1024},
        {"op": "matmul", "case": "bad compute", "device": "cuda:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 1.0}},
         "compare": {"kind": "matmul", "m": 4, "n": 4, "k": 4, "compute": "int8"}},
        {"op": "attention", "case": "grouped", "device": "cuda:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 0.2}},
         "compare": {"kind": "attention", "batch": 1, "heads": 4, "kv_heads": 2, "seq_q": 16,
                     "dim": 8, "causal": True}},
        {"op": "attention", "case": "bad groups", "device": "cuda:0", "parity": "ok",
         "timings": {"kernel_ms": {"median": 0.2}},
         "compare": {"kind": "attention", "heads": 4, "kv_heads": 3, "seq_q": 16, "dim": 8}},
    ],
}


def torch_python():
    """An interpreter that can import torch, or None."""
    for exe in (os.environ.get("TORCH_PYTHON"), sys.executable):
        if not exe:
            continue
        try:
            r = subprocess.run([exe, "-c", "import torch"], capture_output=True, check=False)
        except OSError:
            continue
        if r.returncode == 0:
            return exe
    return None


class Logic(unittest.TestCase):
    def test_our_time_prefers_kernel_then_device(self):
        self.assertEqual(tc.our_time_ms(REPORT["ops"][0]), (0.5, "kernel_ms"))
        self.assertEqual(tc.our_time_ms(REPORT["ops"][1]), (0.7, "device_ms"))
        self.assertEqual(tc.our_time_ms({"timings": {"kernel_ms": 2}}), (2.0, "kernel_ms"))
        self.assertEqual(tc.our_time_ms({}), (None, None))

    def test_skip_reasons(self):
        devices = tc.device_index(tc_report())
        self.assertIsNone(tc.skip_reason(REPORT["ops"][0], devices))
        self.assertIn("parity", tc.skip_reason(REPORT["ops"][7], devices))
        self.assertIn("emulated", tc.skip_reason(REPORT["ops"][8], devices))
        self.assertIsNone(tc.skip_reason({"op": "x"}, devices))  # missing parity: compared, noted
        skipped = {"op": "x", "parity": "skipped", "reason": "no cuDNN"}
        self.assertIn("no cuDNN", tc.skip_reason(skipped, devices))

    def test_identical_shapes_share_a_key(self):
        self.assertEqual(tc.compare_key(REPORT["ops"][0]["compare"]),
                         tc.compare_key(REPORT["ops"][1]["compare"]))
        other = dict(MATMUL, compute="tf32")
        self.assertNotEqual(tc.compare_key(MATMUL), tc.compare_key(other))
        # One key/value head a query head unless the compare says otherwise.
        attn = {"kind": "attention", "heads": 4, "seq_q": 16, "dim": 8}
        self.assertEqual(tc.compare_key(attn), tc.compare_key(dict(attn, kv_heads=4)))
        self.assertNotEqual(tc.compare_key(attn), tc.compare_key(dict(attn, kv_heads=2)))

    def test_ratio_and_formats(self):
        self.assertAlmostEqual(tc.ratio(2.0, 1.0), 2.0)
        self.assertIsNone(tc.ratio(None, 1.0))
        self.assertIsNone(tc.ratio(1.0, 0.0))
        self.assertEqual(tc.fmt_ratio(1.234), "1.23x")
        self.assertEqual(tc.cell("a|b\nc"), "a\\|b c")

    def test_the_table_gives_tflops_where_flops_are_counted(self):
        op = {"op": "matmul", "case": "4096^3 bf16", "flops": 2 * 4096.0 ** 3}
        timed = tc.op_row(op, "torch.mm", 0.5, "kernel_ms", 0.25,
                          extra={"ours_tflops": 274.9, "ref_tflops": 549.8})
        lines = tc.ops_table([timed, tc.roofline_row({"op": "ntt", "case": "c", "bytes": 1e9},
                                                     1.0, "kernel_ms", (1000.0, "test"))])
        self.assertIn("| Ours TFLOP/s | Ref TFLOP/s |", lines[0])
        self.assertEqual(lines[0].count("|"), lines[1].count("|"))
        self.assertIn("| 2.00x | 274.9 | 549.8 |", lines[2])
        self.assertIn("| - | - |", lines[3])
        self.assertEqual(tc.fmt_tflops(0.123), "0.12")

    def test_roofline_row(self):
        op = {"op": "ntt", "case": "c", "bytes": 1.5e9}
        # 1.5 GB of traffic at twice a 1500 GB/s copy rate: 0.5 ms.
        row = tc.roofline_row(op, 2.0, "kernel_ms", (1500.0, "test"))
        self.assertAlmostEqual(row["ref_ms"], 0.5)
        self.assertAlmostEqual(row["ratio"], 4.0)

    def test_unreadable_reports_raise(self):
        with tempfile.TemporaryDirectory() as d:
            for name, text in (("bad.json", "{oops"), ("list.json", "[]"),
                               ("ops.json", '{"ops": 1}')):
                path = os.path.join(d, name)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                with self.assertRaises(tc.ReportError):
                    tc.load_report(path)
            with self.assertRaises(tc.ReportError):
                tc.load_report(os.path.join(d, "missing.json"))

    def test_main_exits_2_on_unreadable_report(self):
        r = subprocess.run([sys.executable, SCRIPT, "/nonexistent/report.json", "--device", "cpu"],
                           capture_output=True, text=True, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot read report", r.stderr)


def tc_report():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(REPORT, f)
    try:
        return tc.load_report(f.name)
    finally:
        os.unlink(f.name)


class EndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.python = torch_python()
        if cls.python is None:
            why = "torch is not importable (set TORCH_PYTHON)"
            # To the skip log CI checks against the README's list (scripts/check_skips.py).
            if os.environ.get("GPU_OPS_SKIP_LOG"):
                with open(os.environ["GPU_OPS_SKIP_LOG"], "a", encoding="utf-8") as f:
                    f.write(f"SKIP scripts/test_torch_compare.py::EndToEnd: {why}\n")
            raise unittest.SkipTest(why)

    def test_cpu_dry_run(self):
        with tempfile.TemporaryDirectory() as d:
            report = os.path.join(d, "report.json")
            with open(report, "w", encoding="utf-8") as f:
                json.dump(REPORT, f)
            md, js = os.path.join(d, "t.md"), os.path.join(d, "t.json")
            r = subprocess.run([self.python, SCRIPT, report, "--device", "cpu", "--runs", "3",
                                "--warmup", "1", "--out", md, "--json", js],
                               capture_output=True, text=True, timeout=300, check=False)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("## Environment", r.stdout)
            with open(md, encoding="utf-8") as f:
                table = f.read()
            with open(js, encoding="utf-8") as f:
                out = json.load(f)
        rows = out["rows"]
        by_case = {}
        for row in rows:
            by_case.setdefault((row["op"], row["case"]), []).append(row)
        self.assertEqual(by_case[("matmul", "a")][0]["status"], "ok")
        self.assertIn("measured once", by_case[("matmul", "same shape, fewer fields")][0]["note"])
        attn = by_case[("attention", "small")]
        self.assertEqual(attn[0]["status"], "ok")
        self.assertEqual(attn[1]["status"], "skipped")  # flash rows need CUDA
        self.assertEqual(by_case[("conv2d", "small")][0]["status"], "ok")
        self.assertEqual(by_case[("embedding", "small")][0]["status"], "ok")
        self.assertEqual(by_case[("ntt", "2^10")][0]["reference"], "copy roofline")
        self.assertIn("unknown compare kind", by_case[("fft", "unknown kind")][0]["note"])
        self.assertEqual(by_case[("matmul", "bad parity")][0]["status"], "skipped")
        self.assertEqual(by_case[("msm", "emulated")][0]["status"], "skipped")
        self.assertEqual(by_case[("matmul", "bad compute")][0]["status"], "error")
        self.assertEqual(by_case[("attention", "grouped")][0]["status"], "ok")
        self.assertEqual(by_case[("attention", "bad groups")][0]["status"], "error")
        self.assertIn("| Op | Case | Reference |", table)
        self.assertEqual(out["copies"][0]["copy"], "d2d")


if __name__ == "__main__":
    unittest.main()
