//! Parsers of option values: every bad value is refused with the value
//! itself and the allowed range (clap prints it, exit status 2).

use std::time::Duration;

use crate::spec::{PinArg, MAX_CONNS, MAX_SIZE, MAX_WINDOW};

/// `--sizes` element: `8`, `8B`, `64K`, `64KiB`, `1M`, `1MiB`.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        _ => {
            return Err(format!(
                "'{s}': unknown unit (use B, K or M; 1 B to 64 MiB)"
            ))
        }
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("'{s}': not a size (e.g. 8, 64K, 1M; 1 B to 64 MiB)"))?;
    match n.checked_mul(mult) {
        Some(v) if (1..=MAX_SIZE).contains(&v) => Ok(v),
        _ => Err(format!("'{s}': must be between 1 B and 64 MiB")),
    }
}

/// `--duration`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let range = "must be between 0.01 and 3600 seconds";
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': not a number of seconds; {range}"))?;
    if !(0.01..=3600.0).contains(&v) {
        return Err(format!("{s}: {range}"));
    }
    Ok(Duration::from_secs_f64(v))
}

pub(crate) fn parse_range(s: &str, lo: u64, hi: u64, what: &str) -> Result<u64, String> {
    let range = format!("must be between {lo} and {hi}{what}");
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': not a whole number; {range}"))?;
    if !(lo..=hi).contains(&v) {
        return Err(format!("{s}: {range}"));
    }
    Ok(v)
}

/// `--iters`.
pub(crate) fn parse_iters(s: &str) -> Result<u64, String> {
    parse_range(s, 1, 1_000_000_000, "")
}

/// `--busy-poll`.
pub(crate) fn parse_busy_poll(s: &str) -> Result<u64, String> {
    parse_range(s, 1, 1_000_000, " microseconds")
}

/// `--conns` element.
pub(crate) fn parse_conns(s: &str) -> Result<usize, String> {
    parse_range(s, 1, MAX_CONNS as u64, " connections").map(|v| v as usize)
}

/// `--repeat`.
pub(crate) fn parse_repeat(s: &str) -> Result<usize, String> {
    parse_range(s, 1, 100, " rounds").map(|v| v as usize)
}

/// `--window`.
pub(crate) fn parse_window(s: &str) -> Result<usize, String> {
    parse_range(s, 1, MAX_WINDOW as u64, " messages").map(|v| v as usize)
}

/// `--pin`.
pub(crate) fn parse_pin(s: &str) -> Result<PinArg, String> {
    let cpus = crate::pin::cpu_count();
    let t = s.trim();
    match t {
        "auto" => return Ok(PinArg::Auto),
        "none" => return Ok(PinArg::None),
        _ => {}
    }
    let one = |c: &str| -> Result<usize, String> {
        let v: usize = c.trim().parse().map_err(|_| {
            format!(
                "'{s}': use auto, none, or CPU[,CPU] with CPUs 0 to {}",
                cpus - 1
            )
        })?;
        if v >= cpus {
            return Err(format!(
                "{s}: CPU {v} does not exist; CPUs must be between 0 and {}",
                cpus - 1
            ));
        }
        Ok(v)
    };
    match t.split_once(',') {
        Some((a, b)) => Ok(PinArg::Cpus(one(a)?, one(b)?)),
        None => {
            let a = one(t)?;
            Ok(PinArg::Cpus(a, a))
        }
    }
}

/// `HOST[:PORT]` → (host, port if given). IPv6 literals go in brackets
/// when a port follows (`[::1]:18515`); a bare `::1` is taken as a host.
pub(crate) fn parse_host_port(s: &str) -> Result<(String, Option<u16>), String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty address: give HOST or HOST:PORT".into());
    }
    let port = |p: &str| -> Result<Option<u16>, String> {
        match p.parse::<u16>() {
            Ok(v) if v > 0 => Ok(Some(v)),
            _ => Err(format!("'{s}': port '{p}' must be between 1 and 65535")),
        }
    };
    if let Some(rest) = t.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("'{s}': missing ']' after the IPv6 address"))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host.to_string(), port(p)?)),
            None if after.is_empty() => Ok((host.to_string(), None)),
            None => Err(format!("'{s}': expected ':PORT' after ']'")),
        };
    }
    if t.parse::<std::net::Ipv6Addr>().is_ok() {
        return Ok((t.to_string(), None));
    }
    match t.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((h.to_string(), port(p)?)),
        Some(_) => Err(format!(
            "'{s}': put an IPv6 address in brackets: [ADDR]:PORT"
        )),
        None => Ok((t.to_string(), None)),
    }
}

