//! `warpsock report RESULTS.json --out DIR`: the paper-style figures of a
//! bench run as PNG and SVG (plotters; text drawn with a TrueType font
//! loaded at run time, DejaVu Sans from the `fonts-dejavu-core` package by
//! default), plus `summary.md` naming the winner of each test and its
//! ratio to host TCP.
//!
//! Figures (each only if the run has its test): latency vs size (event
//! driven, busy polling), bandwidth vs size (one way, both ways), scaling
//! with N (multi-stream, hot-spot, fan-in, fan-out), CPU vs bandwidth, CPU
//! cost vs size, normalized CPU and connection setup.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::apps::AppRecord;
use crate::report::{self, Record};
use crate::{Error, Run};

/// Fonts tried when --font is not given.
const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];
/// Figure size in pixels.
const W: u32 = 960;
const H: u32 = 600;

/// `warpsock report` options.
#[derive(Debug, clap::Args)]
pub(crate) struct ReportCmd {
    /// A results file written by `warpsock bench --json`.
    #[arg(value_name = "RESULTS.json")]
    input: PathBuf,
    /// Directory for the figures and summary.md (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// TrueType font for the figures' text [default: DejaVu Sans, from
    /// the fonts-dejavu-core package].
    #[arg(long, value_name = "FILE")]
    font: Option<PathBuf>,
}

impl Run for ReportCmd {
    fn run(self) -> Result<(), Error> {
        let text = std::fs::read_to_string(&self.input)
            .map_err(|e| Error::msg(format!("cannot read {}: {e}", self.input.display())))?;
        let (meta, records) = report::from_json(&text)
            .map_err(|e| Error::msg(format!("{}: {e}", self.input.display())))?;
        let apps = report::json::apps_from_json(&text)
            .map_err(|e| Error::msg(format!("{}: {e}", self.input.display())))?;
        if records.is_empty() && apps.is_empty() {
            return Err(Error::msg(format!(
                "{}: no results to draw",
                self.input.display()
            )));
        }
        load_font(self.font.as_deref())?;
        std::fs::create_dir_all(&self.out)
            .map_err(|e| Error::msg(format!("cannot create {}: {e}", self.out.display())))?;
        let mut figs = draw_all(&records, &self.out)?;
        figs.extend(draw_apps(&apps, &self.out)?);
        let mut md = report::summary(&meta, &records);
        md.push_str(&report::apps::summary(&apps));
        md.push_str("\n## Figures\n\n");
        for (name, title) in &figs {
            md.push_str(&format!(
                "- {title}: [{name}.png]({name}.png), [{name}.svg]({name}.svg)\n"
            ));
        }
        let path = self.out.join("summary.md");
        std::fs::write(&path, md)
            .map_err(|e| Error::msg(format!("cannot write {}: {e}", path.display())))?;
        println!(
            "{} figures (PNG + SVG) and summary.md in {}",
            figs.len(),
            self.out.display()
        );
        Ok(())
    }
}

fn load_font(path: Option<&Path>) -> Result<(), Error> {
    let candidates: Vec<PathBuf> = match path {
        Some(p) => vec![p.to_path_buf()],
        None => FONTS.iter().map(PathBuf::from).collect(),
    };
    let Some((p, bytes)) = candidates
        .iter()
        .find_map(|p| std::fs::read(p).ok().map(|b| (p, b)))
    else {
        return Err(Error::msg(match path {
            Some(p) => format!("cannot read the font {}", p.display()),
            None => "no TrueType font for the figures' text: install fonts-dejavu-core \
                     (apt-get install fonts-dejavu-core) or pass --font FILE.ttf"
                .to_string(),
        }));
    };
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| Error::msg(format!("{}: not a usable TrueType font", p.display())))
}

/// A named series of (x, y) points.
type Series = (String, Vec<(f64, f64)>);

