//! The transports an unmodified program can run over, and how each is
//! detected: for real, by looking at what is installed and built and by
//! asking the preload library what it exports, never assumed.
//!
//! | name | programs | how |
//! |---|---|---|
//! | `tcp` | TCP | the host's own sockets (the TCP baseline) |
//! | `ddp-socket` | TCP | the preload's extended sockets in policy mode, `WARPSOCK_DDP_PORTS=<server ports>`; available when the preload exports `warpsock_feature_ddp_ports` |
//! | `rsocket` | TCP | rdma-core's `librspreload` over warpsock's verbs, `warpsock run --rsockets --`; available when this binary has a `run` subcommand and `warpsock run --rsockets -- true` runs (it finds the verbs library and `librspreload.so`) |
//! | `udp` | UDP | the host's own sockets (the UDP baseline) |
//! | `udp-offload` | UDP | `LD_PRELOAD=libwarpsock_preload.so WARPSOCK_UDP_OFFLOAD=1` |
//! | `udp-gso` | UDP | the same with `WARPSOCK_UDP_MODE=gso`; available when the preload exports `warpsock_feature_udp_gso` |
//!
//! A preload feature is probed by starting this binary under the preload
//! (`warpsock probe-feature NAME`, hidden), which looks the symbol up with
//! `dlsym` in its own process.

use std::path::{Path, PathBuf};

use crate::child::{self, preload_lib};
use crate::Error;

/// Which programs a transport carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proto {
    Tcp,
    Udp,
}

/// How to start a program over a transport: a command prefix and extra
/// environment for both the server and the client program.
#[derive(Debug, Clone, Default)]
pub(crate) struct Launch {
    pub(crate) prefix: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
}

/// A transport of the apps suite.
pub(crate) struct AppTransport {
    pub(crate) name: &'static str,
    pub(crate) proto: Proto,
    detect: fn() -> Result<Setup, String>,
}

/// What detection found: how to launch programs, given the ports the
/// server program listens on.
pub(crate) enum Setup {
    Plain,
    Preload {
        lib: PathBuf,
        vars: Vec<(String, String)>,
    },
    DdpPorts {
        lib: PathBuf,
    },
    Run {
        exe: PathBuf,
    },
}

impl Setup {
    /// The launch of a case whose server listens on `ports`.
    pub(crate) fn launch(&self, ports: &[u16]) -> Launch {
        let preload = |lib: &Path| ("LD_PRELOAD".to_string(), lib.display().to_string());
        match self {
            Self::Plain => Launch::default(),
            Self::Preload { lib, vars } => Launch {
                prefix: Vec::new(),
                env: std::iter::once(preload(lib))
                    .chain(vars.iter().cloned())
                    .collect(),
            },
            Self::DdpPorts { lib } => {
                let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
                // Every connection tries its switch: a server that let
                // one time out is not remembered (the preload's
                // `plain_peers`), or the row's later connections would
                // be plain TCP, measured as DDP mode's.
                Launch {
                    prefix: Vec::new(),
                    env: vec![
                        preload(lib),
                        ("WARPSOCK_DDP_PORTS".into(), ports.join(",")),
                        ("WARPSOCK_DDP_PLAIN_MEMORY_MS".into(), "0".into()),
                    ],
                }
            }
            Self::Run { exe } => Launch {
                prefix: vec![
                    exe.display().to_string(),
                    "run".into(),
                    "--rsockets".into(),
                    "--".into(),
                ],
                env: Vec::new(),
            },
        }
    }
}

/// Every transport of the apps suite, baselines first.
pub(crate) static ALL: &[AppTransport] = &[
    AppTransport {
        name: "tcp",
        proto: Proto::Tcp,
        detect: || Ok(Setup::Plain),
    },
    AppTransport {
        name: "ddp-socket",
        proto: Proto::Tcp,
        detect: || {
            let lib = preload()?;
            feature(&lib, "ddp_ports")?;
            Ok(Setup::DdpPorts { lib })
        },
    },
    AppTransport {
        name: "rsocket",
        proto: Proto::Tcp,
        detect: || {
            if !crate::has_subcommand("run") {
                return Err("this warpsock has no `run` subcommand (verbs layer not built)".into());
            }
            if rspreload().is_none() {
                return Err("librspreload.so is not installed (Debian package librdmacm1)".into());
            }
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let mut cmd = child::command(&[], &exe);
            cmd.args(["run", "--rsockets", "--", "true"]);
            let out = child::run(cmd, "warpsock run", std::time::Duration::from_secs(20))
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!(
                    "`warpsock run --rsockets -- true` fails: {}",
                    crate::ctl::shorten(out.text().trim())
                ));
            }
            Ok(Setup::Run { exe })
        },
    },
    AppTransport {
        name: "udp",
        proto: Proto::Udp,
        detect: || Ok(Setup::Plain),
    },
    AppTransport {
        name: "udp-offload",
        proto: Proto::Udp,
        detect: || {
            Ok(Setup::Preload {
                lib: preload()?,
                vars: vec![("WARPSOCK_UDP_OFFLOAD".into(), "1".into())],
            })
        },
    },
    AppTransport {
        name: "udp-gso",
        proto: Proto::Udp,
        detect: || {
            let lib = preload()?;
            feature(&lib, "udp_gso")?;
            Ok(Setup::Preload {
                lib,
                vars: vec![
                    ("WARPSOCK_UDP_OFFLOAD".into(), "1".into()),
                    ("WARPSOCK_UDP_MODE".into(), "gso".into()),
                ],
            })
        },
    },
];

