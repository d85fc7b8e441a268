//! `warpsock rping`: rdma-core's rping exchange over warpsock, as client
//! (`-c -a HOST -p PORT`) or server (`-s`), wire-compatible with `rping` on
//! Linux soft-iWARP. The protocol lives in the `warpsock-rping` crate.

use crate::{Error, Run};

/// Arguments of `warpsock rping` (rping's own options).
#[derive(Debug, clap::Args)]
#[command(disable_version_flag = true)]
pub(crate) struct RpingCmd {
    #[command(flatten)]
    args: warpsock_rping::Args,
}

impl Run for RpingCmd {
    fn run(self) -> Result<(), Error> {
        let report =
            warpsock_rping::run(&self.args).map_err(|e| Error::msg(format!("rping: {e}")))?;
        println!("{report}");
        Ok(())
    }
}
