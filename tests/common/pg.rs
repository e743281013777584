//! A real, throwaway PostgreSQL for tests: the distribution's server, initialised in a
//! temporary directory and started on a loopback port, once per test binary, with a
//! fresh database per test. `GPU_OPS_TEST_POSTGRES_URL` (a superuser URL) uses a running
//! server instead. Where neither is possible the tests say so and skip, unless
//! `REQUIRE_POSTGRES=1` (CI), which makes that a failure.
//!
//! The server is stopped by a watchdog shell that outlives no test binary: it polls the
//! binary's pid and stops PostgreSQL (fast shutdown) and removes its directory once the
//! binary has exited, whichever way it exited (not before: a start that failed on a
//! taken port is retried on the same cluster directory).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub struct Cluster {
    /// A superuser URL without a database name.
    base: String,
}

impl Cluster {
    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}", self.base)
    }
}

/// The binary's cluster, started on first use; `None` (with the reason printed) where no
/// PostgreSQL can be had and `REQUIRE_POSTGRES` is not set.
pub fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(start) {
        Ok(c) => Some(c),
        Err(why) => {
            gpu_ops::skips::skip_unless_required(
                &gpu_ops::skips::current_test(),
                &format!("no PostgreSQL ({why})"),
                "REQUIRE_POSTGRES",
            );
            None
        }
    }
}

/// A new, empty database on the binary's cluster, as a URL; `None` to skip.
pub fn fresh_database() -> Option<String> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let cluster = cluster()?;
    let name = format!(
        "gpu_ops_test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let admin = cluster.url("postgres");
    let stmt = format!("CREATE DATABASE {name}");
    // The synchronous client runs its own runtime: never on an async test's thread.
    std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&admin, postgres::NoTls)
            .unwrap_or_else(|e| panic!("{admin}: {e}"));
        client
            .batch_execute(&stmt)
            .expect("create the test database");
    })
    .join()
    .expect("database creation");
    Some(cluster.url(&name))
}

/// Runs `f` with a client of `url` on a plain thread (see `fresh_database`).
pub fn with_client<T: Send + 'static>(
    url: &str,
    f: impl FnOnce(&mut postgres::Client) -> T + Send + 'static,
) -> T {
    let url = url.to_string();
    std::thread::spawn(move || {
        let mut client =
            postgres::Client::connect(&url, postgres::NoTls).unwrap_or_else(|e| panic!("{e}"));
        f(&mut client)
    })
    .join()
    .expect("the PostgreSQL client thread")
}

fn start() -> Result<Cluster, String> {
    if let Ok(url) = std::env::var("GPU_OPS_TEST_POSTGRES_URL") {
        let base = url.trim_end_matches('/').to_string();
        return Ok(Cluster { base });
    }
    let bin = server_binaries()?;
    let as_root = effective_uid()? == 0;
    let dir = std::env::temp_dir().join(format!("gpu-ops-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // initdb refuses to run as root: the cluster belongs to the `postgres` account then.
    if as_root {
        run(Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir))?;
    }
    let data = dir.join("data");
    run(as_user(as_root, &bin.join("initdb"))
        .args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "-D",
        ])
        .arg(&data))?;
    let mut last = String::new();
    for _ in 0..5 {
        let port = free_port()?;
        match launch(&bin, &dir, &data, port, as_root) {
            Ok(()) => {
                return Ok(Cluster {
                    base: format!("postgres://postgres@127.0.0.1:{port}"),
                })
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Starts the server under its watchdog and waits until it takes connections.
fn launch(bin: &Path, dir: &Path, data: &Path, port: u16, as_root: bool) -> Result<(), String> {
    let log = dir.join("server.log");
    // fsync off: a test cluster need not survive a power cut, only its clients' deaths.
    let script = format!(
        "'{postgres}' -D '{data}' -h 127.0.0.1 -p {port} -k '{dir}' -c fsync=off \
         -c full_page_writes=off -c max_connections=200 >'{log}' 2>&1 & pg=$!; \
         while [ -d /proc/{me} ]; do sleep 0.5; done; \
         kill -INT $pg 2>/dev/null; wait $pg; rm -rf '{dir}'",
        postgres = bin.join("postgres").display(),
        data = data.display(),
        dir = dir.display(),
        log = log.display(),
        me = std::process::id(),
    );
    as_user(as_root, Path::new("sh"))
        .args(["-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("start postgres: {e}"))?;
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = std::thread::spawn({
            let url = url.clone();
            move || postgres::Client::connect(&url, postgres::NoTls).map(drop)
        })
        .join()
        .map_err(|_| "the probe panicked".to_string())?;
        match ready {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "postgres on port {port} never answered ({e}): {log}"
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The directory with `initdb` and `postgres`: `GPU_OPS_TEST_POSTGRES_BIN`, where `initdb`
/// on the PATH really lives, or Debian's `/usr/lib/postgresql/<version>/bin`.
fn server_binaries() -> Result<PathBuf, String> {
    let has_both = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Ok(d) = std::env::var("GPU_OPS_TEST_POSTGRES_BIN") {
        return Ok(PathBuf::from(d));
    }
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("initdb"))
            .collect::<Vec<_>>()
    });
    for initdb in on_path {
        if let Some(dir) = std::fs::canonicalize(&initdb)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            if has_both(&dir) {
                return Ok(dir);
            }
        }
    }
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| rd.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    debian.sort();
    debian
        .into_iter()
        .rev()
        .find(|d| has_both(d))
        .ok_or_else(|| "no initdb and postgres (install Debian's `postgresql`)".into())
}

fn as_user(as_root: bool, program: &Path) -> Command {
    if as_root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn effective_uid() -> Result<u32, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok())
        .ok_or_else(|| "no Uid in /proc/self/status".into())
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}
