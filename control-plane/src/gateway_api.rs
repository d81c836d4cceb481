//! The Gateway API kinds holdfast watches (GatewayClass, Gateway, HTTPRoute and
//! ReferenceGrant, `gateway.networking.k8s.io/v1`), and what API discovery says of them.
//!
//! Each kind is cached as its metadata and its `spec` as JSON, parsed per object when it is
//! translated: an object this version of holdfast cannot read is one object's problem,
//! never a list that fails to decode (which would keep the whole kind incomplete). Status
//! is not cached; holdfast writes it.
//!
//! The kinds are CustomResourceDefinitions that a cluster may not have. The rule
//! (docs/design.md, "I could not find out" is not "it does not exist"): a kind counts as
//! empty only when API discovery answers that its group, version or resource does not
//! exist ([`Discovered::Absent`]). A discovery request that fails or times out is
//! [`Discovered::Unknown`], and a kind never answered for is not complete.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResourceList, ObjectMeta};
use kube::Resource;
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// The version holdfast reads (the standard channel serves every kind here at v1).
pub const VERSION: &str = "v1";
/// `GROUP/VERSION`.
pub const API_VERSION: &str = "gateway.networking.k8s.io/v1";

macro_rules! gateway_kind {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $plural:literal, $scope:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, Serialize, Deserialize)]
        pub struct $name {
            /// The object's metadata.
            pub metadata: ObjectMeta,
            /// Its `spec`, parsed when translated.
            #[serde(default)]
            pub spec: serde_json::Value,
        }

        impl Resource for $name {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                VERSION.into()
            }
            fn api_version(_: &()) -> Cow<'_, str> {
                API_VERSION.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

gateway_kind!(
    /// A GatewayClass (cluster-scoped): which controller implements Gateways of the class.
    GatewayClass,
    "GatewayClass",
    "gatewayclasses",
    k8s_openapi::ClusterResourceScope
);
gateway_kind!(
    /// A Gateway: listeners (port, protocol, hostname, TLS, which routes may attach).
    Gateway,
    "Gateway",
    "gateways",
    k8s_openapi::NamespaceResourceScope
);
gateway_kind!(
    /// An HTTPRoute: HTTP rules attached to Gateways' listeners.
    HttpRoute,
    "HTTPRoute",
    "httproutes",
    k8s_openapi::NamespaceResourceScope
);
gateway_kind!(
    /// A ReferenceGrant: which namespaces' objects may refer to objects in this one.
    ReferenceGrant,
    "ReferenceGrant",
    "referencegrants",
    k8s_openapi::NamespaceResourceScope
);

/// What API discovery said of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovered {
    /// Served: watch it.
    Served,
    /// The API server answered that the group, the version or the resource does not
    /// exist (the CRD is not installed): the kind is empty.
    Absent(String),
    /// No answer (a failed or timed-out request, any other status): could not find out.
    Unknown(String),
}

/// What the answer to `GET /apis/GROUP/VERSION` says of `plural`: its resource list, or
/// the API server's status code (404: the group or version does not exist) and message,
/// or a failure with no answer (`None`).
pub fn discovered(
    answer: Result<&APIResourceList, (Option<u16>, &str)>,
    plural: &str,
) -> Discovered {
    match answer {
        Ok(list) if list.resources.iter().any(|r| r.name == plural) => Discovered::Served,
        Ok(_) => Discovered::Absent(format!(
            "{API_VERSION} is served without {plural} (its CustomResourceDefinition is not installed)"
        )),
        Err((Some(404), _)) => Discovered::Absent(format!(
            "{API_VERSION} is not served (the Gateway API CustomResourceDefinitions are not installed)"
        )),
        Err((Some(code), message)) => Discovered::Unknown(format!(
            "API discovery of {API_VERSION}: {message} ({code})"
        )),
        Err((None, message)) => {
            Discovered::Unknown(format!("API discovery of {API_VERSION}: {message}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;

    fn list(names: &[&str]) -> APIResourceList {
        APIResourceList {
            group_version: API_VERSION.into(),
            resources: names
                .iter()
                .map(|n| APIResource {
                    name: (*n).into(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn only_an_answer_that_it_does_not_exist_makes_a_kind_absent() {
        let l = list(&["gateways", "gateways/status", "httproutes"]);
        assert_eq!(discovered(Ok(&l), "httproutes"), Discovered::Served);
        assert!(matches!(
            discovered(Ok(&l), "referencegrants"),
            Discovered::Absent(_)
        ));
        assert!(matches!(
            discovered(
                Err((
                    Some(404),
                    "the server could not find the requested resource"
                )),
                "httproutes"
            ),
            Discovered::Absent(_)
        ));
        // Could not find out: a refusal, an error status, a timeout.
        for (code, message) in [
            (Some(403), "forbidden"),
            (Some(500), "internal error"),
            (Some(503), "unavailable"),
            (Some(429), "too many requests"),
            (None, "timed out"),
            (None, "connection refused"),
        ] {
            assert!(
                matches!(discovered(Err((code, message)), "httproutes"), Discovered::Unknown(m) if m.contains(message)),
                "{code:?} {message}"
            );
        }
    }

    #[test]
    fn an_object_is_its_metadata_and_spec_whatever_the_spec_holds() {
        let route: HttpRoute = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": "HTTPRoute",
            "metadata": { "name": "r", "namespace": "ns", "generation": 3 },
            "spec": { "parentRefs": [{ "name": "gw" }], "rules": "not what the schema says" },
            "status": { "parents": [] }
        }))
        .expect("any spec is kept");
        assert_eq!(route.metadata.generation, Some(3));
        assert_eq!(route.spec["parentRefs"][0]["name"], "gw");
        assert_eq!(HttpRoute::plural(&()), "httproutes");
        assert_eq!(GatewayClass::kind(&()), "GatewayClass");
    }
}
