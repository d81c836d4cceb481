//! What the pod agent (`holdfast-pod-agent`) decides, in plain functions: which program an
//! image is, a container's environment from its pod (values and field references), the
//! CRI log line format kwok serves through `pods/log`, and the status patches that say a
//! pod is Ready, or why it is not. The binary does the I/O around them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

/// The programs the agent can run, by image: echo-basic (the Gateway API conformance
/// suite's backend, built from the pinned module by `k8s.sh ensure`) for any image whose
/// name is `echo-basic`, whatever its registry and tag.
pub fn program_for(image: &str, tools_bin: &Path) -> Option<PathBuf> {
    let name = image.rsplit('/').next().unwrap_or(image);
    let name = name.split(['@', ':']).next().unwrap_or(name);
    (name == "echo-basic").then(|| tools_bin.join("echo-basic"))
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

/// Why `container` cannot be run as it asks, if it cannot: the agent runs an image's
/// program as it is (a container that sets `command` or `args` is refused) and mounts
/// nothing yet (a container that mounts any volume is refused, except the service account
/// token kube-apiserver adds to every pod, `kube-api-access-*`, which no program the agent
/// runs reads).
pub fn unsupported_mounts(container: &Container) -> Option<String> {
    if container.command.is_some() || container.args.is_some() {
        return Some(format!(
            "container {:?} sets a command or args: the pod agent runs its image's program as it is",
            container.name
        ));
    }
    container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| !m.name.starts_with("kube-api-access-"))
        .map(|m| {
            format!(
                "volume {:?} at {}: the pod agent mounts no volumes",
                m.name, m.mount_path
            )
        })
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
    fn only_echo_basic_images_are_known() {
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
    fn a_command_or_any_mount_but_the_service_account_token_is_refused() {
        let mut c = pod().spec.unwrap().containers[0].clone();
        assert_eq!(unsupported_mounts(&c), None);
        c.volume_mounts = Some(vec![
            serde_json::from_value(json!({
                "name": "kube-api-access-abcde",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"
            }))
            .unwrap(),
        ]);
        assert_eq!(unsupported_mounts(&c), None);
        c.volume_mounts.as_mut().unwrap().push(
            serde_json::from_value(json!({ "name": "tls", "mountPath": "/etc/tls" })).unwrap(),
        );
        assert!(unsupported_mounts(&c).is_some_and(|why| why.contains("tls")));
        let mut c = pod().spec.unwrap().containers[0].clone();
        c.args = Some(vec!["-conf".into()]);
        assert!(unsupported_mounts(&c).is_some_and(|why| why.contains("args")));
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
