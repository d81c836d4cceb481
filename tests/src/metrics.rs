//! Reading metrics the way Prometheus does: a scrape of `/metrics` parsed into samples
//! ([`Scrape`]), and the series a test asks for by name and labels ([`Series`]). A series
//! that is not there is `None` or an error, never zero: a test comparing counts must not
//! pass because a metric is gone.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};

/// A series as a test names it: a sample's name, and labels it must have (it may have
/// more). `"name"` and `r#"name{label="value"}"#` convert to one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    name: String,
    labels: Vec<(String, String)>,
}

impl Series {
    /// The series named `name` (as exposed: `holdfast_proxy_acks_total`), any labels.
    pub fn new(name: impl Into<String>) -> Self {
        Series {
            name: name.into(),
            labels: Vec::new(),
        }
    }

    /// Also with label `key` equal to `value`.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }

    fn matches(&self, sample: &Sample) -> bool {
        sample.name == self.name
            && self
                .labels
                .iter()
                .all(|(k, v)| sample.labels.get(k).is_some_and(|have| have == v))
    }
}

impl std::fmt::Display for Series {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        if !self.labels.is_empty() {
            let labels: Vec<String> = self
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect();
            write!(f, "{{{}}}", labels.join(","))?;
        }
        Ok(())
    }
}

impl From<&str> for Series {
    /// `name` or `name{key="value",…}`, as a sample line starts.
    fn from(text: &str) -> Self {
        match parse_series(text) {
            Ok((name, labels, "")) => Series {
                name,
                labels: labels.into_iter().collect(),
            },
            _ => panic!("not a series: {text:?}"),
        }
    }
}

impl From<String> for Series {
    fn from(text: String) -> Self {
        Series::from(text.as_str())
    }
}

impl From<&String> for Series {
    fn from(text: &String) -> Self {
        Series::from(text.as_str())
    }
}

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (`_total`, `_bucket`, … included).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// A scrape of `/metrics` in the Prometheus text format, parsed.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    samples: Vec<Sample>,
}

impl Scrape {
    /// Parses the exposition `text`; a sample line that does not parse is an error.
    pub fn parse(text: &str) -> Result<Self> {
        let mut samples = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, labels, rest) =
                parse_series(line).with_context(|| format!("not a sample: {line:?}"))?;
            let value = rest
                .split_whitespace()
                .next()
                .with_context(|| format!("no value: {line:?}"))?;
            let value: f64 = value
                .parse()
                .with_context(|| format!("not a value: {line:?}"))?;
            samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        Ok(Scrape { samples })
    }

    /// Every sample of `series`, in the order exposed.
    pub fn all(&self, series: &Series) -> Vec<&Sample> {
        self.samples.iter().filter(|s| series.matches(s)).collect()
    }

    /// The first sample of `series`, if there is one.
    pub fn get(&self, series: &Series) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| series.matches(s))
            .map(|s| s.value)
    }

    /// The first sample of `series`, which must be there.
    pub fn value(&self, series: &Series) -> Result<f64> {
        self.get(series)
            .with_context(|| format!("no series {series} in /metrics"))
    }

    /// The sum of every sample of `series`, None when there is none.
    pub fn sum(&self, series: &Series) -> Option<f64> {
        let all = self.all(series);
        (!all.is_empty()).then(|| all.iter().map(|s| s.value).sum())
    }
}

/// A series at the start of `text`: its name, its labels, and the rest of the text.
fn parse_series(text: &str) -> Result<(String, BTreeMap<String, String>, &str)> {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    let name = &text[..end];
    if name.is_empty() {
        bail!("no name");
    }
    let mut labels = BTreeMap::new();
    let mut rest = &text[end..];
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start_matches(',');
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=').context("a label without a value")?;
            let key = rest[..eq].trim().to_owned();
            let after = rest[eq + 1..]
                .strip_prefix('"')
                .context("a label value not quoted")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let close = loop {
                match chars.next() {
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => bail!("an escape at the end"),
                    },
                    Some((_, c)) => value.push(c),
                    None => bail!("a label value not closed"),
                }
            };
            labels.insert(key, value);
            rest = &after[close + 1..];
        }
    }
    Ok((name.to_owned(), labels, rest.trim_start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP holdfast_proxy_error_responses Error answers.\n\
        # TYPE holdfast_proxy_error_responses counter\n\
        holdfast_proxy_error_responses_total{reason=\"no_route\",status=\"404\"} 3\n\
        holdfast_proxy_error_responses_total{status=\"503\",reason=\"rate_limited\"} 2\n\
        holdfast_proxy_requests_total{route=\"a.test/{x}, \\\"y\\\"\",class=\"2xx\"} 7\n\
        holdfast_leader 1\n\
        holdfast_leader_acquisitions_total 0\n\
        # EOF\n";

    #[test]
    fn series_are_found_by_name_and_any_order_of_labels_and_a_missing_one_is_none() {
        let scrape = Scrape::parse(TEXT).unwrap();
        let errors = Series::new("holdfast_proxy_error_responses_total");
        assert_eq!(
            scrape.get(&errors.clone().label("reason", "rate_limited")),
            Some(2.0)
        );
        assert_eq!(
            scrape.get(&Series::from(
                r#"holdfast_proxy_error_responses_total{status="503"}"#
            )),
            Some(2.0)
        );
        assert_eq!(scrape.sum(&errors), Some(5.0));
        assert_eq!(
            scrape.get(&Series::from("holdfast_leader")),
            Some(1.0),
            "not the _acquisitions one"
        );
        assert_eq!(
            scrape.get(&Series::from("holdfast_leader_acquisitions_total")),
            Some(0.0)
        );
        assert_eq!(
            scrape.get(
                &Series::new("holdfast_proxy_requests_total").label("route", "a.test/{x}, \"y\"")
            ),
            Some(7.0)
        );
        let missing = errors.label("reason", "nothing");
        assert_eq!(scrape.get(&missing), None);
        assert_eq!(scrape.sum(&missing), None, "a missing series is not zero");
        assert!(
            scrape
                .value(&missing)
                .unwrap_err()
                .to_string()
                .contains("reason=\"nothing\"")
        );
    }

    #[test]
    fn a_line_that_is_not_a_sample_is_an_error() {
        assert!(Scrape::parse("holdfast_x{a=\"1\" 2\n").is_err());
        assert!(Scrape::parse("holdfast_x{a=1} 2\n").is_err());
        assert!(Scrape::parse("holdfast_x\n").is_err());
        assert!(Scrape::parse("holdfast_x one\n").is_err());
    }
}
