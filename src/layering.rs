//! The dependency rule of docs/ARCHITECTURE.md, held by a test: the layers below the API
//! never name the layers above them. `backend`, `pool` and `metrics` run any op's jobs
//! and count them, so they know no op and no route; `ops` is pure computation, so it knows
//! no route, no stored row and no queue. Tests inside those folders are held to it too:
//! a test that needs an op goes where the op is.

/// A folder (or file) under `src/`, and the top-level modules it may not name.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "backend",
        &["ops", "api", "store", "datasets", "tables", "arrays"],
    ),
    (
        "pool",
        &["ops", "api", "store", "datasets", "tables", "arrays"],
    ),
    (
        "metrics.rs",
        &["ops", "api", "store", "datasets", "tables", "arrays"],
    ),
    (
        "ops",
        &["api", "store", "pool", "datasets", "tables", "arrays"],
    ),
];

/// Every `crate::<module>` a source text names, in `use crate::x`, `use crate::{x, y}`
/// and paths in expressions; comments excluded.
fn named_modules(source: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        found.push((n + 1, name));
                    }
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                found.push((n + 1, name));
            }
        }
    }
    found
}

/// The `.rs` files at `path`: the file itself, or every file under the folder.
fn sources(path: &std::path::Path) -> Vec<std::path::PathBuf> {
    if !path.exists() {
        return Vec::new();
    }
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out
}

/// Every import of a forbidden layer under `src/`, as `file:line names module`.
fn violations(src: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    for (layer, forbidden) in FORBIDDEN {
        for file in sources(&src.join(layer)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, module) in named_modules(&text) {
                if forbidden.contains(&module.as_str()) {
                    found.push(format!(
                        "{}:{line} names crate::{module}",
                        file.strip_prefix(src).unwrap_or(&file).display()
                    ));
                }
            }
        }
    }
    found
}

/// Folders whose types carry OpenAPI schemas only as `cfg_attr`s of the `openapi`
/// feature: the domains, the engines, the pool, the stores and the bulk wire form name
/// no `utoipa` of their own (CI also builds the library without the feature).
const SCHEMA_FREE: &[&str] = &[
    "ops", "backend", "pool", "store", "datasets", "wire.rs", "wire",
];

/// Every line under `SCHEMA_FREE` that names `utoipa`, `ToSchema` or a `#[schema(…)]`
/// outside `#[cfg_attr(feature = "openapi", …)]`, as `file:line`.
fn ungated_schemas(src: &std::path::Path) -> Vec<String> {
    let files = SCHEMA_FREE
        .iter()
        .flat_map(|folder| sources(&src.join(folder)));
    lines_where(src, files, |code| {
        let names = ["utoipa", "ToSchema", "#[schema("]
            .iter()
            .any(|n| code.contains(n));
        names && !code.contains("#[cfg_attr(feature = \"openapi\",")
    })
}

/// Every line of `files` whose code (before any `//` comment) `matches`, as `file:line`
/// relative to `root`, sorted.
fn lines_where(
    root: &std::path::Path,
    files: impl IntoIterator<Item = std::path::PathBuf>,
    matches: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            if matches(line.split("//").next().unwrap_or("")) {
                let file = file.strip_prefix(root).unwrap_or(&file);
                found.push(format!("{}:{}", file.display(), i + 1));
            }
        }
    }
    found.sort();
    found
}

/// The most lines a source file under `src/` may have (docs/ARCHITECTURE.md, "Checks
/// that keep the structure"): past it a part moves to a child module.
const MAX_FILE_LINES: usize = 600;

/// Every `.rs` file under `src` longer than `MAX_FILE_LINES`, as `file: lines`.
fn long_files(src: &std::path::Path) -> Vec<String> {
    let mut long: Vec<String> = sources(src)
        .into_iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            (lines > MAX_FILE_LINES).then(|| {
                format!(
                    "{}: {lines}",
                    file.strip_prefix(src).unwrap_or(&file).display()
                )
            })
        })
        .collect();
    long.sort();
    long
}

/// Every line of the service's own sources (`src/`, `tests/`, `benches/` under `root`)
/// that names rustfft's generic planner, as `file:line`. Plans come from the `fft-plans`
/// crate, which compiles the planner once; naming it here would compile every FFT
/// algorithm into each crate that did (half the library's build time, crates/fft-plans).
fn generic_fft_planners(root: &std::path::Path) -> Vec<String> {
    // This file names the planner as the text it looks for.
    let this_file = root.join("src/layering.rs");
    let files = ["src", "tests", "benches"]
        .iter()
        .flat_map(|folder| sources(&root.join(folder)))
        .filter(|f| *f != this_file);
    lines_where(root, files, |code| code.contains("FftPlanner"))
}

/// Where an engine's own crate may be named: cudarc in the CUDA engine's folder, and in
/// `gpu-ops check`'s library report, which asks cudarc for the names it loads. Everything
/// else speaks to devices through `backend::device` (docs/ARCHITECTURE.md, "Devices").
const CUDARC_ALLOWED: &[&str] = &["backend/cuda", "check/environment.rs"];

/// Every line under `src` outside `CUDARC_ALLOWED` whose code names cudarc, as `file:line`.
fn cudarc_outside_its_engine(src: &std::path::Path) -> Vec<String> {
    // This file names cudarc as the text it looks for.
    let mut allowed: Vec<_> = CUDARC_ALLOWED.iter().map(|a| src.join(a)).collect();
    allowed.push(src.join("layering.rs"));
    let files = sources(src)
        .into_iter()
        .filter(|f| !allowed.iter().any(|a| f.starts_with(a)));
    lines_where(src, files, |code| code.contains("cudarc"))
}

