//! The real binary: start-up validation and signal handling.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-ops");

#[test]
fn invalid_flags_fail_at_start_up_with_one_line() {
    for args in [
        &["--queue-capacity", "0"][..],
        &["--backend", "tpu"],
        &["--job-timeout", "soon"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("gpu-ops: "), "{stderr}");
    }
}

#[test]
fn openapi_subcommand_prints_the_committed_document() {
    let out = Command::new(BIN).arg("openapi").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        gpu_ops::api::openapi_json()
    );
}

#[cfg(unix)]
#[test]
fn sigterm_stops_the_server_cleanly_with_exit_code_0() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let data = std::env::temp_dir().join(format!("gpu-ops-process-{}", std::process::id()));
    let mut child = Command::new(BIN)
        .args([
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
            data.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let ready = loop {
        let ok = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        if ok || start.elapsed() > Duration::from_secs(20) {
            break ok;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(ready, "server did not start listening");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "server did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
    let _ = std::fs::remove_dir_all(data);
}
