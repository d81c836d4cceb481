//! HTTPRoute matches and filters beyond the core, end to end: the real API server and
//! control plane, our proxy, the echo backends. The Gateway API suite checks the same
//! features (tests/tests/e2e/conformance.rs); these check what the suite leaves out: the
//! precedence between them, the query kept through a rewrite, and that a response header
//! rule never touches this hop's framing.

use std::net::SocketAddr;

use holdfast_tests::http as web;
use holdfast_tests::scenario::{Options, Scenario, gateway_cp_args};
use holdfast_tests::wait;
use serde_json::json;

use super::gateway_api::{class_and_gateway, create_all, gateway_address};

/// A scenario with one app (`app0`), one proxy started with `proxy_args`, and a control
/// plane giving Gateways addresses from `pool`.
async fn scenario(name: &str, pool: &str, proxy_args: &[&str]) -> anyhow::Result<Scenario> {
    Scenario::start(
        name,
        Options {
            ingresses: 1,
            proxies: 1,
            cp_args: gateway_cp_args(pool),
            proxy_args: proxy_args.iter().map(|a| (*a).to_owned()).collect(),
            ..Options::default()
        },
    )
    .await
}

/// Our GatewayClass, Gateway `gw` and HTTPRoute `route` for `hostname` with `rules`.
fn with_route(s: &Scenario, hostname: &str, rules: serde_json::Value) -> anyhow::Result<()> {
    let ns = &s.ns;
    create_all(
        &s.cluster,
        "gateway",
        class_and_gateway(
            ns,
            json!([
                { "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                  "metadata": { "name": "route", "namespace": ns },
                  "spec": { "parentRefs": [{ "name": "gw" }], "hostnames": [hostname],
                            "rules": rules } }
            ]),
        ),
    )
}

/// Port 80 of Gateway `gw`'s address.
async fn gateway_at(s: &Scenario) -> anyhow::Result<SocketAddr> {
    let address = gateway_address(&s.cluster, &s.ns, "gw").await?;
    Ok((address.parse::<std::net::IpAddr>()?, 80).into())
}

