//! `gpu-ops new-key`: an API key for `--api-keys-file`, so that a server reachable from a
//! network can be started protected without other tools (the compose file runs it on
//! first start).

use base64::Engine;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug, Clone)]
pub struct NewKeyArgs {
    /// The tenant the key acts for: what its requests' stored objects belong to.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// Append "KEY TENANT" to this file (created readable by its owner only) instead of
    /// printing it; the key itself is not printed then.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// With --file: leave a file that already holds a key as it is (first-start set-up).
    #[arg(long, requires = "file")]
    pub if_missing: bool,
}

/// What happened, for the terminal: the key line (no --file), or a sentence that names
/// the file and tenant but not the key.
pub fn run(args: &NewKeyArgs) -> Result<String, String> {
    let tenant = args.tenant.trim();
    if tenant.is_empty() || tenant.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "--tenant {:?}: a tenant is one word without spaces",
            args.tenant
        ));
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness from the OS: {e}"))?;
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let line = format!("{key} {tenant}");
    let Some(file) = &args.file else {
        return Ok(line);
    };
    if args.if_missing && holds_a_key(file)? {
        return Ok(format!(
            "{} already holds a key; left as it is",
            file.display()
        ));
    }
    append_private(file, &format!("{line}\n"))
        .map_err(|e| format!("--file {}: {e}", file.display()))?;
    Ok(format!(
        "a key for tenant {tenant} added to {}",
        file.display()
    ))
}

/// Whether `file` has a line that is not blank or a comment.
fn holds_a_key(file: &Path) -> Result<bool, String> {
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(text
            .lines()
            .map(str::trim)
            .any(|l| !l.is_empty() && !l.starts_with('#'))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("--file {}: {e}", file.display())),
    }
}

fn append_private(file: &Path, text: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(file)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(file: Option<PathBuf>, if_missing: bool) -> NewKeyArgs {
        NewKeyArgs {
            tenant: "alice".into(),
            file,
            if_missing,
        }
    }

    #[test]
    fn a_printed_key_is_256_bits_for_its_tenant_and_fresh_each_time() {
        let line = run(&args(None, false)).unwrap();
        let (key, tenant) = line.split_once(' ').unwrap();
        assert_eq!(tenant, "alice");
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(key)
            .unwrap();
        assert_eq!(raw.len(), 32);
        assert_ne!(run(&args(None, false)).unwrap(), line);
        let mut bad = args(None, false);
        bad.tenant = "two words".into();
        assert!(run(&bad).unwrap_err().contains("--tenant"));
    }

    #[test]
    fn a_key_file_is_private_loads_as_keys_and_is_kept_when_asked() {
        let dir = std::env::temp_dir().join(format!("gpu-ops-new-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys");
        let said = run(&args(Some(file.clone()), true)).unwrap();
        assert!(said.contains("alice") && said.contains("added"), "{said}");
        let first = std::fs::read_to_string(&file).unwrap();
        assert!(
            !said.contains(first.split(' ').next().unwrap()),
            "the key was echoed"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{mode:o}");
        }
        run(&args(Some(file.clone()), true)).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), first);
        run(&args(Some(file.clone()), false)).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 2);
        let settings = <crate::config::Cli as clap::Parser>::try_parse_from([
            "gpu-ops",
            "--bind",
            "0.0.0.0:8080",
            "--api-keys-file",
            file.to_str().unwrap(),
        ])
        .unwrap()
        .config
        .validate()
        .unwrap();
        assert_eq!(settings.api_keys.unwrap().len(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
