"""Tests for scripts/check_skips.py (python3 -m unittest scripts/test_check_skips.py)."""

import importlib.util
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("check_skips", os.path.join(HERE, "check_skips.py"))
cs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cs)

README = """# x
## Testing
- `not_this`: a bullet of another section
### Tests allowed to skip
- `a::listed`: why it may
- `scripts/t.py::Case`: no torch
### Next
- `after::the_list`: not on it
"""


class CheckSkips(unittest.TestCase):
    def run_with(self, log, cargo=""):
        with tempfile.TemporaryDirectory() as d:
            paths = {}
            for name, text in (("README.md", README), ("skips.log", log), ("cargo.log", cargo)):
                paths[name] = os.path.join(d, name)
                with open(paths[name], "w", encoding="utf-8") as f:
                    f.write(text)
            return cs.main(["--log", paths["skips.log"], "--readme", paths["README.md"],
                            "--cargo-output", paths["cargo.log"]])

    def test_the_list_is_read_from_its_section_only(self):
        self.assertEqual(cs.allowed(README), ["a::listed", "scripts/t.py::Case"])

    def test_listed_skips_pass(self):
        self.assertEqual(self.run_with("SKIP a::listed: no thp\nSKIP scripts/t.py::Case: no torch\n"), 0)

    def test_an_unlisted_skip_fails(self):
        self.assertEqual(self.run_with("SKIP a::listed: x\nSKIP b::other: no nvrtc\n"), 1)
        self.assertEqual(self.run_with("SKIP after::the_list: x\n"), 1)
        self.assertEqual(self.run_with("SKIP not_this: x\n"), 1)

    def test_an_ignored_test_in_cargos_output_fails_unless_listed(self):
        cargo = "running 2 tests\ntest x::y ... ignored, slow\ntest a::listed ... ignored\n"
        self.assertEqual(self.run_with("", cargo), 1)
        self.assertEqual(self.run_with("", "test a::listed ... ignored, run by its parent\n"), 0)

    def test_no_skip_at_all_passes(self):
        self.assertEqual(self.run_with(""), 0)


if __name__ == "__main__":
    unittest.main()
