//! Settings read once from the environment (`warpsock run` sets them from
//! its options; programs started without it may set them by hand).
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `WARPSOCK_CRC` | `1`: every connection asks for MPA CRC32c (on if either side asks, RFC 5044) | `0` |
//! | `WARPSOCK_P2P` | `0`: initiators do not offer peer-to-peer setup (RFC 6581) | `1` |
//! | `WARPSOCK_VERBS_DEBUG` | `1`: log connection-setup failures and misuse to stderr | `0` |

use std::sync::OnceLock;

/// The settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Ask for CRC32c on every connection.
    pub crc: bool,
    /// Offer RFC 6581 peer-to-peer setup as initiator.
    pub p2p: bool,
    /// Log setup failures to stderr.
    pub debug: bool,
}

fn flag(name: &str, default: bool) -> bool {
    match std::env::var(name) {
        Ok(v) => match v.trim() {
            "1" | "on" | "yes" | "true" => true,
            "0" | "off" | "no" | "false" => false,
            _ => default,
        },
        Err(_) => default,
    }
}

/// The settings of this process (read on first use).
pub fn get() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| Config {
        crc: flag("WARPSOCK_CRC", false),
        p2p: flag("WARPSOCK_P2P", true),
        debug: flag("WARPSOCK_VERBS_DEBUG", false),
    })
}

/// Logs to stderr when `WARPSOCK_VERBS_DEBUG=1`.
macro_rules! debug {
    ($($t:tt)*) => {
        if $crate::config::get().debug {
            eprintln!("warpsock-verbs: {}", format_args!($($t)*));
        }
    };
}
pub(crate) use debug;
