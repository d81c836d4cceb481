//! The Gateway API kinds holdfast watches (GatewayClass, Gateway, HTTPRoute, GRPCRoute,
//! TLSRoute and ReferenceGrant, `gateway.networking.k8s.io/v1`), and what API discovery says of
//! them.
//!
//! Each kind is cached as its metadata, its `spec` and its `status` as JSON, parsed per
//! object when it is translated: an object this version of holdfast cannot read is one
//! object's problem, never a list that fails to decode (which would keep the whole kind
//! incomplete). The status is kept to write only what differs.
//!
//! The kinds are CustomResourceDefinitions that a cluster may not have. The rule
//! (docs/design.md, "I could not find out" is not "it does not exist"): a kind counts as
//! empty only when API discovery answers that its group, version or resource does not
//! exist ([`Discovered::Absent`]). A discovery request that fails or times out is
//! [`Discovered::Unknown`], and a kind never answered for is not complete.

use std::borrow::Cow;

pub mod attach;
pub mod grpc;
pub mod model;
pub mod routes;
pub mod services;
pub mod status;
pub mod tls_route;

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
    ($(#[$doc:meta])* $name:ident, $kind:literal, $plural:literal, $scope:ty
     $(, { $($(#[$fdoc:meta])* $field:ident: $fty:ty),* })?) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, Serialize, Deserialize)]
        pub struct $name {
            /// The object's metadata.
            pub metadata: ObjectMeta,
            /// Its `spec`, parsed when translated.
            #[serde(default)]
            pub spec: serde_json::Value,
            /// Its `status` (holdfast writes it; kept to write only what differs).
            #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
            pub status: serde_json::Value,
            $($(
                $(#[$fdoc])*
                #[serde(skip)]
                pub $field: $fty,
            )*)?
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
    /// An HTTPRoute: HTTP rules attached to Gateways' listeners. A GRPCRoute is read as
    /// one too ([`grpc::as_http_route`]): its `kind` says which it is.
    HttpRoute,
    "HTTPRoute",
    "httproutes",
    k8s_openapi::NamespaceResourceScope,
    {
        /// Which kind of route this is (never read from or written to the API: a
        /// GRPCRoute read as an HTTPRoute says so here).
        kind: RouteKind
    }
);
gateway_kind!(
    /// A GRPCRoute: gRPC rules (service and method matches) attached to Gateways'
    /// listeners. Served as the HTTPRoute it amounts to ([`grpc::as_http_route`]).
    GrpcRoute,
    "GRPCRoute",
    "grpcroutes",
    k8s_openapi::NamespaceResourceScope
);

gateway_kind!(
    /// A TLSRoute: TLS connections by server name (SNI), relayed unopened to backends
    /// (listeners of protocol TLS, mode Passthrough). Served as the HTTPRoute it amounts
    /// to ([`tls_route::as_http_route`]): one entry per hostname, its backends weighted.
    TlsRoute,
    "TLSRoute",
    "tlsroutes",
    k8s_openapi::NamespaceResourceScope
);

/// The kinds of route holdfast serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum RouteKind {
    /// An HTTPRoute.
    #[default]
    Http,
    /// A GRPCRoute.
    Grpc,
    /// A TLSRoute.
    Tls,
}

impl RouteKind {
    /// The kind's name, as in `apiVersion`/`kind` and `supportedKinds`.
    pub fn name(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
            RouteKind::Tls => "TLSRoute",
        }
    }
}
gateway_kind!(
    /// A ReferenceGrant: which namespaces' objects may refer to objects in this one.
    ReferenceGrant,
    "ReferenceGrant",
    "referencegrants",
    k8s_openapi::NamespaceResourceScope
);

/// The `spec.controllerName` of the GatewayClasses holdfast implements, unless
/// `--gateway-controller-name` says otherwise.
pub const DEFAULT_CONTROLLER_NAME: &str = "holdfast.dev/gateway-controller";

/// The Gateway API features holdfast implements, as the conformance suite names them
/// (`sigs.k8s.io/gateway-api/pkg/features`), sorted: what `status.supportedFeatures` of
/// an accepted GatewayClass lists. It grows as each feature is served and passes the
/// suite's tests for it; nothing is listed that is not.
pub const SUPPORTED_FEATURES: &[&str] = &[
    "GRPCRoute",
    "Gateway",
    "GatewayPort8080",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteCORS",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
    "ReferenceGrant",
    "TLSRoute",
];

/// The status to write for `class` if it is ours (its `spec.controllerName` is
/// `controller`) and its status is not already this: Accepted (at its generation), with
/// [`SUPPORTED_FEATURES`]. `now` is the RFC 3339 time for a condition that changes; an
/// unchanged condition keeps its time. None: not ours, or nothing to change.
pub fn gateway_class_status(
    class: &GatewayClass,
    controller: &str,
    now: &str,
) -> Option<serde_json::Value> {
    if class.spec["controllerName"].as_str() != Some(controller) {
        return None;
    }
    let generation = class.metadata.generation.unwrap_or(0);
    let accepted = condition(
        &class.status,
        "Accepted",
        "True",
        "Accepted",
        "the holdfast controller accepts this class",
        generation,
        now,
    );
    let features: Vec<serde_json::Value> = SUPPORTED_FEATURES
        .iter()
        .map(|f| serde_json::json!({ "name": f }))
        .collect();
    let desired = serde_json::json!({
        "conditions": [accepted],
        "supportedFeatures": features,
    });
    let current = serde_json::json!({
        "conditions": class.status.get("conditions").cloned().unwrap_or(serde_json::json!([])),
        "supportedFeatures": class.status.get("supportedFeatures").cloned().unwrap_or(serde_json::json!([])),
    });
    (current != desired).then_some(desired)
}

/// A status condition of `kind`, keeping the current one's `lastTransitionTime` when its
/// status does not change (as the API conventions ask), else `now`.
pub(crate) fn condition(
    status: &serde_json::Value,
    kind: &str,
    value: &str,
    reason: &str,
    message: &str,
    generation: i64,
    now: &str,
) -> serde_json::Value {
    let current = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind));
    let since = current
        .filter(|c| c["status"] == value)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or(now);
    // Built in place, not with `json!` (which goes through a serializer): the leader
    // makes two for every route on every status pass.
    serde_json::Value::Object(serde_json::Map::from_iter([
        ("type".to_owned(), kind.into()),
        ("status".to_owned(), value.into()),
        ("reason".to_owned(), reason.into()),
        ("message".to_owned(), message.into()),
        ("observedGeneration".to_owned(), generation.into()),
        ("lastTransitionTime".to_owned(), since.into()),
    ]))
}

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

/// Whether an [`Discovered::Absent`] answer for `GROUP/VERSION` stands once `/apis` has
/// been read too (see `caches::discover`): `v1_was_404` says the first answer was a 404,
/// `versions` are the group's versions `/apis` lists (none: the group is not served), and
/// `elsewhere` is another of those versions that serves `plural`. It stands only when
/// `/apis` agrees that the version does not exist and no other version has the kind: a 404
/// from something in front of the API server, or a kind served only at an older version,
/// is "could not find out", never empty.
pub fn confirmed(
    absent: String,
    v1_was_404: bool,
    versions: &[String],
    elsewhere: Option<&str>,
    plural: &str,
) -> Discovered {
    if let Some(v) = elsewhere {
        return Discovered::Unknown(format!(
            "{plural} is served at {GROUP}/{v}, not {VERSION}: holdfast reads {VERSION} (install the Gateway API standard CRDs of v1.5 or newer)"
        ));
    }
    if v1_was_404 && versions.iter().any(|v| v == VERSION) {
        return Discovered::Unknown(format!(
            "{API_VERSION} answered 404 although /apis lists it (a proxy in front of the API server?)"
        ));
    }
    Discovered::Absent(absent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;

    #[test]
    fn absent_stands_only_when_apis_agrees_and_no_other_version_has_the_kind() {
        let v = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let why = || "not installed".to_owned();
        assert_eq!(
            confirmed(why(), true, &[], None, "httproutes"),
            Discovered::Absent(why())
        );
        assert_eq!(
            confirmed(why(), true, &v(&["v1beta1"]), None, "httproutes"),
            Discovered::Absent(why())
        );
        assert!(matches!(
            confirmed(why(), true, &v(&["v1", "v1beta1"]), None, "httproutes"),
            Discovered::Unknown(m) if m.contains("404")
        ));
        assert!(matches!(
            confirmed(why(), false, &v(&["v1", "v1beta1"]), Some("v1beta1"), "referencegrants"),
            Discovered::Unknown(m) if m.contains("v1beta1")
        ));
        assert_eq!(
            confirmed(why(), false, &v(&["v1"]), None, "referencegrants"),
            Discovered::Absent(why())
        );
    }

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

    fn class(controller: &str, generation: i64, status: serde_json::Value) -> GatewayClass {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "holdfast", "generation": generation },
            "spec": { "controllerName": controller },
            "status": status,
        }))
        .expect("a GatewayClass")
    }

    #[test]
    fn our_gateway_class_is_accepted_at_its_generation_and_another_controllers_is_left_alone() {
        let ours = class(DEFAULT_CONTROLLER_NAME, 2, serde_json::Value::Null);
        let status = gateway_class_status(&ours, DEFAULT_CONTROLLER_NAME, "t1").expect("ours");
        let accepted = &status["conditions"][0];
        assert_eq!(accepted["type"], "Accepted");
        assert_eq!(accepted["status"], "True");
        assert_eq!(accepted["reason"], "Accepted");
        assert_eq!(accepted["observedGeneration"], 2);
        assert_eq!(accepted["lastTransitionTime"], "t1");
        assert_eq!(
            status["supportedFeatures"],
            serde_json::json!([
                { "name": "GRPCRoute" },
                { "name": "Gateway" },
                { "name": "GatewayPort8080" },
                { "name": "HTTPRoute" },
                { "name": "HTTPRoute303RedirectStatusCode" },
                { "name": "HTTPRoute307RedirectStatusCode" },
                { "name": "HTTPRoute308RedirectStatusCode" },
                { "name": "HTTPRouteBackendProtocolH2C" },
                { "name": "HTTPRouteBackendProtocolWebSocket" },
                { "name": "HTTPRouteBackendRequestHeaderModification" },
                { "name": "HTTPRouteBackendTimeout" },
                { "name": "HTTPRouteCORS" },
                { "name": "HTTPRouteDestinationPortMatching" },
                { "name": "HTTPRouteHostRewrite" },
                { "name": "HTTPRouteMethodMatching" },
                { "name": "HTTPRouteNamedRouteRule" },
                { "name": "HTTPRouteParentRefPort" },
                { "name": "HTTPRoutePathRedirect" },
                { "name": "HTTPRoutePathRewrite" },
                { "name": "HTTPRoutePortRedirect" },
                { "name": "HTTPRouteQueryParamMatching" },
                { "name": "HTTPRouteRequestMirror" },
                { "name": "HTTPRouteRequestMultipleMirrors" },
                { "name": "HTTPRouteRequestPercentageMirror" },
                { "name": "HTTPRouteRequestTimeout" },
                { "name": "HTTPRouteResponseHeaderModification" },
                { "name": "HTTPRouteSchemeRedirect" },
                { "name": "ReferenceGrant" },
                { "name": "TLSRoute" }
            ])
        );
        // Written once: the same status is not written again, and its time is kept.
        let written = class(DEFAULT_CONTROLLER_NAME, 2, status.clone());
        assert_eq!(
            gateway_class_status(&written, DEFAULT_CONTROLLER_NAME, "t2"),
            None
        );
        // A new generation is observed, keeping the transition time (still True).
        let bumped = class(DEFAULT_CONTROLLER_NAME, 3, status);
        let next = gateway_class_status(&bumped, DEFAULT_CONTROLLER_NAME, "t3").expect("bumped");
        assert_eq!(next["conditions"][0]["observedGeneration"], 3);
        assert_eq!(next["conditions"][0]["lastTransitionTime"], "t1");
        // Another controller's class: never written.
        let theirs = class("example.com/other", 1, serde_json::Value::Null);
        assert_eq!(
            gateway_class_status(&theirs, DEFAULT_CONTROLLER_NAME, "t1"),
            None
        );
        assert!(SUPPORTED_FEATURES.windows(2).all(|w| w[0] < w[1]), "sorted");
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
