//! `warpsock run -- PROGRAM ARGS…`: runs an unmodified libibverbs /
//! librdmacm program (rping, perftest, fi_pingpong, rstream, …) on
//! warpsock. It replaces itself with PROGRAM (exec), with the verbs
//! interposer `libwarpsock_verbs.so` (crate `warpsock-verbs`) in
//! `LD_PRELOAD`, so the program sees the iWARP device `warpsock0` and its
//! connections are warpsock's MPA/DDP/RDMAP over TCP.
//!
//! Environment it sets (usable by hand without `run`):
//!
//! | variable | value |
//! |---|---|
//! | `LD_PRELOAD` | the interposer, then rdma-core's `librspreload.so` with `--rsockets`, then what was there |
//! | `WARPSOCK_CRC` | `1` with `--crc on` (MPA CRC32c on every connection) |
//! | `WARPSOCK_P2P` | `0` with `--p2p off` (no RFC 6581 peer-to-peer offer) |
//! | `WARPSOCK_VERBS_DEBUG` | `1` with `--debug` (log setup failures) |
//!
//! The interposer is looked for in `$WARPSOCK_VERBS_LIB`, next to the
//! `warpsock` executable (where cargo builds it), in its `deps/`, and in
//! `../lib/warpsock/`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Run};

const LIB: &str = "libwarpsock_verbs.so";

/// Where distributions install rdma-core's rsockets preload library.
const RSPRELOAD: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so",
    "/usr/lib/aarch64-linux-gnu/rsocket/librspreload.so",
    "/usr/lib64/rsocket/librspreload.so",
    "/usr/lib/rsocket/librspreload.so",
];

/// On or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Arguments of `warpsock run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunCmd {
    /// MPA CRC32c on every connection (on if either side asks).
    #[arg(long, value_enum, default_value = "off")]
    crc: Switch,
    /// Offer RFC 6581 peer-to-peer setup when connecting.
    #[arg(long, value_enum, default_value = "on")]
    p2p: Switch,
    /// Also preload rdma-core's librspreload.so: unmodified TCP programs
    /// use rsockets, over warpsock.
    #[arg(long)]
    rsockets: bool,
    /// Log connection-setup failures to stderr.
    #[arg(long)]
    debug: bool,
    /// The interposer library (default: found next to this executable).
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    program: Vec<OsString>,
}

fn find_lib(given: Option<PathBuf>) -> Result<PathBuf, Error> {
    if let Some(p) = given.or_else(|| std::env::var_os("WARPSOCK_VERBS_LIB").map(PathBuf::from)) {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::msg(format!("run: no interposer at {}", p.display())))
        };
    }
    let exe = std::env::current_exe().map_err(|e| Error::msg(format!("run: {e}")))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let tried = [
        dir.join(LIB),
        dir.join("deps").join(LIB),
        dir.join("../lib/warpsock").join(LIB),
    ];
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        Error::msg(format!(
            "run: {LIB} not found next to {} (build it with `cargo build -p warpsock-verbs`, \
             same profile, or set WARPSOCK_VERBS_LIB)",
            exe.display()
        ))
    })
}

/// The `LD_PRELOAD` value: ours first, then rsockets, then the old one.
fn preload(lib: &Path, rsockets: Option<&Path>, old: Option<OsString>) -> OsString {
    let mut v = OsString::from(lib);
    if let Some(r) = rsockets {
        v.push(":");
        v.push(r);
    }
    if let Some(o) = old.filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(o);
    }
    v
}

impl Run for RunCmd {
    fn run(self) -> Result<(), Error> {
        let lib = find_lib(self.lib)?;
        let lib = lib.canonicalize().unwrap_or(lib);
        let rs = if self.rsockets {
            Some(
                RSPRELOAD
                    .iter()
                    .map(Path::new)
                    .find(|p| p.is_file())
                    .ok_or_else(|| {
                        Error::msg("run: --rsockets: rdma-core's librspreload.so is not installed (Debian: librdmacm1)")
                    })?,
            )
        } else {
            None
        };
        let (prog, args) = self.program.split_first().expect("clap requires a program");
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .env(
                "LD_PRELOAD",
                preload(&lib, rs, std::env::var_os("LD_PRELOAD")),
            )
            .env(
                "WARPSOCK_CRC",
                if self.crc == Switch::On { "1" } else { "0" },
            )
            .env(
                "WARPSOCK_P2P",
                if self.p2p == Switch::On { "1" } else { "0" },
            );
        if self.debug {
            cmd.env("WARPSOCK_VERBS_DEBUG", "1");
        }
        // Only returns on failure.
        let e = cmd.exec();
        Err(Error::msg(format!(
            "run: cannot start {}: {e}",
            Path::new(prog).display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_order_is_ours_then_rsockets_then_existing() {
        let v = preload(
            Path::new("/a/libwarpsock_verbs.so"),
            Some(Path::new("/r/librspreload.so")),
            Some(OsString::from("/x/other.so")),
        );
        assert_eq!(v, "/a/libwarpsock_verbs.so:/r/librspreload.so:/x/other.so");
        assert_eq!(
            preload(Path::new("/a/l.so"), None, Some(OsString::new())),
            "/a/l.so"
        );
    }

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let e = find_lib(Some(PathBuf::from("/nonexistent/libwarpsock_verbs.so"))).unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent/libwarpsock_verbs.so"),
            "{e}"
        );
    }
}
