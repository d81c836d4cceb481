//! How far one object's change has rolled out (`Admin/GetRollout`), in plain functions.
//!
//! A published snapshot reflects an object's current version when the build read that
//! kind's cache at least as far as the object's resourceVersion: each snapshot carries
//! every kind's progress ([`KindProgress`]), and resourceVersions are the store's one
//! increasing revision. So whether a proxy serves the change needs no record per object:
//! the progress of the version it ACKed, from the replica's record of the versions it
//! published ([`crate::state::Shared::stamp`]), says it.

use std::time::SystemTime;

use holdfast_proto::v1::{self, KindProgress};

/// The object asked about, as this replica's cache holds it.
#[derive(Debug, Clone)]
pub struct Object {
    /// Its kind (`Ingress`, `HTTPRoute`, ...).
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

/// What the rollout view reads besides the object.
pub struct Seen<'a> {
    /// The published snapshot's version and progress.
    pub published: Option<(&'a str, &'a [KindProgress])>,
    /// The progress of a version this replica published recently.
    pub stamp: &'a dyn Fn(&str) -> Option<Vec<KindProgress>>,
    /// The connected proxies.
    pub connected: &'a [v1::ProxyStatus],
    /// Proxies whose stream ended recently, and when.
    pub departed: &'a [(v1::ProxyStatus, SystemTime)],
    /// Routes are held back by the bounded-destruction guard.
    pub held: bool,
    /// The last build's problems with this object.
    pub problems: Vec<v1::Problem>,
}

/// Whether a build at `progress` read `kind`'s cache at least as far as `resource_version`.
pub fn reflects(progress: &[KindProgress], kind: &str, resource_version: &str) -> bool {
    let Ok(rv) = resource_version.parse::<u64>() else {
        return false;
    };
    progress
        .iter()
        .any(|p| p.kind == kind && p.resource_version >= rv)
}