/// Groups `rs` into series (transport + CRC) of (x, y): the suite's own
/// in the order they first appear, then the external peers'.
fn series(
    rs: &[&Record],
    x: impl Fn(&Record) -> f64,
    y: impl Fn(&Record) -> Option<f64>,
) -> Vec<Series> {
    let mut order: Vec<String> = Vec::new();
    let mut m: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rs {
        let Some(v) = y(r).filter(|v| v.is_finite() && *v > 0.0) else {
            continue;
        };
        let k = r.series();
        if !order.contains(&k) {
            order.push(k.clone());
        }
        m.entry(k).or_default().push((x(r), v));
    }
    // Stable: keeps each group's order.
    order.sort_by_key(|k| report::is_peer_series(k));
    order
        .into_iter()
        .map(|k| {
            let mut v = m.remove(&k).unwrap_or_default();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            (k, v)
        })
        .collect()
}

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 16] = [
        RGBColor(0, 0, 0),
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(23, 190, 207),
        RGBColor(188, 189, 34),
        RGBColor(0, 0, 128),
        RGBColor(128, 0, 0),
        RGBColor(0, 128, 128),
        RGBColor(255, 215, 0),
        RGBColor(70, 240, 240),
    ];
    C[i % C.len()]
}

/// How a line chart is laid out.
struct Chart<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    /// x axis: sizes in bytes (labels like 64K) or counts.
    x_bytes: bool,
    y_log: bool,
}

/// `v` rounded to two significant digits.
fn sig2(v: f64) -> f64 {
    if v <= 0.0 {
        return v;
    }
    let m = 10f64.powf(v.log10().floor() - 1.0);
    (v / m).round() * m
}

fn num_label(v: f64) -> String {
    if v >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn bounds(ss: &[Series]) -> Option<((f64, f64), (f64, f64))> {
    let pts: Vec<(f64, f64)> = ss.iter().flat_map(|s| s.1.iter().copied()).collect();
    if pts.is_empty() {
        return None;
    }
    let f = |g: fn(&(f64, f64)) -> f64| {
        let v: Vec<f64> = pts.iter().map(g).collect();
        (
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    };
    Some((f(|p| p.0), f(|p| p.1)))
}

fn e<T: std::fmt::Debug>(x: T) -> Error {
    Error::msg(format!("drawing failed: {x:?}"))
}

fn draw_lines<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Chart<'_>,
    ss: &[Series],
) -> Result<(), Error>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(e)?;
    let Some(((x0, x1), (y0, y1))) = bounds(ss) else {
        return Ok(());
    };
    let plot = layout(root, c.title, ss, false)?;
    // x (sizes, connection counts: powers of two) is drawn as log2(x) on
    // a linear axis, labelled at whole powers.
    let (lx0, lx1) = (x0.max(1e-9).log2(), x1.max(1e-9).log2());
    let (x0, x1) = (lx0 - 0.3, lx1 + 0.3);
    let mut b = ChartBuilder::on(&plot);
    b.margin(12).x_label_area_size(48).y_label_area_size(64);
    let xf = |v: &f64| {
        if (v - v.round()).abs() > 1e-6 {
            return String::new();
        }
        let n = 2f64.powf(v.round());
        if c.x_bytes {
            crate::spec::fmt_size(n as usize)
                .replace(" KiB", "K")
                .replace(" MiB", "M")
                .replace(" B", "")
        } else {
            format!("{n}")
        }
    };
    // A log y axis is drawn as log10(y) on a linear axis, so that its
    // labels fall evenly (plotters' log axis labels only some decades).
    let ly = |y: f64| if c.y_log { y.log10() } else { y };
    let ss: Vec<Series> = ss
        .iter()
        .map(|(n, p)| {
            (
                n.clone(),
                p.iter().map(|&(x, y)| (x.log2(), ly(y))).collect(),
            )
        })
        .collect();
    let (ylo, yhi) = if c.y_log {
        let (a, b) = (y0.log10(), y1.log10());
        let pad = ((b - a) * 0.06).max(0.05);
        (a - pad, b + pad)
    } else {
        (0.0, y1 * 1.1)
    };
    let yf = |v: &f64| {
        if c.y_log {
            num_label(sig2(10f64.powf(*v)))
        } else {
            num_label(*v)
        }
    };
    let mut ch = b.build_cartesian_2d(x0..x1, ylo..yhi).map_err(e)?;
    ch.configure_mesh()
        .x_labels(((lx1 - lx0).round() as usize + 1).clamp(2, 13))
        .x_desc(c.x_desc)
        .y_desc(c.y_desc)
        .x_label_formatter(&xf)
        .y_label_formatter(&yf)
        .y_labels(12)
        .max_light_lines(1)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for (i, (name, pts)) in ss.iter().enumerate() {
        let col = color(i);
        if report::is_peer_series(name) {
            // External peers: thin line, hollow rings.
            ch.draw_series(LineSeries::new(pts.clone(), col.stroke_width(1)))
                .map_err(e)?;
            ch.draw_series(pts.iter().map(|&p| Circle::new(p, 6, col.stroke_width(2))))
                .map_err(e)?;
        } else {
            ch.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))
                .map_err(e)?;
            ch.draw_series(pts.iter().map(|&p| Circle::new(p, 3, col.filled())))
                .map_err(e)?;
        }
    }
    root.present().map_err(e)
}