/// One HTTPRoute for `filters.test` with a rule per feature; each is asked what it serves
/// and each answer is checked by its status and the echo's report of the request it got
/// (method, host and path) or the redirect's Location, over HTTP/1.1 and then over h2c.
/// The proxy waits 1 s for a response head unless a rule says otherwise; the echo
/// answers after `delay_ms`.
#[tokio::test]
async fn method_and_query_matches_rewrites_redirect_paths_and_response_headers_are_served_as_written()
-> anyhow::Result<()> {
    let s = scenario(
        "gwfilters",
        "127.75.0.0/16",
        &["--upstream-response-timeout", "1s"],
    )
    .await?;
    s.cluster.install_gateway_api()?;
    let respond = |rule: &str| {
        json!({ "type": "ResponseHeaderModifier", "responseHeaderModifier": {
            "set": [{ "name": "X-Rule", "value": rule }] } })
    };
    with_route(
        &s,
        "filters.test",
        json!([
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
                      { "matches": [{ "path": { "type": "PathPrefix", "value": "/per-backend" } }],
                        "filters": [
                          { "type": "RequestHeaderModifier", "requestHeaderModifier": {
                              "set": [{ "name": "X-Rule-Req", "value": "r" }] } },
                          respond("per-backend")],
                        "backendRefs": [
                          { "name": "app0", "port": 80, "filters": [
                              { "type": "RequestHeaderModifier", "requestHeaderModifier": {
                                  "set": [{ "name": "X-First", "value": "1" }] } },
                              { "type": "ResponseHeaderModifier", "responseHeaderModifier": {
                                  "set": [{ "name": "X-From", "value": "first" }] } }] },
                          { "name": "app0", "port": 80, "filters": [
                              { "type": "RequestHeaderModifier", "requestHeaderModifier": {
                                  "set": [{ "name": "X-Second", "value": "2" }],
                                  "remove": ["X-Rule-Req"] } }] }
                        ] },
                      { "filters": [respond("default")],
                        "backendRefs": [{ "name": "app0", "port": 80 }] }
        ]),
    )?;
    let at = gateway_at(&s).await?;
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
    assert_eq!(h["vary"], "origin", "a cache keeps one answer per origin");
    let (status, h, _) = actual("https://evil.test").await?;
    assert_eq!(status, 200);
    assert!(!h.contains_key("access-control-allow-origin"), "{h:?}");
    assert_eq!(h["vary"], "origin", "{h:?}");

    // A backendRef's own header changes, after the rule's (requests) or before them
    // (responses): each of the two backends' requests carries its own header alone.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let (status, h, _) = ask("GET", "/per-backend").await?;
        assert_eq!(status, 200);
        assert_eq!(h["x-rule"], "per-backend");
        let names = h["x-echo-headers"].to_str()?.to_owned();
        let has = |n: &str| names.split(',').any(|x| x == n);
        let first = has("x-first");
        assert_ne!(first, has("x-second"), "one backend's change: {names}");
        assert_eq!(
            has("x-rule-req"),
            first,
            "the second removes the rule's: {names}"
        );
        assert_eq!(h.contains_key("x-from"), first, "{h:?}");
        seen.push(first);
    }
    seen.sort_unstable();
    assert_eq!(seen, [false, true], "both backends, by their equal weights");

    // The same rules over HTTP/2 (h2c, prior knowledge): one connection, several
    // features.
    let stream = tokio::net::TcpStream::connect(at).await?;
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await?;
    tokio::spawn(conn);
    let mut over_h2 = async |method: &str, path: &str, headers: &[(&str, &str)]| {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://filters.test{path}"));
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let resp = h2
            .send_request(req.body(http_body_util::Empty::<bytes::Bytes>::new())?)
            .await?;
        anyhow::ensure!(resp.version() == http::Version::HTTP_2, "{resp:?}");
        Ok::<_, anyhow::Error>((resp.status().as_u16(), resp.headers().clone()))
    };
    let (status, h) = over_h2("PATCH", "/x", &[]).await?;
    assert_eq!(
        (status, &h["x-rule"]),
        (200, &"patch".parse::<http::HeaderValue>()?)
    );
    let (_, h) = over_h2("GET", "/x?animal=whale", &[]).await?;
    assert_eq!(h["x-rule"], "whale");
    assert!(!h.contains_key("x-echo-headers"), "{h:?}");
    let (_, h) = over_h2("GET", "/rw/a?q=1", &[]).await?;
    assert_eq!(h["x-echo-path"], "/v2/a?q=1");
    assert_eq!(h["x-echo-host"], "up.test");
    let (status, h) = over_h2(
        "OPTIONS",
        "/cors/a",
        &[
            ("origin", "https://app.test"),
            ("access-control-request-method", "GET"),
        ],
    )
    .await?;
    assert_eq!(status, 204);
    assert_eq!(h["access-control-allow-origin"], "https://app.test");
    let (status, h) = over_h2("GET", "/old/page?q=3", &[]).await?;
    assert_eq!(
        (status, &h["location"]),
        (
            301,
            &"http://filters.test/new/page?q=3".parse::<http::HeaderValue>()?
        )
    );

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

/// The sum of the samples of `name` whose labels contain `needle`; an error when there is
/// none (a missing series is never read as zero).
fn series_sum(metrics: &str, name: &str, needle: &str) -> anyhow::Result<f64> {
    let samples: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    anyhow::ensure!(!samples.is_empty(), "no series {name} with {needle:?}");
    Ok(samples.iter().sum())
}

