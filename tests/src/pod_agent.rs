//! What the pod agent (`holdfast-pod-agent`) decides, in plain functions: which program an
//! image is and its arguments, a container's environment from its pod (values and field
//! references), which volumes it mounts where and the files a Secret or ConfigMap volume
//! holds, the CRI log line format kwok serves through `pods/log`, and the status patches
//! that say a pod is Ready, or why it is not. The binary does the I/O around them.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, KeyToPath, Pod};
use serde_json::{Value, json};

/// The programs the agent can run, by image name (whatever the registry and tag), each
/// built from its pinned Go module by `k8s.sh ensure`: echo-basic (the Gateway API
/// conformance suite's backend) and coredns (its UDP backend).
pub fn program_for(image: &str, tools_bin: &Path) -> Option<PathBuf> {
    let name = image.rsplit('/').next().unwrap_or(image);
    let name = name.split(['@', ':']).next().unwrap_or(name);
    matches!(name, "echo-basic" | "coredns").then(|| tools_bin.join(name))
}

/// The arguments `container` gives its image's program (`args`), or why the agent cannot
/// run it: `command` replaces the image's entrypoint with a path inside the image, and the
/// agent has no image filesystem.
pub fn program_args(container: &Container) -> Result<Vec<String>, String> {
    if container.command.is_some() {
        return Err(format!(
            "container {:?} sets a command: the pod agent runs its image's program, with args",
            container.name
        ));
    }
    Ok(container.args.clone().unwrap_or_default())
}

/// Where a volume comes from: the object the agent reads and writes to disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeObject {
    /// The Secret of this name, in the pod's namespace.
    Secret(String),
    /// The ConfigMap of this name, in the pod's namespace.
    ConfigMap(String),
}

/// A volume a container mounts: the object it holds, which of its keys go to which files
/// (every key, by its name, when `items` is not given), and whether a missing object or
/// key is allowed (`optional`).
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    /// The volume's name in the pod.
    pub name: String,
    /// What it holds.
    pub object: VolumeObject,
    /// Which keys go to which files; `None`: every key, by its name.
    pub items: Option<Vec<KeyToPath>>,
    /// Whether a missing object or key is allowed.
    pub optional: bool,
}

/// One mount: volume `volume` at `target`, read-only (Secret and ConfigMap volumes always
/// are).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The volume's name.
    pub volume: String,
    /// Where the program sees it.
    pub target: PathBuf,
}

/// The volumes `container` mounts and where, or why the agent cannot run it as it asks.
/// Secret and ConfigMap volumes are supported, mounted whole (no `subPath`) at an absolute
/// directory that is not `/` and whose path has no `..`, `,` or `:` (overlay options). The
/// service account token kube-apiserver adds to every pod (`kube-api-access-*`) is not
/// mounted: no program the agent runs reads it.
pub fn mounts(pod: &Pod, container: &Container) -> Result<(Vec<Volume>, Vec<Mount>), String> {
    let declared = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let mut volumes: Vec<Volume> = Vec::new();
    let mut out = Vec::new();
    for m in container.volume_mounts.iter().flatten() {
        if m.name.starts_with("kube-api-access-") {
            continue;
        }
        let here = format!("volume {:?} at {}", m.name, m.mount_path);
        if m.sub_path.is_some() || m.sub_path_expr.is_some() {
            return Err(format!(
                "{here}: the pod agent mounts whole volumes (no subPath)"
            ));
        }
        let target = PathBuf::from(&m.mount_path);
        let plain = target
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !target.is_absolute()
            || target.parent().is_none()
            || !plain
            || m.mount_path.contains([',', ':'])
        {
            return Err(format!("{here}: not a mount path the pod agent can use"));
        }
        let Some(v) = declared.and_then(|all| all.iter().find(|v| v.name == m.name)) else {
            return Err(format!("{here}: the pod declares no such volume"));
        };
        let volume = match (&v.secret, &v.config_map) {
            (Some(s), _) => Volume {
                name: v.name.clone(),
                object: VolumeObject::Secret(s.secret_name.clone().unwrap_or_default()),
                items: s.items.clone(),
                optional: s.optional.unwrap_or(false),
            },
            (None, Some(c)) => Volume {
                name: v.name.clone(),
                object: VolumeObject::ConfigMap(c.name.clone()),
                items: c.items.clone(),
                optional: c.optional.unwrap_or(false),
            },
            (None, None) => {
                return Err(format!(
                    "{here}: the pod agent mounts only Secret and ConfigMap volumes"
                ));
            }
        };
        if !volumes.iter().any(|known| known.name == volume.name) {
            volumes.push(volume);
        }
        out.push(Mount {
            volume: m.name.clone(),
            target,
        });
    }
    Ok((volumes, out))
}