/// Legend width in pixels, right of the plot.
const LEGEND_W: u32 = 270;

/// Splits `root` under a title into the plot (left) and a legend column
/// (right), draws the legend there and returns the plot area. The legend:
/// a line (or, for `points`, a dot; for an external peer, a ring) and the
/// name of each series, in the series' colour.
fn layout<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    ss: &[Series],
    points: bool,
) -> Result<DrawingArea<DB, Shift>, Error>
where
    DB::ErrorType: 'static,
{
    let area = root.titled(title, ("sans-serif", 22)).map_err(e)?;
    let w = area.dim_in_pixel().0;
    let (plot, side) = area.split_horizontally(w.saturating_sub(LEGEND_W));
    for (i, (name, _)) in ss.iter().enumerate() {
        let col = color(i);
        let y = 24 + 22 * i as i32;
        if report::is_peer_series(name) {
            side.draw(&Circle::new((18, y), 6, col.stroke_width(2)))
                .map_err(e)?;
        } else if points {
            side.draw(&Circle::new((18, y), 5, col.filled()))
                .map_err(e)?;
        } else {
            side.draw(&PathElement::new(
                vec![(4, y), (32, y)],
                col.stroke_width(3),
            ))
            .map_err(e)?;
        }
        side.draw(&Text::new(
            name.clone(),
            (40, y - 8),
            ("sans-serif", 14).into_font().color(&BLACK),
        ))
        .map_err(e)?;
    }
    Ok(plot)
}

/// Points without lines, linear axes from 0 (CPU vs bandwidth).
fn draw_scatter<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Chart<'_>,
    ss: &[Series],
) -> Result<(), Error>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(e)?;
    let Some(((_, x1), (_, y1))) = bounds(ss) else {
        return Ok(());
    };
    let plot = layout(root, c.title, ss, true)?;
    let mut ch = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x1 * 1.15, 0.0..y1 * 1.15)
        .map_err(e)?;
    let f = |v: &f64| num_label(*v);
    ch.configure_mesh()
        .x_desc(c.x_desc)
        .y_desc(c.y_desc)
        .x_label_formatter(&f)
        .y_label_formatter(&f)
        .max_light_lines(1)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for (i, (name, pts)) in ss.iter().enumerate() {
        let col = color(i);
        let style = if report::is_peer_series(name) {
            col.stroke_width(2)
        } else {
            col.filled()
        };
        let r = if report::is_peer_series(name) { 6 } else { 5 };
        ch.draw_series(pts.iter().map(|&p| Circle::new(p, r, style)))
            .map_err(e)?;
    }
    root.present().map_err(e)
}

/// Horizontal bars, one per (label, value).
fn draw_bars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Chart<'_>,
    bars: &[(String, f64)],
) -> Result<(), Error>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(e)?;
    if bars.is_empty() {
        return Ok(());
    }
    let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-12);
    let n = bars.len() as f64;
    let mut ch = ChartBuilder::on(root)
        .caption(c.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..max * 1.35, -0.6..n - 0.4)
        .map_err(e)?;
    let f = |v: &f64| num_label(*v);
    ch.configure_mesh()
        .x_desc(c.x_desc)
        .x_label_formatter(&f)
        .disable_y_mesh()
        .disable_y_axis()
        .max_light_lines(1)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for (i, (name, v)) in bars.iter().enumerate() {
        let y = n - 1.0 - i as f64;
        let col = color(i + 1);
        ch.draw_series(std::iter::once(Rectangle::new(
            [(0.0, y - 0.35), (*v, y + 0.35)],
            col.mix(0.75).filled(),
        )))
        .map_err(e)?;
        ch.draw_series(std::iter::once(Text::new(
            format!("{name}: {}", num_label(*v)),
            (max * 0.01, y + 0.1),
            ("sans-serif", 15).into_font().color(&BLACK),
        )))
        .map_err(e)?;
    }
    root.present().map_err(e)
}

