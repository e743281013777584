//! An entry stored as files committed whole (embedding tables, resident arrays): its
//! parts written in order, each through a temporary file synced before its rename, then
//! the directory synced, so an entry answered 201 survives a crash. The last part commits
//! the entry (a loader takes only entries that have it); on failure none is left.

use std::path::{Path, PathBuf};

/// The file that failed, and why.
pub type FileError = (PathBuf, std::io::Error);

/// Writes `<id>.<ext>` for each `(ext, bytes)` of `parts`, in order.
pub fn write_parts(dir: &Path, id: &str, parts: &[(&str, &[u8])]) -> Result<(), FileError> {
    let result = parts
        .iter()
        .try_for_each(|(ext, bytes)| {
            let path = dir.join(format!("{id}.{ext}"));
            let tmp = path.with_extension(format!("{ext}.tmp"));
            let mut f = std::fs::File::create(&tmp).map_err(|e| (tmp.clone(), e))?;
            std::io::Write::write_all(&mut f, bytes).map_err(|e| (tmp.clone(), e))?;
            f.sync_all().map_err(|e| (tmp.clone(), e))?;
            std::fs::rename(&tmp, &path).map_err(|e| (path, e))
        })
        .and_then(|()| {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| (dir.to_path_buf(), e))
        });
    if result.is_err() {
        for (ext, _) in parts.iter().rev() {
            let _ = std::fs::remove_file(dir.join(format!("{id}.{ext}")));
        }
        for (ext, _) in parts {
            let _ = std::fs::remove_file(dir.join(format!("{id}.{ext}.tmp")));
        }
    }
    result
}

/// Removes `<id>.<ext>` for each of `exts`, in order (the committing part first, so a
/// crash between them leaves parts no entry claims); missing files are no error.
pub fn remove_parts(dir: &Path, id: &str, exts: &[&str]) -> Result<(), FileError> {
    for ext in exts {
        let path = dir.join(format!("{id}.{ext}"));
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err((path, e)),
        }
    }
    Ok(())
}
