"""Fails when a test skipped that the README does not allow to skip.

    python3 scripts/check_skips.py --log target/ci-skips.log --readme README.md \
        [--cargo-output target/ci-test.log ...]

Skips come from two places: the lines `SKIP <test>: <why>` that tests append to the
file GPU_OPS_SKIP_LOG names (gpu_ops::skips in Rust, the client tests' conftest.py and
scripts/test_torch_compare.py in Python), and the `test <name> ... ignored` lines of
`cargo test`'s output (an `#[ignore]`d test, which libtest never runs). The allowed ones
are the README's list under the heading "Tests allowed to skip": one bullet per test,
its name in backticks first, then why. Every skip must be on the list; each is printed.
Exit 0 when all are allowed, 1 otherwise (naming those that are not).
"""

import argparse
import re
import sys

HEADING = "Tests allowed to skip"
IGNORED = re.compile(r"^test (\S+) \.\.\. ignored(?:, (.*))?$")
LOGGED = re.compile(r"^SKIP (.+?): (.*)$")
BULLET = re.compile(r"^[-*] `([^`]+)`")


def allowed(readme_text):
    """The test names listed under the heading, in order."""
    names, inside = [], False
    for line in readme_text.splitlines():
        if line.startswith("#"):
            inside = line.lstrip("#").strip() == HEADING
            continue
        m = BULLET.match(line) if inside else None
        if m:
            names.append(m.group(1))
    return names


def skips(log_text, cargo_outputs):
    """(test, why, where) for every skip the log and the cargo outputs record."""
    found = []
    for line in log_text.splitlines():
        m = LOGGED.match(line.strip())
        if m:
            found.append((m.group(1), m.group(2), "skip log"))
    for name, text in cargo_outputs:
        for line in text.splitlines():
            m = IGNORED.match(line.strip())
            if m:
                found.append((m.group(1), m.group(2) or "#[ignore]", name))
    return found


def unlisted(found, names):
    return [s for s in found if s[0] not in names]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True)
    ap.add_argument("--readme", required=True)
    ap.add_argument("--cargo-output", action="append", default=[])
    args = ap.parse_args(argv)
    with open(args.readme, encoding="utf-8") as f:
        names = allowed(f.read())
    if not names:
        print(f"{args.readme} has no list under '{HEADING}'", file=sys.stderr)
        return 1
    try:
        with open(args.log, encoding="utf-8") as f:
            log_text = f.read()
    except FileNotFoundError:
        log_text = ""  # no test skipped
    outputs = []
    for path in args.cargo_output:
        with open(path, encoding="utf-8", errors="replace") as f:
            outputs.append((path, f.read()))
    found = skips(log_text, outputs)
    for test, why, where in found:
        print(f"skipped: {test} ({why}; {where})")
    bad = unlisted(found, names)
    for test, why, where in bad:
        print(f"NOT ALLOWED: {test} skipped ({why}; {where}), and {args.readme} "
              f"does not list it under '{HEADING}'", file=sys.stderr)
    print(f"{len(found)} skipped, {len(bad)} not allowed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