/// A rule's retry policy, end to end against one backend that fails on purpose: a
/// listed status is retried up to the attempts and the request then succeeds or gets the
/// last answer; an unlisted status and a POST are never retried; each retry is counted
/// on the route; and with `--retry-budget 0` the budget's 10 saved retries are spent and
/// the next retry is refused (counted), its request answered with what the backend said.
#[tokio::test]
async fn retries_send_again_only_safe_requests_up_to_the_attempts_and_within_the_budget()
-> anyhow::Result<()> {
    use holdfast_tests::objects::{create, endpoint_slice, service};
    let s = scenario("gwretry", "127.74.0.0/16", &["--retry-budget", "0"]).await?;
    // HTTPRoute's `retry` is in the experimental channel at the pinned version.
    s.cluster.install_gateway_api_experimental()?;
    let ns = &s.ns;
    // One endpoint, so the backend's count of a key's requests is every attempt's.
    create(&s.client, Some(ns), &service("one", 80, 8080)).await?;
    let first = s.backends[0].as_str();
    create(
        &s.client,
        Some(ns),
        &endpoint_slice("one-1", "one", 8080, &[first]),
    )
    .await?;
    with_route(
        &s,
        "retry.test",
        json!([
                      { "retry": { "codes": [500, 503], "attempts": 2, "backoff": "10ms" },
                        "backendRefs": [{ "name": "one", "port": 80 }] }
        ]),
    )?;
    let at = gateway_at(&s).await?;
    let ask = |method: &'static str, path: String| async move {
        web::request_with(at, method, "retry.test", &path, &[])
            .await
            .map(|(status, _, _)| status)
    };
    wait::until("the route served", wait::T, || async {
        Ok((ask("GET", "/".into()).await.ok() == Some(200)).then_some(()))
    })
    .await?;
    let retries = || async {
        let metrics = web::get(s.proxies[0].admin, "admin", "/metrics").await?.1;
        series_sum(&metrics, "holdfast_proxy_route_retries_total", "retry.test")
    };
    let over_budget = || async {
        let metrics = web::get(s.proxies[0].admin, "admin", "/metrics").await?.1;
        web::metric_value(&metrics, "holdfast_proxy_retries_over_budget_total")
    };

    // Fails twice, then succeeds: two retries.
    assert_eq!(
        ask("GET", "/?status=500&fail_first=2&key=a".into()).await?,
        200
    );
    assert_eq!(retries().await?, 2.0);
    // Fails more often than the attempts allow: the last answer, after two retries.
    assert_eq!(
        ask("GET", "/?status=503&fail_first=5&key=b".into()).await?,
        503
    );
    assert_eq!(retries().await?, 4.0);
    // A status the policy does not list, and a method that is not idempotent: once.
    assert_eq!(
        ask("GET", "/?status=502&fail_first=1&key=c".into()).await?,
        502
    );
    assert_eq!(
        ask("POST", "/?status=500&fail_first=1&key=d".into()).await?,
        500
    );
    assert_eq!(retries().await?, 4.0);
    assert_eq!(over_budget().await?, 0.0);
    // The budget saved 10 retries and earns none (--retry-budget 0): six more are
    // made, then the next is refused and its request gets the backend's 500.
    for key in ["e", "f", "g"] {
        let path = format!("/?status=500&fail_first=9&key={key}");
        assert_eq!(ask("GET", path).await?, 500);
    }
    assert_eq!(retries().await?, 10.0);
    assert_eq!(
        ask("GET", "/?status=500&fail_first=1&key=h".into()).await?,
        500
    );
    assert_eq!(retries().await?, 10.0);
    assert_eq!(over_budget().await?, 1.0);
    Ok(())
}

/// What the echo at `backend` (port 8080) recorded under `key` (`?seen_key=`): how many
/// requests, and the last one's path, Host and header names.
async fn seen(backend: &str, key: &str) -> anyhow::Result<(u32, String, String, String)> {
    let at: SocketAddr = (backend.parse::<std::net::IpAddr>()?, 8080).into();
    let (status, headers, _) = web::get_full(at, "echo", &format!("/?seen={key}")).await?;
    anyhow::ensure!(status == 200, "asking {backend} what it saw: {status}");
    let header = |name: &str| -> anyhow::Result<String> {
        let value = headers.get(name).map(|v| v.to_str().map(str::to_owned));
        value
            .ok_or_else(|| anyhow::anyhow!("the echo's answer has no {name}"))?
            .map_err(Into::into)
    };
    Ok((
        header("x-echo-seen")?.parse()?,
        header("x-echo-seen-path")?,
        header("x-echo-seen-host")?,
        header("x-echo-seen-headers")?,
    ))
}