impl AppTransport {
    /// Detects it: how to launch programs over it, or why it is not
    /// available.
    pub(crate) fn detect(&self) -> Result<Setup, String> {
        (self.detect)()
    }
}

fn preload() -> Result<PathBuf, String> {
    preload_lib().ok_or_else(|| {
        "libwarpsock_preload.so is not built next to this binary \
         (cargo build --release -p warpsock-preload)"
            .to_string()
    })
}

/// rdma-core's rsocket preload library, if installed.
fn rspreload() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so",
        "/usr/lib/aarch64-linux-gnu/rsocket/librspreload.so",
        "/usr/lib64/rsocket/librspreload.so",
        "/usr/lib/rsocket/librspreload.so",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// Whether the preload library `lib` exports `warpsock_feature_NAME`:
/// this binary, started under it, looks the symbol up in its own process.
fn feature(lib: &Path, name: &str) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = child::command(&[], exe);
    cmd.args(["probe-feature", name])
        .env("LD_PRELOAD", lib)
        .env_remove("WARPSOCK_UDP_OFFLOAD");
    let out = child::run(cmd, "the feature probe", std::time::Duration::from_secs(20))
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "the preload library does not export warpsock_feature_{name} (not built yet)"
        ))
    }
}

/// `warpsock probe-feature NAME` (hidden): exit status 0 when a library
/// loaded into this process exports `warpsock_feature_NAME`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProbeCmd {
    /// The feature's name (`udp_gso`, `ddp_ports`).
    name: String,
}

impl crate::Run for ProbeCmd {
    fn run(self) -> Result<(), Error> {
        if !self
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(Error::msg("a feature name is letters, digits and _"));
        }
        let sym = std::ffi::CString::new(format!("warpsock_feature_{}", self.name))
            .expect("no NUL in a checked name");
        // SAFETY: dlsym with the default handle and a NUL-terminated name
        // only looks the symbol up; nothing is called.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, sym.as_ptr()) };
        if p.is_null() {
            Err(Error::msg(format!(
                "no library here exports {}",
                sym.to_string_lossy()
            )))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_finds_only_what_is_exported() {
        // This test binary exports no feature symbol: the probe says no.
        let cmd = ProbeCmd {
            name: "udp_gso".into(),
        };
        assert!(crate::Run::run(cmd).is_err());
        // A symbol every process has is found the same way.
        let libc_sym = std::ffi::CString::new("malloc").unwrap();
        // SAFETY: as in ProbeCmd::run.
        assert!(!unsafe { libc::dlsym(libc::RTLD_DEFAULT, libc_sym.as_ptr()) }.is_null());
        let bad = ProbeCmd { name: "x;y".into() };
        assert!(crate::Run::run(bad).is_err());
    }

    #[test]
    fn launches_carry_the_environment() {
        let s = Setup::DdpPorts {
            lib: PathBuf::from("/x/libwarpsock_preload.so"),
        };
        let l = s.launch(&[8080, 6379]);
        assert!(l
            .env
            .contains(&("WARPSOCK_DDP_PORTS".into(), "8080,6379".into())));
        assert!(l
            .env
            .contains(&("WARPSOCK_DDP_PLAIN_MEMORY_MS".into(), "0".into())));
        assert!(Setup::Plain.launch(&[1]).env.is_empty());
        let names: Vec<&str> = ALL.iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            [
                "tcp",
                "ddp-socket",
                "rsocket",
                "udp",
                "udp-offload",
                "udp-gso"
            ]
        );
    }
}