/// The files of `volume` given its object's data (`None`: the object does not exist), as
/// paths relative to the volume's directory: each key under its own name, or as `items`
/// maps them. A missing object or key that is not optional is an error, as is an item path
/// that is absolute or climbs out (`..`).
pub fn volume_files(
    volume: &Volume,
    data: Option<&BTreeMap<String, Vec<u8>>>,
) -> Result<Vec<(PathBuf, Vec<u8>)>, String> {
    let what = match &volume.object {
        VolumeObject::Secret(n) => format!("Secret {n:?}"),
        VolumeObject::ConfigMap(n) => format!("ConfigMap {n:?}"),
    };
    let Some(data) = data else {
        return if volume.optional {
            Ok(Vec::new())
        } else {
            Err(format!("volume {:?}: {what} not found", volume.name))
        };
    };
    let Some(items) = &volume.items else {
        return Ok(data
            .iter()
            .map(|(k, v)| (PathBuf::from(k), v.clone()))
            .collect());
    };
    let mut files = Vec::new();
    for item in items {
        let path = PathBuf::from(&item.path);
        if !path.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(format!(
                "volume {:?}: item path {:?} is not relative",
                volume.name, item.path
            ));
        }
        match data.get(&item.key) {
            Some(v) => files.push((path, v.clone())),
            None if volume.optional => {}
            None => {
                return Err(format!(
                    "volume {:?}: {what} has no key {:?}",
                    volume.name, item.key
                ));
            }
        }
    }
    Ok(files)
}

/// Why a container's environment cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError(pub String);

/// `container`'s environment: its `env` values, and field references to what the pod says
/// of itself (name, namespace, uid, addresses, node, service account, labels and
/// annotations). References to Secrets and ConfigMaps, and resource fields, are refused
/// with the reason (never guessed).
pub fn environment(pod: &Pod, container: &Container) -> Result<Vec<(String, String)>, EnvError> {
    let mut out = Vec::new();
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) => v.clone(),
            (None, None) => String::new(),
            (None, Some(from)) => match &from.field_ref {
                Some(f) => field(pod, &f.field_path).ok_or_else(|| {
                    EnvError(format!("{}: unknown fieldRef {:?}", var.name, f.field_path))
                })?,
                None => {
                    return Err(EnvError(format!(
                        "{}: only values and fieldRefs are supported",
                        var.name
                    )));
                }
            },
        };
        out.push((var.name.clone(), value));
    }
    Ok(out)
}

/// The value of a downward-API field path of `pod`, if the agent knows it.
fn field(pod: &Pod, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let keyed = |map: Option<&BTreeMap<String, String>>, rest: &str| {
        let key = rest.strip_prefix("['")?.strip_suffix("']")?;
        map?.get(key).cloned()
    };
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec?.node_name.clone(),
        "spec.serviceAccountName" => spec?.service_account_name.clone(),
        "status.podIP" => status?.pod_ip.clone(),
        "status.hostIP" => status?.host_ip.clone(),
        p => {
            if let Some(rest) = p.strip_prefix("metadata.labels") {
                keyed(meta.labels.as_ref(), rest)
            } else if let Some(rest) = p.strip_prefix("metadata.annotations") {
                keyed(meta.annotations.as_ref(), rest)
            } else {
                None
            }
        }
    }
}

