//! Shared libraries of the workspace, built for the test run that needs
//! them.
//!
//! `cargo test` builds no `cdylib`: a package that is one only (the
//! preload is, so that fat LTO can internalize its data path; BENCHMARKS
//! §6 session 32) has nothing built before the integration tests run, and
//! a test that loads the library from the target directory would load
//! whatever an older build left there. [`cdylib`] runs `cargo build` of
//! the package for the test executable's own profile and target directory
//! first, once per test process; cargo holds no lock while tests run, and
//! a library that is fresh costs a no-op build.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The profile directory (`target/<profile>`) of the running test
/// executable (`target/<profile>/deps/<test>-<hash>`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("{} is not under target/<profile>/deps", exe.display()))
}

/// `target/<profile>/lib<file>.so` of `package`, built now (once per test
/// process) with this test run's profile into its target directory: the
/// place where the binaries of the same build look for it (`warpsock`
/// finds the preload next to itself).
///
/// Panics with cargo's failure if the build fails.
pub fn cdylib(package: &str, file: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(p) = built.get(package) {
        return p.clone();
    }
    let dir = profile_dir();
    let name = dir
        .file_name()
        .and_then(|p| p.to_str())
        .expect("the profile directory's name");
    // The `debug` directory is the `dev` profile's; the others carry
    // their profile's name.
    let profile = if name == "debug" { "dev" } else { name };
    let target = dir.parent().expect("the target directory");
    let st = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", package, "--profile", profile])
        .arg("--target-dir")
        .arg(target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap_or_else(|e| panic!("run cargo build -p {package}: {e}"));
    assert!(
        st.success(),
        "cargo build -p {package} --profile {profile} failed ({st})"
    );
    let so = dir.join(format!("lib{file}.so"));
    assert!(so.exists(), "{} not found after the build", so.display());
    built.insert(package.to_owned(), so.clone());
    so
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_directory_holds_the_deps_directory() {
        // This unit test runs from target/<profile>/deps as the
        // integration tests do.
        let dir = profile_dir();
        assert!(dir.join("deps").is_dir(), "{}", dir.display());
    }
}
