//! `kubectl holdfast`: what the plugin prints, in plain functions. The binary
//! (`src/main.rs`) finds the control plane, calls its Admin service and prints what these
//! functions make of the answers.
//!
//! - [`status_table`]: every proxy of every control plane replica, the version it serves,
//!   whether that is its replica's published one (`SYNCED`), an older one (`BEHIND`, with
//!   how many cluster revisions) or a refused one (`NACKED`), like `istioctl proxy-status`.
//! - [`rollout_text`]: one object's rollout (`Admin/GetRollout`) over every replica.
//! - [`explain_text`]: which route serves a URL and why, from the published snapshot
//!   looked up as a proxy looks it up.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use holdfast_proto::v1::{GetRolloutResponse, GetStatusResponse, ListProxiesResponse};

/// The kinds `rollout` takes (`KIND/NAME`), as `Admin/GetRollout` names them, found by
/// any case of their kind, plural or short name.
pub fn parse_object(object: &str) -> Result<(&'static str, String), String> {
    let (kind, name) = object
        .split_once('/')
        .ok_or_else(|| format!("{object:?}: expected KIND/NAME, for example ingress/web"))?;
    let kind = match kind.to_ascii_lowercase().as_str() {
        "ingress" | "ingresses" | "ing" | "ingress.networking.k8s.io" => "Ingress",
        "httproute" | "httproutes" => "HTTPRoute",
        "grpcroute" | "grpcroutes" => "GRPCRoute",
        "tlsroute" | "tlsroutes" => "TLSRoute",
        "gateway" | "gateways" | "gtw" => "Gateway",
        _ => {
            return Err(format!(
                "{kind:?}: not a kind holdfast rolls out (ingress, httproute, grpcroute, tlsroute, gateway)"
            ));
        }
    };
    if name.is_empty() || name.contains('/') {
        return Err(format!(
            "{object:?}: expected KIND/NAME, for example ingress/web"
        ));
    }
    Ok((kind, name.to_owned()))
}

/// `HOST/PATH` (a scheme in front, a port after the host and a query are allowed and
/// left out: routes match on host and path) as the host and the path (`/` when absent).
pub fn parse_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let path = match path.split(['?', '#']).next() {
        Some(p) if p.starts_with('/') => p,
        _ => "/",
    };
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if !h.ends_with(']') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        Some((h, port)) if h.ends_with(']') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    };
    if host.is_empty() {
        return Err(format!(
            "{url:?}: expected HOST/PATH, for example example.com/api"
        ));
    }
    Ok((host.to_owned(), path.to_owned()))
}

/// `text` safe for a terminal: control characters other than newlines (which a NACK's
/// error or an object's problem, written by whoever writes the object, may carry) are
/// shown as `\u{..}` escapes rather than sent to the terminal.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// The cluster revision a version was built from (versions are `REVISION-HASH`).
pub fn revision(version: &str) -> Option<u64> {
    version.split_once('-')?.0.parse().ok()
}

/// A duration as kubectl shows ages: `45s`, `3m12s`, `5h3m`, `2d4h`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// `value`, or `empty` in its place when it is empty.
fn or(value: &str, empty: &str) -> String {
    if value.is_empty() { empty } else { value }.to_owned()
}

fn since(t: Option<&prost_types::Timestamp>, now: SystemTime) -> String {
    let Some(t) = t else { return "-".into() };
    let Ok(at) = SystemTime::try_from(*t) else {
        return "-".into();
    };
    now.duration_since(at).map_or_else(|_| "0s".into(), age)
}