/// Lines outside the wgpu engine's folder that name the `wgpu` crate (not the engine's
/// module, `backend::wgpu`), as `path:line`: the engine is reached through the trait.
fn wgpu_outside_its_engine(src: &std::path::Path) -> Vec<String> {
    let allowed = [src.join("backend/wgpu"), src.join("layering.rs")];
    let files = sources(src)
        .into_iter()
        .filter(|f| !allowed.iter().any(|a| f.starts_with(a)));
    lines_where(src, files, |code| {
        code.match_indices("wgpu::").any(|(at, _)| {
            let before = &code[..at];
            let the_module = before.ends_with("backend::") || before.ends_with("super::");
            let longer_name = before.ends_with(|c: char| c.is_alphanumeric() || c == '_');
            !(the_module || longer_name)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_wgpu_engine_names_the_wgpu_crate() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        assert_eq!(wgpu_outside_its_engine(&src), Vec::<String>::new());
        let dir = std::env::temp_dir().join(format!("gpu-ops-wgpu-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("backend/wgpu")).unwrap();
        std::fs::create_dir_all(dir.join("ops/zk")).unwrap();
        std::fs::write(dir.join("backend/wgpu/x.rs"), "use wgpu::Device;\n").unwrap();
        std::fs::write(
            dir.join("ops/zk/gpu.rs"),
            "use crate::backend::wgpu::Param;\nlet d: wgpu::Device;\n",
        )
        .unwrap();
        assert_eq!(wgpu_outside_its_engine(&dir), ["ops/zk/gpu.rs:2"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn no_layer_names_a_layer_above_it() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let found = violations(&src);
        assert!(
            found.is_empty(),
            "imports that point up the layers:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn a_planted_upward_import_is_found() {
        let dir = std::env::temp_dir().join(format!("gpu-ops-layering-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("backend/cuda")).unwrap();
        std::fs::create_dir_all(dir.join("ops")).unwrap();
        std::fs::write(
            dir.join("backend/cuda/x.rs"),
            "use crate::metrics::Metrics;\n// crate::api in a comment\nuse crate::{backend, ops::zk};\n",
        )
        .unwrap();
        std::fs::write(dir.join("ops/y.rs"), "fn f() { crate::store::now(); }\n").unwrap();
        std::fs::write(dir.join("metrics.rs"), "use crate::api::AppState;\n").unwrap();
        let mut found = violations(&dir);
        found.sort();
        assert_eq!(
            found,
            [
                "backend/cuda/x.rs:3 names crate::ops",
                "metrics.rs:1 names crate::api",
                "ops/y.rs:1 names crate::store",
            ]
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn schemas_below_the_api_are_behind_the_openapi_feature() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        assert_eq!(ungated_schemas(&src), Vec::<String>::new());
        let dir = std::env::temp_dir().join(format!("gpu-ops-schemas-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("backend")).unwrap();
        std::fs::write(
            dir.join("backend/x.rs"),
            "#[cfg_attr(feature = \"openapi\", derive(utoipa::ToSchema))]\nstruct A;\n\
             // ToSchema in a comment\n#[derive(utoipa::ToSchema)]\nstruct B;\n",
        )
        .unwrap();
        assert_eq!(ungated_schemas(&dir), ["backend/x.rs:4"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn only_the_cuda_engine_names_cudarc() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        assert_eq!(cudarc_outside_its_engine(&src), Vec::<String>::new());
        let dir = std::env::temp_dir().join(format!("gpu-ops-cudarc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("backend/cuda")).unwrap();
        std::fs::create_dir_all(dir.join("ops/zk")).unwrap();
        std::fs::write(dir.join("backend/cuda/x.rs"), "use cudarc::driver::sys;\n").unwrap();
        std::fs::write(
            dir.join("ops/zk/gpu.rs"),
            "// cudarc in a comment\nuse cudarc::driver::LaunchConfig;\n",
        )
        .unwrap();
        assert_eq!(cudarc_outside_its_engine(&dir), ["ops/zk/gpu.rs:2"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn no_source_file_is_over_600_lines() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        assert_eq!(long_files(&src), Vec::<String>::new());
        let dir = std::env::temp_dir().join(format!("gpu-ops-long-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ops")).unwrap();
        std::fs::write(dir.join("ops/ok.rs"), "\n".repeat(MAX_FILE_LINES)).unwrap();
        std::fs::write(dir.join("ops/long.rs"), "\n".repeat(MAX_FILE_LINES + 1)).unwrap();
        assert_eq!(long_files(&dir), ["ops/long.rs: 601"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn fft_plans_come_from_the_crate_that_compiles_them_once() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        assert_eq!(generic_fft_planners(root), Vec::<String>::new());
        let dir = std::env::temp_dir().join(format!("gpu-ops-fft-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("benches")).unwrap();
        std::fs::create_dir_all(dir.join("src/ops")).unwrap();
        std::fs::write(
            dir.join("benches/x.rs"),
            "// FftPlanner in a comment\nlet p = rustfft::FftPlanner::<f32>::new();\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("src/ops/y.rs"),
            "let p = fft_plans::F32Planner::default();\n",
        )
        .unwrap();
        assert_eq!(generic_fft_planners(&dir), ["benches/x.rs:2"]);
        let _ = std::fs::remove_dir_all(dir);
    }
}