/// `--token`: 1 to 128 printable characters without spaces.
pub(crate) fn parse_secret(s: &str) -> Result<String, String> {
    if (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(s.to_string())
    } else {
        Err("a token is 1 to 128 printable characters without spaces".into())
    }
}

/// `--rate`: `500mbit`, `1gbit`, `10000kbit`, or bits per second; 1 mbit
/// to 100 gbit.
pub(crate) fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit {
        "" | "bit" => 1,
        "k" | "kbit" => 1_000,
        "m" | "mbit" => 1_000_000,
        "g" | "gbit" => 1_000_000_000,
        _ => {
            return Err(format!(
                "'{s}': unknown unit (use kbit, mbit or gbit; 1 mbit to 100 gbit)"
            ))
        }
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}': not a rate (e.g. 500mbit, 1gbit; 1 mbit to 100 gbit)"))?;
    match n.checked_mul(mult) {
        Some(v) if (1_000_000..=100_000_000_000).contains(&v) => Ok(v),
        _ => Err(format!("'{s}': must be between 1 mbit and 100 gbit")),
    }
}

/// `--loss`: percent, 0 to 50.
pub(crate) fn parse_loss(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': not a percentage; must be between 0 and 50"))?;
    if !(0.0..=50.0).contains(&v) {
        return Err(format!("{s}: must be between 0 and 50 percent"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert!(parse_size("0")
            .unwrap_err()
            .contains("between 1 B and 64 MiB"));
        assert!(parse_size("65M").is_err());
        assert!(parse_size("3G").unwrap_err().contains("unit"));
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn ranges() {
        assert_eq!(
            parse_duration("0").unwrap_err(),
            "0: must be between 0.01 and 3600 seconds"
        );
        assert!(parse_duration("0.1").is_ok());
        assert!(parse_duration("nan").is_err());
        assert!(parse_iters("0").unwrap_err().contains("between 1 and"));
        assert!(parse_window("65").is_err());
        assert_eq!(parse_window("64"), Ok(64));
        assert_eq!(parse_pin("none"), Ok(PinArg::None));
        assert_eq!(parse_pin("0"), Ok(PinArg::Cpus(0, 0)));
        assert!(parse_pin("9999").unwrap_err().contains("does not exist"));
    }

    #[test]
    fn host_port() {
        let hp = |s: &str| parse_host_port(s);
        assert_eq!(hp("127.0.0.1"), Ok(("127.0.0.1".into(), None)));
        assert_eq!(hp("127.0.0.1:9"), Ok(("127.0.0.1".into(), Some(9))));
        assert_eq!(hp("[::1]:9"), Ok(("::1".into(), Some(9))));
        assert_eq!(hp("::1"), Ok(("::1".into(), None)));
        assert_eq!(hp("box"), Ok(("box".into(), None)));
        assert!(hp("box:0").unwrap_err().contains("between 1 and 65535"));
        assert!(hp("box:99999").is_err());
    }

    #[test]
    fn rates_and_loss() {
        assert_eq!(parse_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("500mbit"), Ok(500_000_000));
        assert_eq!(parse_rate("2000000"), Ok(2_000_000));
        assert!(parse_rate("10kbit")
            .unwrap_err()
            .contains("between 1 mbit and 100 gbit"));
        assert!(parse_rate("1tbit").unwrap_err().contains("unknown unit"));
        assert_eq!(parse_loss("1.5"), Ok(1.5));
        assert!(parse_loss("51").unwrap_err().contains("between 0 and 50"));
        assert!(parse_loss("x").is_err());
    }
}