enum Kind {
    Lines(Vec<Series>),
    Scatter(Vec<Series>),
    Bars(Vec<(String, f64)>),
}

/// Writes `name`.png and `name`.svg.
fn save(dir: &Path, name: &str, c: &Chart<'_>, k: &Kind) -> Result<(), Error> {
    let draw = |root: &DrawingArea<_, Shift>| match k {
        Kind::Lines(s) => draw_lines(root, c, s),
        Kind::Scatter(s) => draw_scatter(root, c, s),
        Kind::Bars(b) => draw_bars(root, c, b),
    };
    let svg = dir.join(format!("{name}.svg"));
    {
        let root = SVGBackend::new(&svg, (W, H)).into_drawing_area();
        match k {
            Kind::Lines(s) => draw_lines(&root, c, s)?,
            Kind::Scatter(s) => draw_scatter(&root, c, s)?,
            Kind::Bars(b) => draw_bars(&root, c, b)?,
        }
    }
    let mut buf = vec![0u8; (W * H * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (W, H)).into_drawing_area();
        draw(&root)?;
    }
    let png = dir.join(format!("{name}.png"));
    let f = std::fs::File::create(&png)
        .map_err(|e| Error::msg(format!("cannot write {}: {e}", png.display())))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), W, H);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Best);
    enc.write_header()
        .and_then(|mut w| w.write_image_data(&buf))
        .map_err(|e| Error::msg(format!("cannot write {}: {e}", png.display())))
}

/// One figure per application workload: every case that ran and passed
/// its checks, a bar per transport; returns (file stem, title).
fn draw_apps(apps: &[AppRecord], dir: &Path) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for r in apps {
        if !names.contains(&r.workload.as_str()) {
            names.push(&r.workload);
        }
    }
    for w in names {
        let rs: Vec<&AppRecord> = apps
            .iter()
            .filter(|r| r.workload == w && r.ok && r.value.is_some())
            .collect();
        let Some(first) = rs.first() else { continue };
        let bars: Vec<(String, f64)> = rs
            .iter()
            .map(|r| {
                (
                    format!("{} / {}", r.case, r.transport),
                    r.value.unwrap_or(0.0),
                )
            })
            .collect();
        let title = format!("{w}: {}", first.metric);
        let name = format!("apps-{w}");
        let chart = Chart {
            title: &title,
            x_desc: &first.metric,
            y_desc: "",
            x_bytes: false,
            y_log: false,
        };
        save(dir, &name, &chart, &Kind::Bars(bars))?;
        out.push((name, title.clone()));
    }
    Ok(out)
}

