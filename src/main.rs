use clap::Parser;
use gpu_ops::backend::{BackendChoice, BackendKind};
use gpu_ops::config::{Cli, Command, Config, LogFormat};
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: gpu_ops::huge_pages::HugePageHint = gpu_ops::huge_pages::HugePageHint;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(e.to_string().lines().next().unwrap_or("invalid arguments")),
    };
    match cli.command {
        Some(Command::Openapi) => {
            print!("{}", gpu_ops::api::openapi_json());
            ExitCode::SUCCESS
        }
        Some(Command::Serve(config)) => serve(*config),
        Some(Command::Bench(args)) => bench(&args),
        Some(Command::Check(args)) => check(&args),
        Some(Command::SecaggClient(args)) => match gpu_ops::secagg_client::run_cli(&args) {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("gpu-ops secagg-client: {e}")),
        },
        Some(Command::NewKey(args)) => match gpu_ops::new_key::run(&args) {
            Ok(said) if args.file.is_some() => {
                eprintln!("gpu-ops new-key: {said}");
                ExitCode::SUCCESS
            }
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("gpu-ops new-key: {e}")),
        },
        Some(Command::HipCompile { module, arch, out }) => {
            let library = gpu_ops::ops::kernel_library();
            match gpu_ops::backend::hip::discover::compile_to_file(&library, &module, &arch, &out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&format!("gpu-ops hip-compile: {e}")),
            }
        }
        Some(Command::Healthcheck { addr, path }) => match healthcheck(&addr, &path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpu-ops healthcheck: {e}");
                ExitCode::FAILURE
            }
        },
        None => serve(cli.config),
    }
}

/// One HTTP/1.1 GET with a short timeout; Ok when the status is 200.
fn healthcheck(addr: &str, path: &str) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    use std::time::Duration;
    let timeout = Duration::from_secs(3);
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))?;
    let mut s =
        std::net::TcpStream::connect_timeout(&sock, timeout).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).map_err(|e| e.to_string())?;
    let line = String::from_utf8_lossy(&head[..n]);
    let status = line.split_whitespace().nth(1).unwrap_or("");
    if status == "200" {
        Ok(())
    } else {
        Err(format!(
            "{path} answered {:?}",
            line.lines().next().unwrap_or("")
        ))
    }
}

/// `gpu-ops bench`: the plan, its runs, the table (or JSON).
fn bench(args: &gpu_ops::bench::BenchArgs) -> ExitCode {
    let plan = match args.plan() {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(&e.to_string()),
    };
    let report = match runtime.block_on(gpu_ops::bench::run(&plan)) {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    let json = serde_json::to_string_pretty(&report).expect("a report serializes");
    match &args.json {
        Some(p) if p.as_os_str() == "-" => println!("{json}"),
        Some(p) => {
            print!("{}", report.table());
            if let Err(e) = std::fs::write(p, json) {
                return fail(&format!("{}: {e}", p.display()));
            }
        }
        None => print!("{}", report.table()),
    }
    ExitCode::SUCCESS
}

/// `gpu-ops check`: 0 when every case agreed, 1 when a parity failed, 3 with no device,
/// 2 when it could not run.
fn check(args: &gpu_ops::check::CheckArgs) -> ExitCode {
    use gpu_ops::check::Verdict;
    init_logging(LogFormat::Text);
    match gpu_ops::check::run_cli(args) {
        Ok(Verdict::Passed) => ExitCode::SUCCESS,
        Ok(Verdict::Failed) => ExitCode::from(1),
        Ok(Verdict::NoDevice) => {
            eprintln!("gpu-ops check: no device was checked (see the report's first line)");
            ExitCode::from(3)
        }
        Err(e) => fail(&format!("check: {e}")),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("gpu-ops: {}", message.trim_start_matches("error: "));
    ExitCode::from(2)
}

fn serve(config: Config) -> ExitCode {
    let settings = match config.validate() {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    init_logging(settings.config.log_format);
    let auth = gpu_ops::api::Authentication::of(&settings);
    if let Some(warning) = auth.warning(&settings) {
        tracing::warn!("{warning}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    let code = runtime.block_on(async move {
        let bind = settings.config.bind;
        let require_gpu = settings.config.backend == BackendChoice::Gpu;
        let app = match gpu_ops::App::start(settings) {
            Ok(app) => app,
            Err(e) => return fail(&e),
        };
        if require_gpu {
            app.discovery_finished().await;
            if app.state.backends.active() == BackendKind::Cpu {
                return fail(&format!("--backend gpu: {}", app.state.backends.reason()));
            }
        }
        let shutdown = shutdown_signal();
        let listener = match tokio::net::TcpListener::bind(bind).await {
            Ok(l) => l,
            Err(e) => return fail(&format!("cannot listen on {bind}: {e}")),
        };
        // The bound address, so `--bind host:0` tells which port it got.
        let address = listener.local_addr().unwrap_or(bind);
        tracing::info!(%address, "listening");
        match app.serve(listener, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&format!("server error: {e}")),
        }
    });
    // `serve` has drained within --shutdown-grace. Dropping the runtime would wait for
    // every blocking task still running, without end if one never returns; give them a
    // moment, then exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// Resolves on SIGTERM or ctrl-c. The SIGTERM handler is installed when this is called,
/// not when first polled: a signal that arrives right after "listening" is logged must
/// start a graceful shutdown, not kill the process.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        #[cfg(unix)]
        let term = async {
            match term.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
