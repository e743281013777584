//! The real server binary as a child process.

use std::process::{Child, Command, Stdio};

/// Starts the server binary on `data` (and `extra` flags) with an OS-chosen port, and returns it and the port it
/// reports in its "listening" log line (no free-port race between parallel tests).
pub fn spawn_server(data: &std::path::Path, extra: &[&str]) -> (Child, u16) {
    spawn_server_env(data, extra, &[])
}

/// `spawn_server` with more environment variables.
pub fn spawn_server_env(
    data: &std::path::Path,
    extra: &[&str],
    env: &[(&str, String)],
) -> (Child, u16) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-ops"))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args([
            "--bind",
            "127.0.0.1:0",
            "--backend",
            "cpu",
            "--cpu-threads",
            "1",
            "--log-format",
            "json",
        ])
        .args(["--data-dir", data.to_str().unwrap()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("server exited before listening (see its log line above)")
            .unwrap();
        if line.contains("\"ERROR\"") || !line.starts_with('{') {
            eprintln!("server: {line}");
        }
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["fields"]["message"] == "listening" {
            let address = v["fields"]["address"].as_str().unwrap().to_string();
            break address.rsplit(':').next().unwrap().parse::<u16>().unwrap();
        }
    };
    // Keep draining the log so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, port)
}

/// A server process on a fresh data directory, killed (and the directory removed) when
/// dropped.
pub struct Replica {
    pub child: Child,
    pub url: String,
    pub data: std::path::PathBuf,
}

impl Replica {
    pub fn start(flags: &[&str], env: &[(&str, String)]) -> Self {
        let data = std::path::PathBuf::from(super::temp_data_dir());
        let (child, port) = spawn_server_env(&data, flags, env);
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            data,
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
