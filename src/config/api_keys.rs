//! `--api-keys-file`: one "KEY TENANT" pair a line.

use std::collections::HashMap;

pub(super) fn load_api_keys(path: &std::path::Path) -> Result<HashMap<String, String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--api-keys-file {}: {e}", path.display()))?;
    let mut keys = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(key), Some(tenant), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "--api-keys-file {} line {}: expected \"KEY TENANT\"",
                path.display(),
                n + 1
            ));
        };
        if key.len() < 16 {
            return Err(format!(
                "--api-keys-file {} line {}: keys must be at least 16 characters",
                path.display(),
                n + 1
            ));
        }
        if keys.insert(key.to_string(), tenant.to_string()).is_some() {
            return Err(format!(
                "--api-keys-file {} line {}: duplicate key",
                path.display(),
                n + 1
            ));
        }
    }
    if keys.is_empty() {
        return Err(format!("--api-keys-file {}: no keys", path.display()));
    }
    Ok(keys)
}
