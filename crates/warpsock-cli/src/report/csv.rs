//! Every sample as CSV (the `csv` crate writes and quotes): one row per
//! round trip, setup time or bandwidth interval, with the run's point in
//! the leading columns.

use super::Record;

/// The columns, in order.
const HEADER: [&str; 10] = [
    "test",
    "transport",
    "crc",
    "size",
    "conns",
    "busy_poll_us",
    "rate_bytes_per_s",
    "kind",
    "index",
    "value",
];

/// Every sample of `records` as CSV text.
pub(crate) fn to_csv(records: &[Record]) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    let row = |w: &mut csv::Writer<Vec<u8>>, r: &Record, kind: &str, i: usize, v: u64| {
        w.write_record([
            r.test.as_str(),
            r.transport.as_str(),
            if r.crc { "1" } else { "0" },
            &r.size.to_string(),
            &r.conns.to_string(),
            &r.busy_poll_us.to_string(),
            &r.rate_bytes_per_s.to_string(),
            kind,
            &i.to_string(),
            &v.to_string(),
        ])
        .expect("writing to memory does not fail");
    };
    w.write_record(HEADER)
        .expect("writing to memory does not fail");
    for r in records {
        let kind = if r.test == "conn" {
            "setup_ns"
        } else {
            "rtt_ns"
        };
        let stride = r.samples.rtt_stride.max(1) as usize;
        for (i, &v) in r.samples.rtt_ns.iter().enumerate() {
            row(&mut w, r, kind, i * stride, v);
        }
        for (i, &v) in r.samples.bytes.iter().enumerate() {
            row(&mut w, r, "interval_bytes", i, v);
        }
    }
    String::from_utf8(w.into_inner().expect("flushing to memory does not fail"))
        .expect("every field is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Samples;

    #[test]
    fn one_row_per_sample_with_its_point() {
        let r = Record {
            test: "lat".into(),
            transport: "send".into(),
            size: 8,
            conns: 1,
            samples: Samples {
                rtt_ns: vec![1000, 3000],
                rtt_stride: 4,
                interval_s: 0.1,
                bytes: vec![16],
            },
            ..Record::default()
        };
        let csv = to_csv(&[r]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], HEADER.join(","));
        assert_eq!(lines[2], "lat,send,0,8,1,0,0,rtt_ns,4,3000");
        assert_eq!(lines[3], "lat,send,0,8,1,0,0,interval_bytes,0,16");
        assert_eq!(lines.len(), 4);
    }
}