/// The rollout view of `object`.
pub fn rollout(object: &Object, seen: &Seen<'_>) -> v1::GetRolloutResponse {
    let includes =
        |progress: &[KindProgress]| reflects(progress, &object.kind, &object.resource_version);
    let includes_version = |version: &str| (seen.stamp)(version).map(|p| includes(&p));
    let published = seen.published.is_some_and(|(_, p)| includes(p));
    let pending = if published {
        String::new()
    } else if seen.held {
        "the bounded-destruction guard holds routes back (GetStatus: held); the snapshot published does not reflect this generation yet".into()
    } else if seen.published.is_none() {
        "nothing is published yet".into()
    } else {
        "no build that read this generation has been published yet (one is being built, or waits out the quiet period)".into()
    };
    let proxy = |p: &v1::ProxyStatus, connected: bool, left: Option<SystemTime>| {
        let serving = includes_version(&p.acked_version) == Some(true);
        let nacked =
            !p.last_nack_version.is_empty() && includes_version(&p.last_nack_version) == Some(true);
        let reason = if let Some(at) = left {
            format!("disconnected at {}", humantime::format_rfc3339_seconds(at))
        } else if serving {
            String::new()
        } else if nacked {
            format!("nacked {}: {}", p.last_nack_version, p.last_nack_error)
        } else if p.acked_version.is_empty() {
            "behind: no version acknowledged yet".into()
        } else if includes_version(&p.acked_version).is_none() {
            format!(
                "behind: serves {}, not among the versions this replica published last",
                p.acked_version
            )
        } else {
            format!(
                "behind: serves {}, built before this generation",
                p.acked_version
            )
        };
        v1::ProxyRollout {
            id: p.id.clone(),
            zone: p.zone.clone(),
            version: p.acked_version.clone(),
            serving: serving && connected,
            reason,
            connected,
        }
    };
    let mut proxies: Vec<v1::ProxyRollout> = seen
        .connected
        .iter()
        .map(|p| proxy(p, true, None))
        .collect();
    proxies.sort_by(|a, b| a.id.cmp(&b.id));
    // A proxy that left and came back is listed once, as connected.
    let mut departed: Vec<v1::ProxyRollout> = seen
        .departed
        .iter()
        .filter(|(p, _)| !seen.connected.iter().any(|c| c.id == p.id))
        .map(|(p, at)| proxy(p, false, Some(*at)))
        .collect();
    departed.sort_by(|a, b| a.id.cmp(&b.id));
    departed.dedup_by(|a, b| a.id == b.id);
    let serving = proxies.iter().filter(|p| p.serving).count();
    let connected = proxies.len();
    proxies.extend(departed);
    v1::GetRolloutResponse {
        kind: object.kind.clone(),
        namespace: object.namespace.clone(),
        name: object.name.clone(),
        generation: object.generation,
        resource_version: object.resource_version.clone(),
        published_generation: if published { object.generation } else { 0 },
        published_version: seen
            .published
            .map(|(v, _)| v.to_owned())
            .unwrap_or_default(),
        pending,
        proxies,
        proxies_serving: serving as u32,
        proxies_connected: connected as u32,
        problems: seen.problems.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(ingress: u64) -> Vec<KindProgress> {
        vec![
            KindProgress {
                kind: "Ingress".into(),
                resource_version: ingress,
            },
            KindProgress {
                kind: "Service".into(),
                resource_version: 900,
            },
        ]
    }

    fn proxy(id: &str, acked: &str, nacked: &str) -> v1::ProxyStatus {
        v1::ProxyStatus {
            id: id.into(),
            acked_version: acked.into(),
            last_nack_version: nacked.into(),
            last_nack_error: if nacked.is_empty() {
                String::new()
            } else {
                "bad certificate".into()
            },
            ..Default::default()
        }
    }

    #[test]
    fn each_proxy_serves_the_change_once_the_version_it_acked_read_it_and_says_why_not_otherwise() {
        let object = Object {
            kind: "Ingress".into(),
            namespace: "shop".into(),
            name: "web".into(),
            generation: 3,
            resource_version: "500".into(),
        };
        // v-old read the Ingresses up to 400 (before the change), v-new up to 510.
        let stamp = |v: &str| match v {
            "v-old" => Some(progress(400)),
            "v-new" | "v-bad" => Some(progress(510)),
            _ => None,
        };
        let new = progress(510);
        let connected = [
            proxy("a", "v-new", ""),
            proxy("b", "v-old", ""),
            proxy("c", "v-old", "v-bad"),
            proxy("d", "v-ancient", ""),
            proxy("e", "", ""),
        ];
        let left = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let departed = [
            (proxy("f", "v-new", ""), left),
            (proxy("a", "v-old", ""), left),
        ];
        let seen = Seen {
            published: Some(("v-new", &new)),
            stamp: &stamp,
            connected: &connected,
            departed: &departed,
            held: false,
            problems: vec![],
        };
        let r = rollout(&object, &seen);
        assert_eq!((r.generation, r.published_generation), (3, 3));
        assert_eq!(r.pending, "");
        assert_eq!((r.proxies_serving, r.proxies_connected), (1, 5));
        let by_id = |id: &str| r.proxies.iter().find(|p| p.id == id).unwrap();
        assert!(by_id("a").serving && by_id("a").connected && by_id("a").reason.is_empty());
        assert!(by_id("b").reason.contains("built before this generation"));
        assert_eq!(by_id("c").reason, "nacked v-bad: bad certificate");
        assert!(by_id("d").reason.contains("not among the versions"));
        assert!(by_id("e").reason.contains("no version acknowledged"));
        let f = by_id("f");
        assert!(!f.serving && !f.connected && f.reason.starts_with("disconnected "));
        assert_eq!(r.proxies.len(), 6, "a, back again, is listed once: {r:?}");

        // Published before the change: pending, nobody serves it; held says so.
        let old = progress(400);
        let before = Seen {
            published: Some(("v-old", &old)),
            ..seen
        };
        let r = rollout(&object, &before);
        assert_eq!(r.published_generation, 0);
        assert!(r.pending.contains("no build that read this generation"));
        let held = Seen {
            held: true,
            ..before
        };
        assert!(
            rollout(&object, &held)
                .pending
                .contains("holds routes back")
        );
        // A resourceVersion that is not a number is never taken as reflected.
        assert!(!reflects(&new, "Ingress", "x"));
        assert!(!reflects(&new, "HTTPRoute", "1"));
    }
}
