//! Where the GPU backend's run-time libraries are looked for: NVRTC (kernel compilation) and
//! nvJPEG (decoding), in one documented order.
//!
//! Owns the search order and nothing else: 1. an explicit path (`--nvrtc` / `--nvjpeg`, or the
//! `PREPFS_NVRTC` / `PREPFS_NVJPEG` environment variables; a file, or a directory holding it),
//! 2. the system loader by soname (`LD_LIBRARY_PATH`, ldconfig: a CUDA toolkit or driver
//! install), 3. the pip layouts inside Python environments (`PREPFS_CUDA_PYTHON`, a
//! colon-separated list, then `VIRTUAL_ENV`, then `CONDA_PREFIX`): `nvidia/cu13/lib`,
//! `nvidia/cuda_nvrtc/lib`, `nvidia/nvjpeg/lib`, and torchvision's bundled
//! `torchvision.libs/libnvjpeg.*.so.13`. Must never load anything: callers try the candidates.

use std::path::{Path, PathBuf};

/// The CUDA major version the backend is built for (cudarc's `cuda-13000` feature): sonames
/// end in `.so.13`.
pub const CUDA_MAJOR: u32 = 13;

/// A run-time library of the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    /// The runtime compiler, for the fused kernel.
    Nvrtc,
    /// The JPEG decoder.
    Nvjpeg,
}

impl Lib {
    /// The library's soname.
    pub fn soname(self) -> String {
        match self {
            Lib::Nvrtc => format!("libnvrtc.so.{CUDA_MAJOR}"),
            Lib::Nvjpeg => format!("libnvjpeg.so.{CUDA_MAJOR}"),
        }
    }

    /// The environment variable naming an explicit path.
    pub fn env(self) -> &'static str {
        match self {
            Lib::Nvrtc => "PREPFS_NVRTC",
            Lib::Nvjpeg => "PREPFS_NVJPEG",
        }
    }
}

/// One place to try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidate {
    /// A file path.
    Path(PathBuf),
    /// A name for the system loader.
    Name(String),
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Candidate::Path(p) => write!(f, "{}", p.display()),
            Candidate::Name(n) => write!(f, "{n} (system loader)"),
        }
    }
}

/// Python environments to search, in order: `PREPFS_CUDA_PYTHON` (colon-separated), then
/// `VIRTUAL_ENV`, then `CONDA_PREFIX`.
pub fn python_envs_from_env() -> Vec<PathBuf> {
    let mut envs: Vec<PathBuf> = Vec::new();
    if let Some(list) = std::env::var_os("PREPFS_CUDA_PYTHON") {
        envs.extend(std::env::split_paths(&list).filter(|p| !p.as_os_str().is_empty()));
    }
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            envs.push(PathBuf::from(p));
        }
    }
    envs
}

/// `site-packages` directories of a Python environment (`lib/python3.*/site-packages`).
fn site_packages(env: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(env.join("lib"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// The candidates for `lib` in search order, given an explicit path (flag, else the
/// environment variable) and the Python environments to search.
pub fn candidates(lib: Lib, explicit: Option<&Path>, python_envs: &[PathBuf]) -> Vec<Candidate> {
    let soname = lib.soname();
    let mut out = Vec::new();
    let env_path = std::env::var_os(lib.env()).map(PathBuf::from);
    if let Some(path) = explicit.map(Path::to_path_buf).or(env_path) {
        if path.is_dir() {
            out.push(Candidate::Path(path.join(&soname)));
        } else {
            out.push(Candidate::Path(path));
        }
    }
    out.push(Candidate::Name(soname.clone()));
    for env in python_envs {
        for sp in site_packages(env) {
            let nvidia = sp.join("nvidia");
            let dirs: &[&str] = match lib {
                Lib::Nvrtc => &["cu13/lib", "cuda_nvrtc/lib"],
                Lib::Nvjpeg => &["cu13/lib", "nvjpeg/lib"],
            };
            for dir in dirs {
                let file = nvidia.join(dir).join(&soname);
                if file.is_file() {
                    out.push(Candidate::Path(file));
                }
            }
            if lib == Lib::Nvjpeg {
                // torchvision's wheel bundles nvJPEG as libnvjpeg.<hash>.so.13.
                let mut bundled: Vec<PathBuf> = std::fs::read_dir(sp.join("torchvision.libs"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
                        name.is_some_and(|n| {
                            n.starts_with("libnvjpeg") && n.ends_with(&format!(".so.{CUDA_MAJOR}"))
                        })
                    })
                    .collect();
                bundled.sort();
                out.extend(bundled.into_iter().map(Candidate::Path));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_order_is_explicit_then_loader_then_python_layouts() {
        let env = tempfile::tempdir().expect("tempdir");
        let sp = env.path().join("lib/python3.11/site-packages");
        for dir in ["nvidia/cu13/lib", "torchvision.libs"] {
            std::fs::create_dir_all(sp.join(dir)).expect("mkdir");
        }
        std::fs::write(sp.join("nvidia/cu13/lib/libnvjpeg.so.13"), b"").expect("write");
        std::fs::write(sp.join("torchvision.libs/libnvjpeg.4a0b5c81.so.13"), b"").expect("write");
        std::fs::write(sp.join("torchvision.libs/libjpeg.d33e0c76.so.8"), b"").expect("write");
        let explicit = env.path().join("mine.so");
        let found = candidates(Lib::Nvjpeg, Some(&explicit), &[env.path().to_path_buf()]);
        assert_eq!(
            found,
            vec![
                Candidate::Path(explicit),
                Candidate::Name("libnvjpeg.so.13".into()),
                Candidate::Path(sp.join("nvidia/cu13/lib/libnvjpeg.so.13")),
                Candidate::Path(sp.join("torchvision.libs/libnvjpeg.4a0b5c81.so.13")),
            ]
        );
        // A directory as the explicit path means the soname inside it; NVRTC ignores
        // torchvision's bundle.
        let nvrtc = candidates(Lib::Nvrtc, Some(env.path()), &[env.path().to_path_buf()]);
        assert_eq!(
            nvrtc,
            vec![
                Candidate::Path(env.path().join("libnvrtc.so.13")),
                Candidate::Name("libnvrtc.so.13".into()),
            ]
        );
    }
}