/// The TCP ports a container declares: the agent marks the pod Ready once each listens.
pub fn ports(container: &Container) -> Vec<u16> {
    container
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .collect()
}

/// One line of a container's output in the CRI log format (what kubelets write and kwok
/// serves through `pods/log`): `<RFC 3339 nano time> <stdout|stderr> F <line>`.
pub fn cri_line(at: &str, stream: &str, line: &str) -> String {
    format!("{at} {stream} F {line}\n")
}

/// kwok's `Logs` object for `pod` (same name and namespace, owned by the pod so that it
/// goes with it): where each container's CRI log file is, which kwok serves through
/// `pods/log`.
pub fn logs_object(pod: &Pod, files: &[(String, PathBuf)]) -> Value {
    let meta = &pod.metadata;
    let logs: Vec<Value> = files
        .iter()
        .map(|(container, file)| {
            json!({
                "containers": [container],
                "logsFile": file.to_string_lossy(),
                "follow": true,
            })
        })
        .collect();
    json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta.name,
                "uid": meta.uid,
            }],
        },
        "spec": { "logs": logs },
    })
}

/// A status patch (strategic merge) for `pod`: Ready and ContainersReady as `ready` says,
/// with `reason` and `message`, and each container's readiness. `containerStatuses` is an
/// atomic list (a patch replaces it whole), so each entry kwok wrote is kept with only
/// `ready` changed; a container without one gets `{name, ready}`.
pub fn readiness_patch(pod: &Pod, ready: bool, reason: &str, message: &str, now: &str) -> Value {
    let status = if ready { "True" } else { "False" };
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    let containers: Vec<Value> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| {
            let mut entry = current
                .and_then(|all| all.iter().find(|s| s.name == c.name))
                .and_then(|s| serde_json::to_value(s).ok())
                .unwrap_or_else(|| json!({ "name": c.name }));
            entry["ready"] = json!(ready);
            entry
        })
        .collect();
    let condition = |kind: &str| {
        json!({
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
        })
    };
    json!({
        "status": {
            "conditions": [condition("ContainersReady"), condition("Ready")],
            "containerStatuses": containers,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-1", "namespace": "ns", "uid": "u-1",
                "labels": { "app": "web" }
            },
            "spec": {
                "nodeName": "kwok-node-0",
                "serviceAccountName": "default",
                "containers": [{
                    "name": "echo",
                    "image": "gcr.io/k8s-staging-gateway-api/echo-basic:v20240412-v1.0.0-394",
                    "ports": [{ "containerPort": 3000 }, { "containerPort": 53, "protocol": "UDP" }],
                    "env": [
                        { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                        { "name": "NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                        { "name": "APP", "valueFrom": { "fieldRef": { "fieldPath": "metadata.labels['app']" } } },
                        { "name": "IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "PLAIN", "value": "x" }
                    ]
                }]
            },
            "status": { "podIP": "10.200.1.5" }
        }))
        .expect("a pod")
    }

    #[test]
    fn only_echo_basic_and_coredns_images_are_known() {
        let bin = Path::new("/tools");
        for image in [
            "gcr.io/k8s-staging-gateway-api/echo-basic:v20240412-v1.0.0-394",
            "registry.k8s.io/gateway-api/echo-basic@sha256:abc",
            "echo-basic",
        ] {
            assert_eq!(
                program_for(image, bin),
                Some(bin.join("echo-basic")),
                "{image}"
            );
        }
        assert_eq!(
            program_for("registry.k8s.io/coredns/coredns:v1.12.2", bin),
            Some(bin.join("coredns"))
        );
        for image in ["nginx:1.27", "echo-basic-like:1", "gcr.io/x/echo:1"] {
            assert_eq!(program_for(image, bin), None, "{image}");
        }
    }

    #[test]
    fn the_environment_comes_from_values_and_field_references() {
        let p = pod();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let env = environment(&p, c).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("POD_NAME"), Some("web-1"));
        assert_eq!(get("NAMESPACE"), Some("ns"));
        assert_eq!(get("APP"), Some("web"));
        assert_eq!(get("IP"), Some("10.200.1.5"));
        assert_eq!(get("PLAIN"), Some("x"));
        assert_eq!(ports(c), vec![3000]);
    }

    #[test]
    fn a_reference_the_agent_cannot_resolve_is_an_error_not_a_guess() {
        for var in [
            json!({ "name": "TOKEN", "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } }),
            json!({ "name": "X", "valueFrom": { "fieldRef": { "fieldPath": "spec.nosuch" } } }),
        ] {
            let mut p = pod();
            let c = &mut p.spec.as_mut().unwrap().containers[0];
            c.env = Some(vec![serde_json::from_value(var.clone()).unwrap()]);
            let c = c.clone();
            let e = environment(&p, &c).unwrap_err();
            assert!(e.0.starts_with(var["name"].as_str().unwrap()), "{e:?}");
        }
    }

    #[test]
    fn args_are_passed_and_a_command_is_refused() {
        let mut c = pod().spec.unwrap().containers[0].clone();
        assert_eq!(program_args(&c), Ok(vec![]));
        c.args = Some(vec!["-conf".into(), "/root/Corefile".into()]);
        assert_eq!(
            program_args(&c),
            Ok(vec!["-conf".into(), "/root/Corefile".into()])
        );
        c.command = Some(vec!["/bin/sh".into()]);
        assert!(program_args(&c).is_err_and(|why| why.contains("command")));
    }

    fn with_mounts(volumes: Value, mounts_: Value) -> (Pod, Container) {
        let mut p = pod();
        p.spec.as_mut().unwrap().volumes = Some(serde_json::from_value(volumes).unwrap());
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        c.volume_mounts = Some(serde_json::from_value(mounts_).unwrap());
        let c = c.clone();
        (p, c)
    }

    #[test]
    fn secret_and_config_map_volumes_are_mounted_and_the_token_is_skipped() {
        let (p, c) = with_mounts(
            json!([
                { "name": "secret-volume", "secret": {
                    "secretName": "tls", "items": [{ "key": "tls.crt", "path": "crt" }] } },
                { "name": "conf", "configMap": { "name": "coredns", "optional": true } }
            ]),
            json!([
                { "name": "kube-api-access-abcde",
                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount" },
                { "name": "secret-volume", "mountPath": "/etc/secret-volume" },
                { "name": "conf", "mountPath": "/root" }
            ]),
        );
        let (volumes, m) = mounts(&p, &c).unwrap();
        assert_eq!(volumes.len(), 2);
        assert_eq!(volumes[0].object, VolumeObject::Secret("tls".into()));
        assert_eq!(volumes[1].object, VolumeObject::ConfigMap("coredns".into()));
        assert!(volumes[1].optional);
        assert_eq!(
            m,
            vec![
                Mount {
                    volume: "secret-volume".into(),
                    target: "/etc/secret-volume".into()
                },
                Mount {
                    volume: "conf".into(),
                    target: "/root".into()
                },
            ]
        );
    }

    #[test]
    fn mounts_the_agent_cannot_make_are_refused_with_the_reason() {
        let volumes = json!([
            { "name": "v", "secret": { "secretName": "s" } },
            { "name": "scratch", "emptyDir": {} }
        ]);
        for (mount, why) in [
            (
                json!({ "name": "v", "mountPath": "/etc/x", "subPath": "a" }),
                "subPath",
            ),
            (json!({ "name": "v", "mountPath": "/" }), "mount path"),
            (
                json!({ "name": "v", "mountPath": "/etc/../x" }),
                "mount path",
            ),
            (
                json!({ "name": "v", "mountPath": "relative" }),
                "mount path",
            ),
            (
                json!({ "name": "v", "mountPath": "/etc/a:b" }),
                "mount path",
            ),
            (
                json!({ "name": "nosuch", "mountPath": "/etc/x" }),
                "no such volume",
            ),
            (
                json!({ "name": "scratch", "mountPath": "/tmp/x" }),
                "only Secret and ConfigMap",
            ),
        ] {
            let (p, c) = with_mounts(volumes.clone(), json!([mount]));
            let e = mounts(&p, &c).unwrap_err();
            assert!(e.contains(why), "{mount}: {e}");
        }
    }

    #[test]
    fn a_volume_holds_its_keys_or_its_items_and_a_missing_object_or_key_is_an_error() {
        let data: BTreeMap<String, Vec<u8>> = [
            ("tls.crt".to_owned(), b"CERT".to_vec()),
            ("tls.key".to_owned(), b"KEY".to_vec()),
        ]
        .into();
        let item = |key: &str, path: &str| -> KeyToPath {
            serde_json::from_value(json!({ "key": key, "path": path })).unwrap()
        };
        let mut v = Volume {
            name: "secret-volume".into(),
            object: VolumeObject::Secret("tls".into()),
            items: None,
            optional: false,
        };
        let files = volume_files(&v, Some(&data)).unwrap();
        assert_eq!(
            files,
            vec![
                ("tls.crt".into(), b"CERT".to_vec()),
                ("tls.key".into(), b"KEY".to_vec())
            ]
        );
        v.items = Some(vec![item("tls.crt", "crt"), item("tls.key", "key")]);
        let files = volume_files(&v, Some(&data)).unwrap();
        assert_eq!(
            files,
            vec![
                ("crt".into(), b"CERT".to_vec()),
                ("key".into(), b"KEY".to_vec())
            ]
        );
        assert!(volume_files(&v, None).is_err_and(|e| e.contains("not found")));
        v.items = Some(vec![item("ca.crt", "ca")]);
        assert!(volume_files(&v, Some(&data)).is_err_and(|e| e.contains("ca.crt")));
        v.items = Some(vec![item("tls.crt", "../escape")]);
        assert!(volume_files(&v, Some(&data)).is_err_and(|e| e.contains("not relative")));
        v.optional = true;
        assert_eq!(volume_files(&v, None), Ok(vec![]));
    }

    #[test]
    fn the_logs_object_names_each_containers_file_and_is_owned_by_the_pod() {
        let files = [(
            "backend".to_owned(),
            PathBuf::from("/logs/ns_web-1_u-1/backend/0.log"),
        )];
        let o = logs_object(&pod(), &files);
        assert_eq!(o["kind"], "Logs");
        assert_eq!(o["metadata"]["name"], "web-1");
        assert_eq!(o["metadata"]["namespace"], "ns");
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(o["spec"]["logs"][0]["containers"][0], "backend");
        assert_eq!(
            o["spec"]["logs"][0]["logsFile"],
            "/logs/ns_web-1_u-1/backend/0.log"
        );
    }

    #[test]
    fn log_lines_are_cri_lines_and_readiness_names_every_container() {
        assert_eq!(
            cri_line("2026-12-05T16:00:00.000000001Z", "stdout", "hello"),
            "2026-12-05T16:00:00.000000001Z stdout F hello\n"
        );
        let mut p = pod();
        p.status.as_mut().unwrap().container_statuses = Some(vec![
            serde_json::from_value(json!({
                "name": "echo", "image": "echo-basic", "imageID": "", "ready": false,
                "restartCount": 0, "started": true,
                "state": { "running": { "startedAt": "2026-12-05T16:00:00Z" } }
            }))
            .unwrap(),
        ]);
        let patch = readiness_patch(&p, true, "PortsListening", "3000", "t");
        let kept = &patch["status"]["containerStatuses"][0];
        assert_eq!(kept["image"], "echo-basic", "kwok's entry is kept: {kept}");
        assert!(kept["state"]["running"].is_object(), "{kept}");
        let patch = readiness_patch(&pod(), true, "PortsListening", "3000", "t");
        assert_eq!(patch["status"]["conditions"][1]["type"], "Ready");
        assert_eq!(patch["status"]["conditions"][1]["status"], "True");
        assert_eq!(patch["status"]["containerStatuses"][0]["name"], "echo");
        assert_eq!(patch["status"]["containerStatuses"][0]["ready"], true);
    }
}
