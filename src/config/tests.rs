use super::*;

fn parse(args: &[&str]) -> Result<Settings, String> {
    let mut all = vec!["gpu-ops"];
    all.extend_from_slice(args);
    Cli::try_parse_from(all)
        .map_err(|e| e.to_string())?
        .config
        .validate()
}

#[test]
fn defaults_are_valid() {
    let s = parse(&[]).unwrap();
    assert_eq!(s.config.bind.to_string(), "127.0.0.1:8080");
    assert!(s.config.fallback && s.api_keys.is_none() && s.cpu_threads >= 1);
}

#[test]
fn backend_gpu_is_any_gpu_and_cuda_its_old_name() {
    use crate::backend::BackendChoice;
    for (value, choice) in [
        ("auto", BackendChoice::Auto),
        ("gpu", BackendChoice::Gpu),
        ("cuda", BackendChoice::Gpu),
        ("cpu", BackendChoice::Cpu),
    ] {
        assert_eq!(parse(&["--backend", value]).unwrap().config.backend, choice);
    }
}

#[test]
fn invalid_values_are_refused_with_the_flag_named() {
    assert!(parse(&["--queue-capacity", "0"])
        .unwrap_err()
        .contains("--queue-capacity"));
    assert!(parse(&["--cpu-threads", "0"])
        .unwrap_err()
        .contains("--cpu-threads"));
    assert!(parse(&["--job-timeout", "0s"])
        .unwrap_err()
        .contains("--job-timeout"));
    assert!(parse(&["--job-timeout", "soon"]).is_err());
    assert!(parse(&["--backend", "tpu"]).is_err());
    assert!(parse(&["--devices", "0,x"]).is_err());
    assert!(parse(&["--api-keys-file", "/nonexistent/keys"])
        .unwrap_err()
        .contains("--api-keys-file"));
    for (flag, value) in [
        ("--max-tenant-inflight-body-percent", "0"),
        ("--max-tenant-inflight-body-percent", "101"),
        ("--max-tenant-event-streams", "0"),
        ("--secagg-round-ttl", "500ms"),
        ("--tenant-requests-per-second", "inf"),
        ("--tenant-requests-per-second", "NaN"),
    ] {
        let why = parse(&[flag, value]).unwrap_err();
        assert!(why.contains(flag), "{flag} {value}: {why}");
    }
}

#[test]
fn api_keys_file_is_parsed_and_checked() {
    let dir = std::env::temp_dir().join(format!("gpu-ops-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good");
    std::fs::write(
        &good,
        "# comment\n0123456789abcdef alice\n\nfedcba9876543210 bob\n",
    )
    .unwrap();
    let keys = parse(&["--api-keys-file", good.to_str().unwrap()])
        .unwrap()
        .api_keys
        .unwrap();
    assert_eq!(keys["0123456789abcdef"], "alice");
    let short = dir.join("short");
    std::fs::write(&short, "abc alice\n").unwrap();
    assert!(parse(&["--api-keys-file", short.to_str().unwrap()])
        .unwrap_err()
        .contains("16 characters"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_server_reachable_from_the_network_needs_keys_or_an_explicit_opt_out() {
    for bind in ["0.0.0.0:8080", "[::]:8080", "192.0.2.7:8080"] {
        let why = parse(&["--bind", bind]).unwrap_err();
        assert!(
            why.contains("--api-keys-file") && why.contains("--allow-unauthenticated"),
            "{why}"
        );
        let open = parse(&["--bind", bind, "--allow-unauthenticated"]).unwrap();
        assert!(open.api_keys.is_none() && open.config.allow_unauthenticated);
    }
    for bind in ["127.0.0.1:8080", "[::1]:8080", "127.0.0.2:0"] {
        assert!(parse(&["--bind", bind]).is_ok(), "{bind}");
    }
    let dir = std::env::temp_dir().join(format!("gpu-ops-bind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, "0123456789abcdef alice\n").unwrap();
    let keyed = parse(&[
        "--bind",
        "0.0.0.0:8080",
        "--api-keys-file",
        keys.to_str().unwrap(),
    ]);
    assert!(keyed.unwrap().api_keys.is_some());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn connection_limits_are_checked() {
    assert!(parse(&["--header-read-timeout", "10ms"])
        .unwrap_err()
        .contains("--header-read-timeout"));
    assert!(parse(&["--max-connections", "0"])
        .unwrap_err()
        .contains("--max-connections"));
    let s = parse(&[]).unwrap();
    assert_eq!(s.config.header_read_timeout, Duration::from_secs(10));
    assert_eq!(s.config.max_connections, 4096);
}

#[test]
fn bandwidth_min_refresh_defaults_to_5s_and_takes_0s() {
    let s = parse(&[]).unwrap();
    assert_eq!(s.config.bandwidth_min_refresh, Duration::from_secs(5));
    let s = parse(&["--bandwidth-min-refresh", "0s"]).unwrap();
    assert_eq!(s.config.bandwidth_min_refresh, Duration::ZERO);
    let s = parse(&["--bandwidth-min-refresh", "1h"]).unwrap();
    assert_eq!(s.config.bandwidth_min_refresh, Duration::from_secs(3600));
    assert!(parse(&["--bandwidth-min-refresh", "soon"]).is_err());
}