/// Draws every figure the records allow; returns (file stem, title).
fn draw_all(records: &[Record], dir: &Path) -> Result<Vec<(String, String)>, Error> {
    let of = |test: &str| -> Vec<&Record> {
        records.iter().filter(|r| r.test == test && r.ok).collect()
    };
    // p50; a peer that reports only a mean is drawn with its mean, and its
    // legend says "(mean)" (Record::series).
    let p50 = |r: &Record| r.one_way_us.as_ref().map(|p| p.typical().0);
    let gbps = |r: &Record| r.gbps;
    let size = |r: &Record| r.size as f64;
    let conns = |r: &Record| r.conns as f64;
    let mut out = Vec::new();
    let mut fig = |name: &str, c: Chart<'_>, k: Kind| -> Result<(), Error> {
        let empty = match &k {
            Kind::Lines(s) | Kind::Scatter(s) => s.iter().all(|x| x.1.is_empty()),
            Kind::Bars(b) => b.is_empty(),
        };
        if empty {
            return Ok(());
        }
        save(dir, name, &c, &k)?;
        out.push((name.to_string(), c.title.to_string()));
        Ok(())
    };
    let lat = of("lat");
    let event: Vec<&Record> = lat
        .iter()
        .copied()
        .filter(|r| r.busy_poll_us == 0)
        .collect();
    let busy: Vec<&Record> = lat.iter().copied().filter(|r| r.busy_poll_us > 0).collect();
    let lat_chart = |title| Chart {
        title,
        x_desc: "message size (bytes)",
        y_desc: "one-way latency p50 (µs)",
        x_bytes: true,
        y_log: true,
    };
    fig(
        "latency-vs-size",
        lat_chart("Ping-pong latency, event-driven"),
        Kind::Lines(series(&event, size, p50)),
    )?;
    fig(
        "latency-busy-vs-size",
        lat_chart("Ping-pong latency, busy polling"),
        Kind::Lines(series(&busy, size, p50)),
    )?;
    let bw_chart = |title| Chart {
        title,
        x_desc: "message size (bytes)",
        y_desc: "bandwidth (GB/s)",
        x_bytes: true,
        y_log: false,
    };
    fig(
        "bandwidth-vs-size",
        bw_chart("Unidirectional bandwidth"),
        Kind::Lines(series(&of("bw"), size, gbps)),
    )?;
    fig(
        "bibw-vs-size",
        bw_chart("Bidirectional bandwidth (sum of both directions)"),
        Kind::Lines(series(&of("bibw"), size, gbps)),
    )?;
    for (test, name, title) in [
        ("multi", "multi-stream-vs-n", "Multi-stream bandwidth"),
        (
            "fan-in",
            "fan-in-vs-n",
            "Fan-in bandwidth (N senders, one receiving thread)",
        ),
        (
            "fan-out",
            "fan-out-vs-n",
            "Fan-out bandwidth (one sending thread, N receivers)",
        ),
    ] {
        fig(
            name,
            Chart {
                title,
                x_desc: "connections N",
                y_desc: "aggregate bandwidth (GB/s)",
                x_bytes: false,
                y_log: false,
            },
            Kind::Lines(series(&of(test), conns, gbps)),
        )?;
    }
    fig(
        "hotspot-vs-n",
        Chart {
            title: "Hot-spot latency (N clients, one server thread)",
            x_desc: "clients N",
            y_desc: "one-way latency a client sees (µs)",
            x_bytes: false,
            y_log: true,
        },
        Kind::Lines(series(&of("hotspot"), conns, Record::client_mean_us)),
    )?;
    let bw_big: Vec<&Record> = of("bw").into_iter().filter(|r| r.size >= 4096).collect();
    fig(
        "cpu-vs-bandwidth",
        Chart {
            title: "CPU vs bandwidth (unidirectional, 4 KiB to 4 MiB messages)",
            x_desc: "bandwidth (GB/s)",
            y_desc: "CPU of both sides (s per GB)",
            x_bytes: false,
            y_log: false,
        },
        Kind::Scatter(series(
            &bw_big,
            |r| r.gbps.unwrap_or(0.0),
            |r| r.cpu_s_per_gb,
        )),
    )?;
    fig(
        "cpu-vs-size",
        Chart {
            title: "CPU cost vs message size (unidirectional)",
            x_desc: "message size (bytes)",
            y_desc: "CPU of both sides (s per GB)",
            x_bytes: true,
            y_log: true,
        },
        Kind::Lines(series(&of("bw"), size, |r| r.cpu_s_per_gb)),
    )?;
    let cpu: Vec<(String, f64)> = of("cpu")
        .iter()
        .filter_map(|r| r.cpu_s_per_gb.map(|v| (r.series(), v)))
        .collect();
    let rate = of("cpu")
        .first()
        .map(|r| r.rate_bytes_per_s as f64 / 1e9)
        .unwrap_or(0.0);
    let cpu_title = format!("Normalized CPU: every transport paced to {rate:.2} GB/s");
    fig(
        "normalized-cpu",
        Chart {
            title: &cpu_title,
            x_desc: "CPU of both sides (s per GB moved)",
            y_desc: "",
            x_bytes: false,
            y_log: false,
        },
        Kind::Bars(cpu),
    )?;
    let conn: Vec<(String, f64)> = of("conn")
        .iter()
        .filter_map(|r| {
            let name = if r.transport == "tcp" {
                "host TCP: connect + accept + 8 B exchange".to_string()
            } else {
                format!(
                    "warpsock: connect + MPA + first Send, CRC {}",
                    if r.crc { "on" } else { "off" }
                )
            };
            r.setup_us.as_ref().and_then(|p| p.p50).map(|v| (name, v))
        })
        .collect();
    fig(
        "connection-setup",
        Chart {
            title: "Connection setup, time of one (p50)",
            x_desc: "µs",
            y_desc: "",
            x_bytes: false,
            y_log: false,
        },
        Kind::Bars(conn),
    )?;
    Ok(out)
}
