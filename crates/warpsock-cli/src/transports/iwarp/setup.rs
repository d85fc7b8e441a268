//! Connection setup (`conn`) over warpsock: connect (TCP + MPA), one
//! 8-byte Send each way, abortive close; the loop is the driver's.

use std::net::SocketAddr;
use std::time::Instant;

use warpsock_engine::{connect, Access, Cq, Listener, QpInit, RecvWr, Wc};

use super::group::{context, qp_options, send_wr};
use crate::driver::{self, Job, Ready, IDLE};
use crate::stats::Stats;
use crate::Error;

/// Waits for `want` completions of a connection-setup exchange.
fn wait_n(cq: &Cq, want: usize) -> Result<(), Error> {
    let mut wcs = [Wc::default(); 4];
    let mut got = 0;
    let deadline = Instant::now() + IDLE;
    while got < want {
        let n = cq.wait(&mut wcs[..want - got], IDLE)?;
        if let Some(Err(bad)) = wcs[..n].iter().map(Wc::result).find(Result::is_err) {
            return Err(Error::msg(bad));
        }
        got += n;
        if n == 0 && Instant::now() >= deadline {
            return Err(Error::msg("no completion (the peer stopped)"));
        }
    }
    Ok(())
}

/// Connection setup, client side: until the budget is spent, connect
/// (TCP + MPA), Send 8 bytes and wait for the server's 8-byte answer, then
/// close abortively (as the TCP rows do); then one connection flagged
/// "stop", which the server rejects. `rtts_ns` gets each setup's time.
pub(super) fn client(job: &Job<'_>, addr: SocketAddr, token: u64) -> Result<Stats, Error> {
    let spec = job.spec;
    let ctx = context(spec)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16)?;
    let buf = pd.alloc(16, Access::LOCAL_WRITE);
    buf.write(0, &token.to_le_bytes());
    let init_for = |stop: bool| {
        let mut init = QpInit::new(&pd, &cq);
        init.options = qp_options(spec);
        init.options.private_data = token.to_le_bytes().to_vec();
        init.options.private_data.push(u8::from(stop));
        init.recvs = vec![RecvWr {
            wr_id: 1,
            sgl: buf.sge(8, 8).into(),
        }];
        init
    };
    let st = driver::setups(job, || {
        buf.write(8, &[0; 8]);
        let qp = connect(addr, &init_for(false))
            .map_err(|err| Error::from(err).context(format!("iWARP connection to {addr}")))?;
        qp.post_send(send_wr(2, buf.sge(0, 8).into(), false, true))?;
        wait_n(&cq, 2)?;
        let mut b = [0u8; 8];
        buf.read(8, &mut b);
        qp.abort();
        Ok(b == token.to_le_bytes())
    })?;
    // The server rejects the stop request; that is the expected answer.
    let _ = connect(addr, &init_for(true));
    Ok(st)
}

/// Connection setup, server side: accept, receive the 8 bytes, Send them
/// back, close abortively; until the stop request.
pub(super) fn serve(
    job: &Job<'_>,
    listener: &Listener,
    token: u64,
    ready: Ready<'_>,
) -> Result<Stats, Error> {
    let spec = job.spec;
    let ctx = context(spec)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16)?;
    let buf = pd.alloc(8, Access::LOCAL_WRITE);
    let mut st = Stats::default();
    ready()?;
    loop {
        let req = listener
            .accept(Some(IDLE))
            .map_err(|err| Error::from(err).context("waiting for the client's iWARP connection"))?;
        let pdata = req.private_data().to_vec();
        if pdata.len() < 9 || pdata[..8] != token.to_le_bytes() {
            let _ = req.reject(b"bad token");
            return Err(Error::msg("an iWARP connection with a wrong token"));
        }
        if pdata[8] == 1 {
            let _ = req.reject(b"stop");
            return Ok(st);
        }
        let mut init = QpInit::new(&pd, &cq);
        init.options = qp_options(spec);
        init.recvs = vec![RecvWr {
            wr_id: 1,
            sgl: buf.sge(0, 8).into(),
        }];
        let qp = req.accept(&init, &[])?;
        wait_n(&cq, 1)?;
        qp.post_send(send_wr(2, buf.sge(0, 8).into(), false, true))?;
        wait_n(&cq, 1)?;
        st.received(job.epoch, 8, true);
        qp.abort();
    }
}
