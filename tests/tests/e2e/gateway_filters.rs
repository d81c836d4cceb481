//! HTTPRoute matches and filters beyond the core, end to end: the real API server and
//! control plane, our proxy, the echo backends. The Gateway API suite checks the same
//! features (tests/tests/e2e/conformance.rs); these check what the suite leaves out: the
//! precedence between them, the query kept through a rewrite, and that a response header
//! rule never touches this hop's framing.

use std::net::SocketAddr;

use holdfast_tests::http as web;
use holdfast_tests::wait;
use serde_json::json;

use super::gateway_api::{class_and_gateway, create_all, gateway_address};

/// One HTTPRoute for `filters.test` with a rule per feature; each is asked what it serves
/// and each answer is checked by its status and the echo's report of the request it got
/// (method, host and path) or the redirect's Location. The proxy waits 1 s for a response
/// head unless a rule says otherwise; the echo answers after `delay_ms`.
#[tokio::test]
async fn method_and_query_matches_rewrites_redirect_paths_and_response_headers_are_served_as_written()
-> anyhow::Result<()> {
    use holdfast_tests::scenario::{Options, Scenario, gateway_cp_args};
    let s = Scenario::start(
        "gwfilters",
        Options {
            ingresses: 1,
            proxies: 1,
            cp_args: gateway_cp_args("127.75.0.0/16"),
            proxy_args: vec!["--upstream-response-timeout".into(), "1s".into()],
            ..Options::default()
        },
    )
    .await?;
    s.cluster.install_gateway_api()?;
    let ns = &s.ns;
    let respond = |rule: &str| {
        json!({ "type": "ResponseHeaderModifier", "responseHeaderModifier": {
            "set": [{ "name": "X-Rule", "value": rule }] } })
    };
    create_all(
        &s.cluster,
        "gateway",
        class_and_gateway(
            ns,
            json!([
                { "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                  "metadata": { "name": "filters", "namespace": ns },
                  "spec": { "parentRefs": [{ "name": "gw" }], "hostnames": ["filters.test"],
                    "rules": [
                      { "matches": [{ "method": "PATCH" }],
                        "filters": [respond("patch")],
                        "backendRefs": [{ "name": "app0", "port": 80 }] },
                      { "matches": [{ "queryParams": [{ "name": "animal", "value": "whale" }] }],
                        "filters": [{ "type": "ResponseHeaderModifier", "responseHeaderModifier": {
                            "set": [{ "name": "X-Rule", "value": "whale" },
                                    { "name": "Content-Length", "value": "1" }],
                            "add": [{ "name": "X-Added", "value": "a" }],
                            "remove": ["X-Echo-Headers"] } }],
                        "backendRefs": [{ "name": "app0", "port": 80 }] },
                      { "matches": [{ "path": { "type": "PathPrefix", "value": "/rw" } }],
                        "filters": [{ "type": "URLRewrite", "urlRewrite": {
                            "hostname": "up.test",
                            "path": { "type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2" } } }],
                        "backendRefs": [{ "name": "app0", "port": 80 }] },
                      { "matches": [{ "path": { "type": "PathPrefix", "value": "/full" } }],
                        "filters": [{ "type": "URLRewrite", "urlRewrite": {
                            "path": { "type": "ReplaceFullPath", "replaceFullPath": "/one" } } }],
                        "backendRefs": [{ "name": "app0", "port": 80 }] },
                      { "matches": [{ "path": { "type": "PathPrefix", "value": "/old" } }],
                        "filters": [{ "type": "RequestRedirect", "requestRedirect": {
                            "statusCode": 301,
                            "path": { "type": "ReplacePrefixMatch", "replacePrefixMatch": "/new" } } }] },
                      { "matches": [{ "path": { "type": "PathPrefix", "value": "/whole" } }],
                        "timeouts": { "request": "300ms" },
                        "backendRefs": [{ "name": "app0", "port": 80 }] },
                      { "matches": [{ "path": { "type": "PathPrefix", "value": "/attempt" } }],
                        "timeouts": { "backendRequest": "300ms" },
                        "backendRefs": [{ "name": "app0", "port": 80 }] },
                      { "matches": [{ "path": { "type": "PathPrefix", "value": "/patient" } }],
                        "timeouts": { "request": "0s", "backendRequest": "0s" },
                        "backendRefs": [{ "name": "app0", "port": 80 }] },
                      { "matches": [{ "path": { "type": "PathPrefix", "value": "/cors" } }],
                        "filters": [{ "type": "CORS", "cors": {
                            "allowOrigins": ["https://app.test", "https://*.apps.test"],
                            "allowCredentials": true,
                            "allowMethods": ["GET", "PUT"],
                            "allowHeaders": ["x-token"],
                            "exposeHeaders": ["x-echo-name"],
                            "maxAge": 600 } }],
                        "backendRefs": [{ "name": "app0", "port": 80 }] },
                      { "filters": [respond("default")],
                        "backendRefs": [{ "name": "app0", "port": 80 }] }
                    ] } }
            ]),
        ),
    )?;
    let at: SocketAddr = (
        gateway_address(&s.cluster, ns, "gw")
            .await?
            .parse::<std::net::IpAddr>()?,
        80,
    )
        .into();
    let ask = |method: &'static str, path: &'static str| async move {
        web::request_with(at, method, "filters.test", path, &[]).await
    };
    // Served once the route is: the default rule answers for its backend.
    wait::until("the route served", wait::T, || async {
        Ok(ask("GET", "/x")
            .await
            .ok()
            .filter(|(status, h, _)| {
                *status == 200 && h.get("x-rule").is_some_and(|v| v == "default")
            })
            .map(|_| ()))
    })
    .await?;

    // A method match wins over the rules after it; another method is not it.
    let (status, h, _) = ask("PATCH", "/x").await?;
    assert_eq!((status, &h["x-rule"]), (200, &"patch".parse()?));
    let (_, h, _) = ask("PUT", "/x").await?;
    assert_eq!(h["x-rule"], "default");

    // A query parameter match: the first `animal` is the one compared; the response's
    // headers are changed as the rule says, its framing never.
    let (status, h, body) = ask("GET", "/x?animal=whale&b=1").await?;
    assert_eq!(status, 200);
    assert_eq!(h["x-rule"], "whale");
    assert_eq!(h["x-added"], "a");
    assert!(!h.contains_key("x-echo-headers"), "{h:?}");
    let echo = h["x-echo-name"].to_str()?;
    assert_eq!(
        body,
        format!("{echo}\n"),
        "the body whole, by its own length"
    );
    assert_eq!(h["content-length"], body.len().to_string().as_str());
    let (_, h, _) = ask("GET", "/x?animal=dolphin&animal=whale").await?;
    assert_eq!(
        h["x-rule"], "default",
        "only the first parameter of a name counts"
    );
    let (_, h, _) = ask("GET", "/x?ANIMAL=whale").await?;
    assert_eq!(h["x-rule"], "default", "names are case-sensitive");

    // URLRewrite: the host and the matched prefix, element-wise; the query is kept. The
    // forwarding headers still name the host the client asked for.
    let (status, h, _) = ask("GET", "/rw/a/b?q=1").await?;
    assert_eq!(status, 200);
    assert_eq!(h["x-echo-host"], "up.test");
    assert_eq!(h["x-echo-path"], "/v2/a/b?q=1");
    assert_eq!(h["x-echo-x-forwarded-host"], "filters.test");
    let (_, h, _) = ask("GET", "/rw").await?;
    assert_eq!(h["x-echo-path"], "/v2");
    let (_, h, _) = ask("GET", "/rwx").await?;
    assert_eq!(h["x-echo-path"], "/rwx", "/rwx is not under the prefix /rw");
    let (_, h, _) = ask("GET", "/full/x/y?q=2").await?;
    assert_eq!(h["x-echo-path"], "/one?q=2");
    assert_eq!(h["x-echo-host"], "filters.test");

    // A redirect's path: the matched prefix replaced, the rest and the query kept.
    let (status, h, _) = ask("GET", "/old/page?q=3").await?;
    assert_eq!(status, 301);
    assert_eq!(h["location"], "http://filters.test/new/page?q=3");

    // CORS: a preflight from an allowed origin is answered here with what is allowed;
    // from another, without it; an actual request goes to the backend, and its response
    // names the allowed origin alone.
    let preflight = |origin: &'static str| async move {
        let headers = [
            ("origin", origin),
            ("access-control-request-method", "PUT"),
            ("access-control-request-headers", "x-token"),
        ];
        web::request_with(at, "OPTIONS", "filters.test", "/cors/a", &headers).await
    };
    let (status, h, _) = preflight("https://a.b.apps.test").await?;
    assert_eq!(status, 204);
    assert!(
        !h.contains_key("x-echo-name"),
        "answered by the proxy: {h:?}"
    );
    assert_eq!(h["access-control-allow-origin"], "https://a.b.apps.test");
    assert_eq!(h["access-control-allow-methods"], "GET, PUT");
    assert_eq!(h["access-control-allow-headers"], "x-token");
    assert_eq!(h["access-control-allow-credentials"], "true");
    assert_eq!(h["access-control-max-age"], "600");
    let (status, h, _) = preflight("https://evil.test").await?;
    assert_eq!(status, 204);
    assert!(!h.contains_key("access-control-allow-origin"), "{h:?}");
    assert!(!h.contains_key("x-echo-name"), "{h:?}");
    let actual = |origin: &'static str| async move {
        web::request_with(at, "GET", "filters.test", "/cors/a", &[("origin", origin)]).await
    };
    let (status, h, _) = actual("https://app.test").await?;
    assert_eq!(status, 200);
    assert!(h.contains_key("x-echo-name"), "forwarded: {h:?}");
    assert_eq!(h["access-control-allow-origin"], "https://app.test");
    assert_eq!(h["access-control-expose-headers"], "x-echo-name");
    let (status, h, _) = actual("https://evil.test").await?;
    assert_eq!(status, 200);
    assert!(!h.contains_key("access-control-allow-origin"), "{h:?}");

    // Timeouts: a rule's limit on the whole request and on each attempt answer 504 while
    // the echo still waits; "0s" lifts even the proxy's own 1 s; without a rule's, the
    // proxy's applies.
    for (path, status) in [
        ("/whole?delay_ms=0", 200),
        ("/whole?delay_ms=800", 504),
        ("/attempt?delay_ms=0", 200),
        ("/attempt?delay_ms=800", 504),
        ("/patient?delay_ms=1500", 200),
        ("/x?delay_ms=1500", 504),
    ] {
        let (got, _, _) = ask("GET", path).await?;
        assert_eq!(got, status, "{path}");
    }
    Ok(())
}
