//! An open-loop load driver's pure parts: when each request is due, and the summary of a
//! run in the shape of `oha --output-format json` (the fields `tests/bench/proxy.sh` reads),
//! so that the benchmark smoke run needs no `cargo install oha` (which builds SQLite).
//!
//! Latency is measured from when a request was due, not from when it was sent: a request
//! that waited for a free connection counts its wait (no coordinated omission, as oha's
//! `--latency-correction`).

use std::collections::BTreeMap;
use std::time::Duration;

/// When request `n` (from 0) is due, `rate` requests per second after the start.
pub fn due(n: u64, rate: f64) -> Duration {
    Duration::from_secs_f64(n as f64 / rate)
}

/// What one run measured.
#[derive(Debug, Default)]
pub struct Run {
    /// Latency of each completed request, from when it was due to its response's end.
    pub latencies: Vec<Duration>,
    /// Completed requests by status code.
    pub statuses: BTreeMap<u16, u64>,
    /// Failed requests by error.
    pub errors: BTreeMap<String, u64>,
    /// Requests still in flight when the run's time was up.
    pub cut: u64,
    /// The run's length.
    pub elapsed: Duration,
}

impl Run {
    /// The summary as oha's JSON: `summary.requestsPerSec`, `latencyPercentiles`
    /// (`p50`, `p99`, `p99.9`, in seconds; null without samples), `statusCodeDistribution`
    /// and `errorDistribution` (with the cut requests as "aborted due to deadline").
    pub fn to_json(&mut self) -> serde_json::Value {
        self.latencies.sort_unstable();
        let completed = self.latencies.len() as f64;
        let pct = |p: f64| {
            if self.latencies.is_empty() {
                return serde_json::Value::Null;
            }
            // Nearest rank (the epsilon keeps 99.9% of 1,000 at rank 999, not 1,000).
            let rank = ((p / 100.0) * completed - 1e-9).ceil().max(1.0) as usize - 1;
            let i = rank.min(self.latencies.len() - 1);
            serde_json::json!(self.latencies[i].as_secs_f64())
        };
        let mut errors: serde_json::Map<String, serde_json::Value> = self
            .errors
            .iter()
            .map(|(e, n)| (e.clone(), serde_json::json!(n)))
            .collect();
        if self.cut > 0 {
            errors.insert(
                "aborted due to deadline".into(),
                serde_json::json!(self.cut),
            );
        }
        let secs = self.elapsed.as_secs_f64();
        serde_json::json!({
            "summary": {
                "requestsPerSec": if secs > 0.0 { completed / secs } else { 0.0 },
                "total": secs,
            },
            "latencyPercentiles": { "p50": pct(50.0), "p99": pct(99.0), "p99.9": pct(99.9) },
            "statusCodeDistribution": self
                .statuses
                .iter()
                .map(|(s, n)| (s.to_string(), serde_json::json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "errorDistribution": errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_due_at_even_intervals_from_the_start() {
        assert_eq!(due(0, 1000.0), Duration::ZERO);
        assert_eq!(due(1, 1000.0), Duration::from_millis(1));
        assert_eq!(due(2500, 1000.0), Duration::from_millis(2500));
    }

    #[test]
    fn the_summary_has_ohas_fields_with_nearest_rank_percentiles() {
        let mut run = Run {
            latencies: (1..=1000).rev().map(Duration::from_millis).collect(),
            statuses: [(200, 990), (503, 10)].into(),
            errors: [("connection refused".to_string(), 2)].into(),
            cut: 3,
            elapsed: Duration::from_secs(2),
        };
        let j = run.to_json();
        assert_eq!(j["summary"]["requestsPerSec"], 500.0);
        assert_eq!(j["latencyPercentiles"]["p50"], 0.5);
        assert_eq!(j["latencyPercentiles"]["p99"], 0.99);
        assert_eq!(j["latencyPercentiles"]["p99.9"], 0.999);
        assert_eq!(j["statusCodeDistribution"]["503"], 10);
        assert_eq!(j["errorDistribution"]["connection refused"], 2);
        assert_eq!(j["errorDistribution"]["aborted due to deadline"], 3);

        let mut empty = Run::default();
        assert!(empty.to_json()["latencyPercentiles"]["p99"].is_null());
    }
}
