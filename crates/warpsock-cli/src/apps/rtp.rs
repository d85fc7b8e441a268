//! `rtp`: streaming media, the UDP offload papers' case. GStreamer sends
//! raw 1080p video at 30 frames/s as RTP over UDP (`videotestsrc !
//! rtpvrawpay ! udpsink`, about 750 Mbit/s); a second GStreamer receives
//! (`udpsrc ! rtpvrawdepay ! fakesink`), printing a line per whole frame,
//! which this process timestamps as it comes. Reported: the share of
//! frames delivered whole, frames lost, the frame-arrival jitter (mean
//! |gap − 1/30 s| between frames the receiver completed) and the CPU of
//! both programs.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::env::{Proto, Setup};
use super::{argv, error_lines, Cx, Measured, Workload};
use crate::child::{self, Proc};
use crate::Error;

/// The workload.
pub(crate) struct Rtp;

const FPS: u64 = 30;

/// The receiver's RTP caps (what the sender's payloader announces).
const CAPS: &str = "application/x-rtp,media=(string)video,clock-rate=(int)90000,\
encoding-name=(string)RAW,sampling=(string)YCbCr-4:2:0,depth=(string)8,\
width=(string)1920,height=(string)1080,colorimetry=(string)BT601-5,payload=(int)96";

impl Workload for Rtp {
    fn name(&self) -> &'static str {
        "rtp"
    }
    fn title(&self) -> &'static str {
        "streaming media: GStreamer raw 1080p30 RTP over UDP"
    }
    fn proto(&self) -> Proto {
        Proto::Udp
    }
    fn needs(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("gst-launch-1.0", "gstreamer1.0-tools"),
            ("stdbuf", "coreutils"),
        ]
    }
    fn metric(&self) -> &'static str {
        "% frames delivered"
    }

    fn run(&self, cx: &Cx, setup: &Setup) -> Result<Vec<Measured>, Error> {
        let port = child::free_port()?;
        let launch = setup.launch(&[port]);
        let frames = if cx.quick {
            FPS
        } else {
            FPS * cx.secs.max(1.0) as u64
        };
        // The receiver, its per-frame lines read as they come.
        let mut c = cx.command(
            &cx.server,
            &launch,
            &argv(&[
                "stdbuf",
                "-oL",
                "gst-launch-1.0",
                "-v",
                "udpsrc",
                &format!("address={}", cx.server.ip),
                &format!("port={port}"),
                "buffer-size=8388608",
                &format!("caps={CAPS}"),
                "!",
                "rtpvrawdepay",
                "!",
                "fakesink",
                "silent=false",
                "sync=false",
            ]),
        );
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut rx = Proc::spawn(c, "gst-launch-1.0 (receiver)")?;
        let out = rx.child.stdout.take().expect("piped");
        let err = rx.child.stderr.take().expect("piped");
        let arrivals = std::thread::spawn(move || {
            let mut t = Vec::new();
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if l.contains("last-message = chain") {
                    t.push(Instant::now());
                }
            }
            t
        });
        let errs = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut { err }, &mut s);
            s
        });
        rx.await_port(port, false, Duration::from_secs(10))?;
        let sent = cx.client(
            &launch,
            &argv(&[
                "gst-launch-1.0",
                "-q",
                "videotestsrc",
                "is-live=true",
                &format!("num-buffers={frames}"),
                "!",
                &format!("video/x-raw,format=I420,width=1920,height=1080,framerate={FPS}/1"),
                "!",
                "rtpvrawpay",
                "mtu=1400",
                "!",
                "udpsink",
                &format!("host={}", cx.server.ip),
                &format!("port={port}"),
                "sync=true",
            ]),
        );
        // The last frames' datagrams are in flight for a moment.
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: kill(2) on the pid of our own child, not yet reaped.
        unsafe { libc::kill(rx.child.id() as libc::pid_t, libc::SIGINT) };
        if rx.wait_within(Duration::from_secs(5)).is_none() {
            let _ = rx.child.kill();
            let _ = rx.child.wait();
        }
        drop(rx);
        let times = arrivals.join().unwrap_or_default();
        let rx_err = errs.join().unwrap_or_default();
        let mut problems = Vec::new();
        if let Err(e) = sent {
            problems.push(e.to_string());
        }
        problems.extend(error_lines(&rx_err));
        let got = times.len() as u64;
        if got > frames {
            problems.push(format!("{got} frames arrived of {frames} sent"));
        }
        Ok(vec![Measured {
            case: format!("1080p30 raw, {frames} frames"),
            value: got as f64 * 100.0 / frames as f64,
            jitter_ms: jitter_ms(&times),
            lost: Some(frames.saturating_sub(got)),
            requests: Some(frames),
            bytes: Some(got * 1920 * 1080 * 3 / 2),
            problems,
            ..Measured::default()
        }])
    }
}

/// Mean |gap − 1/FPS| between consecutive arrivals, in ms.
fn jitter_ms(t: &[Instant]) -> Option<f64> {
    if t.len() < 2 {
        return None;
    }
    let nominal = 1000.0 / FPS as f64;
    let sum: f64 = t
        .windows(2)
        .map(|w| ((w[1] - w[0]).as_secs_f64() * 1000.0 - nominal).abs())
        .sum();
    Some(sum / (t.len() - 1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_of_a_steady_stream_is_small() {
        let t0 = Instant::now();
        let steady: Vec<Instant> = (0..10)
            .map(|i| t0 + Duration::from_micros(33_333 * i))
            .collect();
        assert!(jitter_ms(&steady).unwrap() < 0.01);
        // Frames in pairs every two periods: gaps of 0 and 66 ms.
        let bursty: Vec<Instant> = (0..10)
            .map(|i| t0 + Duration::from_millis(66 * (i / 2)))
            .collect();
        assert!(jitter_ms(&bursty).unwrap() > 10.0);
        assert_eq!(jitter_ms(&steady[..1]), None);
    }
}