/// Rows padded to their columns' widths, two spaces apart (as kubectl prints tables).
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|v| v.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, value) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(value);
            } else {
                let _ = write!(line, "{value:<width$}  ", width = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One control plane replica's answer, or why it gave none.
#[derive(Debug, Clone)]
pub struct Replica<T> {
    /// Its pod (or the address given).
    pub name: String,
    /// What it answered.
    pub answer: Result<T, String>,
}

/// What `kubectl holdfast status` prints: each replica's published version, one row per
/// proxy connected to any of them (a proxy streams from one replica at a time), then what
/// went wrong for any proxy or replica.
pub fn status_table(
    replicas: &[Replica<(GetStatusResponse, ListProxiesResponse)>],
    now: SystemTime,
) -> String {
    let mut out = String::new();
    let mut rows = vec![
        [
            "PROXY",
            "ZONE",
            "REPLICA",
            "VERSION",
            "STATE",
            "BEHIND",
            "CONNECTED",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let mut notes = Vec::new();
    for replica in replicas {
        let name = &replica.name;
        let (status, proxies) = match &replica.answer {
            Ok(answer) => answer,
            Err(why) => {
                let _ = writeln!(out, "Replica {name}: no answer: {why}");
                continue;
            }
        };
        let published = &status.published_version;
        let ready = if status.ready {
            ""
        } else {
            ", not ready: no complete snapshot yet"
        };
        if published.is_empty() || status.last_publish_time.is_none() {
            let _ = writeln!(out, "Replica {name}: nothing published yet{ready}");
        } else {
            let ago = since(status.last_publish_time.as_ref(), now);
            let _ = writeln!(
                out,
                "Replica {name}: published {published} ({ago} ago{ready})"
            );
        }
        if let Some(held) = &status.held {
            let _ = writeln!(
                out,
                "Replica {name}: holds {} ({})",
                held.version, held.reason
            );
        }
        let mut sorted: Vec<_> = proxies.proxies.iter().collect();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        for p in sorted {
            let behind = match (revision(published), revision(&p.acked_version)) {
                _ if p.acked_version == *published => "0".to_owned(),
                (Some(now), Some(then)) => format!("{} revisions", now.saturating_sub(then)),
                _ => "-".to_owned(),
            };
            rows.push(vec![
                p.id.clone(),
                or(&p.zone, "-"),
                name.clone(),
                or(&p.acked_version, "(none)"),
                proxy_state(p, published).into(),
                behind,
                since(p.connected_since.as_ref(), now),
            ]);
            if !p.last_nack_version.is_empty() {
                notes.push(format!(
                    "{} refused {}: {}",
                    p.id, p.last_nack_version, p.last_nack_error
                ));
            }
            if !p.persist_error.is_empty() {
                notes.push(format!(
                    "{} cannot persist what it serves: {}",
                    p.id, p.persist_error
                ));
            }
            if !p.unbound_listeners.is_empty() {
                notes.push(format!(
                    "{} has not bound listeners {}",
                    p.id,
                    p.unbound_listeners.join(", ")
                ));
            }
        }
    }
    out.push('\n');
    if rows.len() == 1 {
        out.push_str("No proxies are connected to the control plane.\n");
    } else {
        out.push_str(&table(&rows));
    }
    if !notes.is_empty() {
        out.push('\n');
        for n in notes {
            out.push_str(&n);
            out.push('\n');
        }
    }
    out
}

/// `SYNCED` (serves the published version), `NACKED` (refused it: its last refusal is of
/// a version newer than the one it serves) or `BEHIND`.
fn proxy_state(p: &holdfast_proto::v1::ProxyStatus, published: &str) -> &'static str {
    if p.acked_version == published {
        return "SYNCED";
    }
    let refused_newer = !p.last_nack_version.is_empty()
        && match (revision(&p.last_nack_version), revision(&p.acked_version)) {
            (Some(nack), Some(ack)) => nack >= ack,
            (Some(_), None) => true,
            _ => false,
        };
    if refused_newer { "NACKED" } else { "BEHIND" }
}

/// What `kubectl holdfast rollout KIND/NAME` prints: the object, whether each replica's
/// published snapshot reflects its generation, and each proxy of any replica.
pub fn rollout_text(replicas: &[Replica<GetRolloutResponse>]) -> String {
    let mut out = String::new();
    let answered: Vec<(&str, &GetRolloutResponse)> = replicas
        .iter()
        .filter_map(|r| r.answer.as_ref().ok().map(|a| (r.name.as_str(), a)))
        .collect();
    let Some((_, first)) = answered.first() else {
        for r in replicas {
            if let Err(why) = &r.answer {
                let _ = writeln!(out, "Replica {}: no answer: {why}", r.name);
            }
        }
        return out;
    };
    let _ = writeln!(
        out,
        "{} {}/{}: generation {} (resourceVersion {})",
        first.kind, first.namespace, first.name, first.generation, first.resource_version
    );
    let (mut serving, mut connected) = (0, 0);
    let mut rows = vec![
        ["PROXY", "ZONE", "REPLICA", "VERSION", "SERVING", "WHY NOT"]
            .map(String::from)
            .to_vec(),
    ];
    for r in replicas {
        let name = &r.name;
        let a = match &r.answer {
            Ok(a) => a,
            Err(why) => {
                let _ = writeln!(out, "Replica {name}: no answer: {why}");
                continue;
            }
        };
        if a.pending.is_empty() {
            let _ = writeln!(
                out,
                "Replica {name}: generation {} is in published version {}",
                a.published_generation, a.published_version
            );
        } else {
            let _ = writeln!(
                out,
                "Replica {name}: generation {} not published yet (version {}): {}",
                a.generation, a.published_version, a.pending
            );
        }
        serving += a.proxies_serving;
        connected += a.proxies_connected;
        for p in &a.proxies {
            rows.push(vec![
                p.id.clone(),
                or(&p.zone, "-"),
                name.clone(),
                or(&p.version, "(none)"),
                if p.serving { "yes" } else { "no" }.into(),
                p.reason.clone(),
            ]);
        }
    }
    let _ = writeln!(out, "Proxies: {serving} of {connected} connected serve it");
    if rows.len() > 1 {
        out.push('\n');
        out.push_str(&table(&rows));
    }
    if !first.problems.is_empty() {
        out.push_str("\nProblems:\n");
        for p in &first.problems {
            let _ = writeln!(out, "  {}: {}", p.reason, p.message);
        }
    }
    out
}

/// What `kubectl holdfast explain HOST/PATH` prints, from the JSON a proxy's
/// `/debug/explain` answers ([`holdfast_data_plane::admin::explain`]) for the published
/// snapshot.
pub fn explain_text(host: &str, path: &str, e: &serde_json::Value) -> String {
    let s = |v: &serde_json::Value| v.as_str().map(str::to_owned).unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(out, "{host}{path}");
    let status = e["status"].as_u64().unwrap_or(0);
    if let Some(n) = e["normalised_path"].as_str().filter(|n| *n != path) {
        let _ = writeln!(out, "  Path:        routed as {n}");
    }
    if e["matched"].as_bool() != Some(true) {
        let _ = writeln!(out, "  Status:      {status}, no route");
        let _ = writeln!(out, "  Why:         {}", s(&e["reason"]));
    } else if e["route"].is_object() {
        let route = &e["route"];
        let _ = writeln!(out, "  Status:      {status}");
        let source = s(&route["ingress"]);
        let _ = writeln!(
            out,
            "  Route:       {} {} on host {:?}{}",
            s(&route["kind"]),
            s(&route["path"]),
            s(&route["host"]),
            if source.is_empty() {
                String::new()
            } else {
                format!(", from {source}")
            }
        );
        if e["filters"].as_bool() == Some(true) {
            let _ = writeln!(
                out,
                "  Filters:     yes (headers, rewrites or mirrors apply)"
            );
        }
        let backend = &e["backend"];
        let endpoints: Vec<String> = backend["endpoints"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  Backend:     {} ({})",
            s(&backend["name"]),
            if let Some(external) = backend["external"].as_str() {
                format!("external name {external}")
            } else if endpoints.is_empty() {
                "no ready endpoints".into()
            } else {
                format!("endpoints {}", endpoints.join(", "))
            }
        );
        if let Some(why) = backend["unavailable_reason"].as_str() {
            let _ = writeln!(out, "  Unavailable: {why}");
        }
        if e["https_redirect"].as_bool() == Some(true) {
            let _ = writeln!(out, "  Plain HTTP:  redirected to https (308)");
        }
        if e["certificate"].is_object() {
            let c = &e["certificate"];
            let _ = writeln!(
                out,
                "  Certificate: {} (subject {}, not after {})",
                s(&c["name"]),
                s(&c["subject"]),
                c["not_after"]
            );
        }
    } else {
        let _ = writeln!(
            out,
            "  Status:      {status} (answered by the route's filters)"
        );
    }
    if let Some(v) = e["version"].as_str() {
        let _ = writeln!(out, "  Snapshot:    {v}");
    }
    out
}

#[cfg(test)]
mod tests;
