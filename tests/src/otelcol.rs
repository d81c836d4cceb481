//! A real OpenTelemetry Collector (deploy/local/otelcol, built by `k8s.sh ensure` from
//! pinned Go modules) receiving OTLP/gRPC on 127.0.0.1 and writing every span it gets to
//! a file, for the tracing tests.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::process::Proc;

/// A running collector.
#[derive(Debug)]
pub struct Collector {
    /// The process.
    pub proc: Proc,
    /// Its OTLP/gRPC endpoint (`http://127.0.0.1:PORT`).
    pub endpoint: String,
    /// Where the file exporter writes (one OTLP JSON document per line).
    pub file: PathBuf,
}

/// One span as the collector wrote it, with its resource's `service.name`.
#[derive(Debug, Clone)]
pub struct Span {
    /// `service.name` of the process that exported it.
    pub service: String,
    /// The span in OTLP JSON (`traceId`, `spanId`, `parentSpanId`, `name`, `kind`,
    /// `attributes`, `status`).
    pub json: Value,
}

impl Span {
    /// A string field (`traceId`, `name`, ...), "" when absent.
    pub fn field(&self, name: &str) -> &str {
        self.json[name].as_str().unwrap_or_default()
    }

    /// An attribute's value as text (OTLP JSON writes integers as strings).
    pub fn attribute(&self, key: &str) -> Option<String> {
        let value = self.json["attributes"]
            .as_array()?
            .iter()
            .find(|a| a["key"] == key)?
            .get("value")?;
        value["stringValue"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| value["intValue"].as_str().map(str::to_owned))
            .or_else(|| value["intValue"].as_i64().map(|i| i.to_string()))
    }
}

impl Collector {
    /// Starts a collector named `name`, its config, spans and log in `dir`.
    pub fn start(name: &str, dir: &Path) -> Result<Collector> {
        let bin = crate::cluster::tools_bin()?.join("otelcol");
        let file = dir.join(format!("{name}-spans.jsonl"));
        // The collector takes a port, not a socket: a free one is picked, and another
        // if something took it meanwhile.
        let mut last = None;
        for attempt in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let config = dir.join(format!("{name}.yaml"));
            std::fs::write(
                &config,
                format!(
                    "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{port}\n\
                     exporters:\n  file:\n    path: {}\n    flush_interval: 100ms\n\
                     service:\n  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n\
                     \x20 telemetry:\n    metrics:\n      level: none\n",
                    file.display()
                ),
            )?;
            let mut proc = Proc::spawn(
                &format!("{name}-{attempt}"),
                &bin,
                vec!["--config".into(), config.to_string_lossy().into_owned()],
                vec![],
                dir.join(format!("{name}-{attempt}.log")),
            )?;
            match proc.wait_log("Everything is ready", 0, crate::wait::T) {
                Ok(_) => {
                    return Ok(Collector {
                        proc,
                        endpoint: format!("http://127.0.0.1:{port}"),
                        file,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.context("the collector never started")?)
    }

    /// Every span written so far.
    pub fn spans(&self) -> Result<Vec<Span>> {
        let text = std::fs::read_to_string(&self.file).unwrap_or_default();
        let mut spans = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let doc: Value = serde_json::from_str(line).context("a line of the file exporter")?;
            for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
                let service = rs["resource"]["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|a| a["key"] == "service.name")
                    .and_then(|a| a["value"]["stringValue"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for span in ss["spans"].as_array().into_iter().flatten() {
                        spans.push(Span {
                            service: service.clone(),
                            json: span.clone(),
                        });
                    }
                }
            }
        }
        Ok(spans)
    }

    /// The first span `pick` accepts, once the collector has written it (within `T`).
    pub async fn span(&self, what: &str, pick: impl Fn(&Span) -> bool) -> Result<Span> {
        crate::wait::until(what, crate::wait::T, || async {
            let spans = self.spans().map_err(|e| e.to_string())?;
            Ok(spans.into_iter().find(|s| pick(s)))
        })
        .await
    }
}
