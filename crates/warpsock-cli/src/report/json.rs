//! The JSON results file: `meta` plus every [`Record`] (every sample
//! included, or evenly thinned with `--max-samples`).

use serde_json::Value;

use super::Record;
use crate::apps::AppRecord;

/// The results of a run as JSON: `meta` plus every record.
pub(crate) fn to_json(meta: Value, records: &[Record]) -> Value {
    serde_json::json!({ "meta": meta, "results": records })
}

/// The results of a run as JSON: `meta`, every record and the apps
/// suite's records (`apps`, left out when empty).
pub(crate) fn to_json_with_apps(meta: Value, records: &[Record], apps: &[AppRecord]) -> Value {
    let mut doc = to_json(meta, records);
    if !apps.is_empty() {
        doc["apps"] = serde_json::to_value(apps).expect("records serialize");
    }
    doc
}

/// The apps suite's records of a results file (none in older files).
pub(crate) fn apps_from_json(text: &str) -> Result<Vec<AppRecord>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    match v.get("apps") {
        None => Ok(Vec::new()),
        Some(a) => serde_json::from_value(a.clone()).map_err(|e| format!("bad \"apps\": {e}")),
    }
}

/// Reads a results file: (meta, records).
pub(crate) fn from_json(text: &str) -> Result<(Value, Vec<Record>), String> {
    let mut v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let meta = v.get("meta").cloned().unwrap_or(Value::Null);
    let results = v
        .get_mut("results")
        .map(Value::take)
        .ok_or("no \"results\" array")?;
    let recs: Vec<Record> =
        serde_json::from_value(results).map_err(|e| format!("bad \"results\": {e}"))?;
    Ok((meta, recs))
}

/// Keeps at most `max` evenly spaced round-trip samples per record.
pub(crate) fn thin(records: &mut [Record], max: u64) {
    for r in records {
        let n = r.samples.rtt_ns.len() as u64;
        if n > max {
            let stride = n.div_ceil(max);
            r.samples.rtt_ns = r
                .samples
                .rtt_ns
                .iter()
                .step_by(stride as usize)
                .copied()
                .collect();
            r.samples.rtt_stride = stride;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{to_csv, Samples};
    use crate::stats::Pcts;

    #[test]
    fn json_round_trip_and_csv() {
        let r = Record {
            test: "lat".into(),
            transport: "send".into(),
            size: 8,
            conns: 1,
            one_way_us: Pcts::of(&[1000, 3000], 2.0),
            samples: Samples {
                rtt_ns: vec![1000, 3000],
                rtt_stride: 1,
                interval_s: 0.1,
                bytes: vec![16],
            },
            ok: true,
            ..Record::default()
        };
        let doc = to_json(serde_json::json!({"target": "x"}), std::slice::from_ref(&r));
        let (meta, back) = from_json(&doc.to_string()).unwrap();
        assert_eq!(meta["target"], "x");
        assert_eq!(back, vec![r.clone()]);
        let csv = to_csv(&[r]);
        assert_eq!(csv.lines().count(), 4);
        assert!(csv.contains("lat,send,0,8,1,0,0,rtt_ns,1,3000"));
        assert!(from_json("{}").is_err());
        let mut v = back;
        v[0].samples.rtt_ns = (0..10).collect();
        thin(&mut v, 3);
        assert_eq!(v[0].samples.rtt_ns, vec![0, 4, 8]);
        assert_eq!(v[0].samples.rtt_stride, 4);
        assert!(to_csv(&v).contains("rtt_ns,8,8"));
    }
}
