//! How a test that cannot run on this machine says so. `skip` prints `SKIP <test>: <why>`
//! and appends the same line to the file that `GPU_OPS_SKIP_LOG` names, where the
//! variable is set. CI sets it (`.ci/run`) and, after the tests, compares every line with
//! the README's list of the tests allowed to skip (`scripts/check_skips.py`): a skip not
//! on that list fails the run, so a test cannot stop running unnoticed. The Python tests
//! write the same lines (`tests/client/conftest.py`, `scripts/test_torch_compare.py`).

use std::io::Write;

/// The variable naming the skip log.
pub const LOG_VAR: &str = "GPU_OPS_SKIP_LOG";

/// Says that `test` skips and why; the caller then returns. Panics if the log is named
/// and cannot be written: a skip CI cannot see must not pass.
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIP {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(LOG_VAR) {
        // One write of one line in append mode: lines from concurrent tests and processes
        // do not interleave.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut log| log.write_all(format!("{line}\n").as_bytes()))
            .unwrap_or_else(|e| panic!("{LOG_VAR}={}: {e}", path.to_string_lossy()));
    }
}

/// The running test's name as libtest gives it (its thread's name), for helpers shared
/// by many tests; "an unnamed test" where the thread has no name.
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .map_or_else(|| "an unnamed test".into(), str::to_owned)
}

/// `skip`, unless `required` (a `REQUIRE_…` variable) is set to 1: then the test fails,
/// naming the variable, for a machine that must be able to run it (CI).
pub fn skip_unless_required(test: &str, why: &str, required: &str) {
    assert!(
        std::env::var(required).as_deref() != Ok("1"),
        "{required}=1 but {test} cannot run: {why}"
    );
    skip(test, &format!("{why} (set {required}=1 to fail instead)"));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log gets exactly the line, appended. Run in a child process so that the
    /// variable is set for it alone (tests share the environment).
    #[test]
    fn a_skip_is_logged_when_the_log_is_named() {
        const CHILD: &str = "GPU_OPS_SKIPS_CHILD";
        if std::env::var_os(CHILD).is_some() {
            skip("the child", "a reason");
            return;
        }
        let dir = std::env::temp_dir().join(format!("gpu-ops-skips-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skips.log");
        std::fs::write(&log, "SKIP earlier: kept\n").unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "skips::tests::a_skip_is_logged_when_the_log_is_named",
            ])
            .env(CHILD, "1")
            .env(LOG_VAR, &log)
            .status()
            .unwrap();
        assert!(status.success());
        let text = std::fs::read_to_string(&log).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(text, "SKIP earlier: kept\nSKIP the child: a reason\n");
    }
}