/// RequestMirror end to end: every request on a rule with a mirror is copied to the
/// mirror's backend as it is forwarded (the rule's header changes and rewrites made, no
/// body framing); a fraction copies exactly that share; a request with a body is not
/// copied (counted); and a mirror that never answers neither delays nor fails the
/// requests it copies: each copy times out (`--mirror-timeout`) or, past
/// `--max-mirrors-in-flight`, is dropped, and every one is counted.
#[tokio::test]
async fn mirrors_get_copies_that_never_delay_or_fail_the_request_and_slow_ones_are_dropped_and_counted()
-> anyhow::Result<()> {
    use holdfast_tests::objects::{create, endpoint_slice, service};
    use std::time::Duration;
    let mut s = scenario(
        "gwmirror",
        "127.73.0.0/16",
        &["--mirror-timeout", "5s", "--max-mirrors-in-flight", "4"],
    )
    .await?;
    s.cluster.install_gateway_api()?;
    let ns = s.ns.clone();
    // A mirror that never answers in time: an echo that waits 30 s before every answer.
    let slow_ip = s.net.add_host()?;
    let echo = holdfast_tests::workspace_bin("holdfast-echo");
    let slow_at = SocketAddr::new(slow_ip, 8080).to_string();
    s.net.spawn(
        &echo,
        &[
            "--listen",
            &slow_at,
            "--name",
            "slow",
            "--delay-ms",
            "30000",
        ],
    )?;
    let (main, copy) = (s.backends[0].clone(), s.backends[1].clone());
    let slow = slow_ip.to_string();
    for (name, address) in [("main", &main), ("copy", &copy), ("slow", &slow)] {
        create(&s.client, Some(&ns), &service(name, 80, 8080)).await?;
        let slice = endpoint_slice(&format!("{name}-1"), name, 8080, &[address.as_str()]);
        create(&s.client, Some(&ns), &slice).await?;
    }
    let mirror = |to: &str, share: serde_json::Value| {
        let mut m = json!({ "backendRef": { "name": to, "port": 80 } });
        for (k, v) in share.as_object().into_iter().flatten() {
            m[k] = v.clone();
        }
        json!({ "type": "RequestMirror", "requestMirror": m })
    };
    let main_ref = json!([{ "name": "main", "port": 80 }]);
    with_route(
        &s,
        "mirror.test",
        json!([
            { "matches": [{ "path": { "value": "/all" } }],
              "filters": [
                  { "type": "RequestHeaderModifier",
                    "requestHeaderModifier": { "set": [{ "name": "x-mirror-set", "value": "1" }] } },
                  { "type": "URLRewrite",
                    "urlRewrite": { "hostname": "rewritten.test",
                                    "path": { "type": "ReplacePrefixMatch", "replacePrefixMatch": "/rewritten" } } },
                  mirror("copy", json!({}))],
              "backendRefs": main_ref },
            { "matches": [{ "path": { "value": "/half" } }],
              "filters": [mirror("copy", json!({ "fraction": { "numerator": 1, "denominator": 2 } }))],
              "backendRefs": main_ref },
            { "matches": [{ "path": { "value": "/slow" } }],
              "filters": [mirror("slow", json!({}))],
              "backendRefs": main_ref }
        ]),
    )?;
    let at = gateway_at(&s).await?;
    let ask = |path: String| async move {
        // A bodyless request that says so: its framing must not reach the copy.
        web::request_with(at, "GET", "mirror.test", &path, &[("content-length", "0")])
            .await
            .map(|(status, headers, _)| (status, headers))
    };
    let admin = s.proxies[0].admin;
    let mirrored = |outcome: &'static str| async move {
        let metrics = web::get(admin, "admin", "/metrics").await?.1;
        series_sum(
            &metrics,
            "holdfast_proxy_mirror_requests_total",
            &format!("outcome=\"{outcome}\""),
        )
    };
    let text = |e: anyhow::Error| format!("{e:#}");
    // Served, with the mirror's endpoint known: a copy reaches it.
    wait::until("the route and its mirror served", wait::T, || async {
        let served = ask("/all?seen_key=probe".into()).await.map_err(text)?.0 == 200;
        Ok((served && seen(&copy, "probe").await.map_err(text)?.0 > 0).then_some(()))
    })
    .await?;
    // Every copy the mirror got is counted as answered, and only those.
    let all_counted = |keys: &'static [&'static str]| {
        let copy = copy.clone();
        async move {
            let mut reached = 0.0;
            for key in keys {
                reached += f64::from(seen(&copy, key).await.map_err(text)?.0);
            }
            let counted = mirrored("answered").await.map_err(text)?;
            Ok((counted == reached).then_some(()))
        }
    };

    // Every request is copied, as forwarded: rewritten, with the rule's header, and
    // without the client's framing; the request itself goes to `main` only.
    for _ in 0..10 {
        let (status, headers) = ask("/all/x?seen_key=all".into()).await?;
        assert_eq!(status, 200);
        assert_eq!(headers["x-echo-name"], "echo-a");
    }
    wait::until("10 copies got", wait::T, || async {
        Ok((seen(&copy, "all").await.map_err(text)?.0 >= 10).then_some(()))
    })
    .await?;
    wait::until("every copy counted", wait::T, || {
        all_counted(&["probe", "all"])
    })
    .await?;
    let (count, path, host, names) = seen(&copy, "all").await?;
    assert_eq!(count, 10, "each request copied once");
    assert_eq!(seen(&main, "all").await?.0, 10, "and forwarded once");
    assert_eq!(path, "/rewritten/x?seen_key=all");
    assert_eq!(host, "rewritten.test");
    let names: Vec<&str> = names.split(',').collect();
    assert!(names.contains(&"x-mirror-set"), "{names:?}");
    assert!(names.contains(&"x-forwarded-for"), "{names:?}");
    assert!(!names.contains(&"content-length"), "{names:?}");

    // A fraction of 1/2: exactly every other request.
    for _ in 0..20 {
        assert_eq!(ask("/half?seen_key=half".into()).await?.0, 200);
    }
    wait::until("10 copies of 20 got", wait::T, || async {
        Ok((seen(&copy, "half").await.map_err(text)?.0 >= 10).then_some(()))
    })
    .await?;
    wait::until("every copy counted", wait::T, || {
        all_counted(&["probe", "all", "half"])
    })
    .await?;
    assert_eq!(seen(&copy, "half").await?.0, 10);
    assert_eq!(seen(&main, "half").await?.0, 20);

    // A request with a body is forwarded, not copied (counted at once, when routed).
    let body_status = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(at).await?;
        c.write_all(
            b"POST /all?seen_key=body HTTP/1.1\r\nHost: mirror.test\r\nContent-Length: 5\r\n\
              Connection: close\r\n\r\nhello",
        )
        .await?;
        let mut answer = Vec::new();
        tokio::time::timeout(wait::T, c.read_to_end(&mut answer)).await??;
        String::from_utf8_lossy(&answer)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    assert!(body_status.starts_with("HTTP/1.1 200"), "{body_status}");
    assert_eq!(mirrored("has_body").await?, 1.0);
    assert_eq!(seen(&main, "body").await?.0, 1);
    assert_eq!(
        seen(&copy, "body").await?.0,
        0,
        "a request with a body is not copied"
    );

    // A mirror that never answers: 8 requests at once, each answered by `main` well
    // before the copy's 5 s timeout; 4 copies go (and time out), the rest find no place.
    let started = std::time::Instant::now();
    let answers =
        futures::future::join_all((0..8).map(|_| ask("/slow?seen_key=slow".into()))).await;
    let took = started.elapsed();
    for answer in answers {
        let (status, headers) = answer?;
        assert_eq!(status, 200);
        assert_eq!(headers["x-echo-name"], "echo-a");
    }
    assert!(
        took < Duration::from_secs(3),
        "the requests waited for their mirror: {took:?}"
    );
    wait::until("every slow copy ended and was counted", wait::T, || async {
        let timed_out = mirrored("timed_out").await.map_err(text)?;
        let dropped = mirrored("dropped").await.map_err(text)?;
        Ok((timed_out + dropped == 8.0).then_some((timed_out, dropped)))
    })
    .await?;
    // The slow mirror answered none: what was answered is still the copy backend's.
    all_counted(&["probe", "all", "half"])
        .await
        .map_err(|e| anyhow::anyhow!(e))?
        .ok_or_else(|| anyhow::anyhow!("a copy to the slow mirror was counted as answered"))?;
    assert_eq!(seen(&copy, "half").await?.0, 10, "still exactly half");
    Ok(())
}
