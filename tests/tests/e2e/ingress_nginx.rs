//! Ingresses carrying ingress-nginx annotations, end to end: the real API server and
//! control plane, our proxy, the echo backends. Each served annotation is checked by what
//! a client gets (status, Location, what the backend was sent); an annotation holdfast
//! does not serve, and a snippet, is a Warning Event on its Ingress while the rest of the
//! Ingress is served. docs/ingress-nginx.md cites this file for each annotation.

use holdfast_tests::http as web;
use holdfast_tests::objects::create;
use holdfast_tests::scenario::{Options, Scenario};
use holdfast_tests::wait;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use serde_json::json;

/// The scenario's app Service, which the first test's Ingresses route to.
const SVC: &str = "app0";

/// Ingress `name` of the scenario's class routing `host`'s `paths` (ImplementationSpecific,
/// as ingress-nginx users write them: a prefix, or with `use-regex` a regular expression)
/// to `svc`:80,
/// with `nginx.ingress.kubernetes.io/` `annotations`.
fn annotated(
    s: &Scenario,
    name: &str,
    (host, paths, svc): (&str, &[&str], &str),
    annotations: &[(&str, &str)],
) -> anyhow::Result<Ingress> {
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), json!(v)))
        .collect();
    let paths: Vec<_> = paths
        .iter()
        .map(|p| {
            json!({ "path": p, "pathType": "ImplementationSpecific",
                    "backend": { "service": { "name": svc, "port": { "number": 80 } } } })
        })
        .collect();
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": { "ingressClassName": s.class,
                  "rules": [{ "host": host, "http": { "paths": paths } }] }
    }))?)
}

/// A scenario with one app (`app0`) and one proxy.
async fn one_proxy(name: &str) -> anyhow::Result<Scenario> {
    let options = Options {
        ingresses: 1,
        proxies: 1,
        ..Options::default()
    };
    Scenario::start(name, options).await
}

/// One Ingress per annotation group, each for a host of its own (one Ingress adds app-root
/// and a Host rewrite, another on the same host forces https on its path). Each is asked
/// over plain HTTP/1.1 and answered as ingress-nginx documents it.
#[tokio::test]
async fn ingress_nginx_annotations_are_served_as_ingress_nginx_documents_them() -> anyhow::Result<()>
{
    let s = one_proxy("nginxann").await?;
    let ns = s.ns.clone();
    let host = |h: &str| format!("{h}.{ns}.test");
    let (perm, temp, app, cors) = (host("perm"), host("temp"), host("app"), host("cors"));
    let (rewrite, other) = (host("rewrite"), host("other"));
    let (allowed, refused) = (host("allowed"), host("refused"));
    let (regex, cors2) = (host("regex"), host("cors2"));
    let (small, slow, limited) = (host("small"), host("slow"), host("limited"));
    for ing in [
        annotated(
            &s,
            "perm",
            (&perm, &["/"], SVC),
            &[
                ("permanent-redirect", "https://example.org/new"),
                ("permanent-redirect-code", "308"),
            ],
        )?,
        annotated(
            &s,
            "temp",
            (&temp, &["/"], SVC),
            &[
                ("temporal-redirect", "http://example.org/t?x=1"),
                ("temporal-redirect-code", "307"),
            ],
        )?,
        annotated(
            &s,
            "app",
            (&app, &["/"], SVC),
            &[
                ("app-root", "/app1"),
                ("upstream-vhost", "internal.example"),
                ("x-forwarded-prefix", "/shop"),
            ],
        )?,
        annotated(
            &s,
            "secure",
            (&app, &["/secure"], SVC),
            &[("force-ssl-redirect", "true")],
        )?,
        annotated(
            &s,
            "cors",
            (&cors, &["/"], SVC),
            &[
                ("enable-cors", "true"),
                ("cors-allow-origin", "https://site.test"),
                ("cors-max-age", "60"),
                (
                    "configuration-snippet",
                    "more_set_headers \"X-Injected: 1\";",
                ),
                ("server-snippet", "location /injected { return 200; }"),
                ("limit-rpm", "5"),
            ],
        )?,
        // ingress-nginx's own rewrite example, and another Ingress of the host.
        annotated(
            &s,
            "rewrite",
            (&rewrite, &["/something(/|$)(.*)"], SVC),
            &[("rewrite-target", "/$2")],
        )?,
        annotated(&s, "other", (&rewrite, &["/api"], SVC), &[])?,
        // The test's client is 127.0.0.1, seen directly (no trusted balancer).
        annotated(
            &s,
            "allowed",
            (&allowed, &["/"], SVC),
            &[
                ("whitelist-source-range", "10.0.0.0/8, 127.0.0.1"),
                ("denylist-source-range", "127.0.0.2/32"),
            ],
        )?,
        annotated(
            &s,
            "refused",
            (&refused, &["/in", "/out"], SVC),
            &[("whitelist-source-range", "10.0.0.0/8")],
        )?,
        annotated(
            &s,
            "regex",
            (&regex, &["/v[0-9]+/items"], SVC),
            &[("use-regex", "true")],
        )?,
        annotated(
            &s,
            "cors2",
            (&cors2, &["/"], SVC),
            &[
                ("enable-cors", "true"),
                ("cors-allow-origin", "https://*.site.test"),
                ("cors-allow-headers", "X-Token"),
                ("cors-expose-headers", "X-Total"),
                ("cors-allow-credentials", "false"),
            ],
        )?,
        annotated(
            &s,
            "small",
            (&small, &["/"], SVC),
            &[("proxy-body-size", "1k")],
        )?,
        annotated(
            &s,
            "slow",
            (&slow, &["/"], SVC),
            &[("proxy-read-timeout", "1")],
        )?,
        annotated(
            &s,
            "limited",
            (&limited, &["/"], SVC),
            &[("limit-rps", "1"), ("limit-burst-multiplier", "3")],
        )?,
        annotated(&s, "plain", (&other, &["/api"], SVC), &[])?,
    ] {
        create(&s.client, Some(&ns), &ing).await?;
    }
    let at = s.proxy_addrs()[0];
    let ask = |host: String, path: &'static str, headers: Vec<(&'static str, &'static str)>| async move {
        web::request_with(at, "GET", &host, path, &headers).await
    };
    // Served once the last Ingress created is (one snapshot may hold them all, or a few
    // in order).
    wait::until("the annotated Ingresses served", wait::T, || async {
        Ok(ask(other.clone(), "/api", vec![])
            .await
            .ok()
            .filter(|(status, _, _)| *status == 200)
            .map(|_| ()))
    })
    .await?;

    // permanent-redirect with its code; nothing of the request is kept.
    let (status, h, _) = ask(perm.clone(), "/a/b?q=1", vec![]).await?;
    assert_eq!(
        (status, &h["location"]),
        (308, &"https://example.org/new".parse()?)
    );
    // temporal-redirect with its code.
    let (status, h, _) = ask(temp.clone(), "/x", vec![]).await?;
    assert_eq!(
        (status, &h["location"]),
        (307, &"http://example.org/t?x=1".parse()?)
    );

    // app-root: `/` alone is redirected (302), on the Host asked for.
    let (status, h, _) = ask(app.clone(), "/", vec![]).await?;
    assert_eq!(status, 302);
    assert_eq!(h["location"], format!("http://{app}/app1").as_str());
    let (_, h, _) = ask(app.clone(), "/?from=old", vec![]).await?;
    assert_eq!(
        h["location"],
        format!("http://{app}/app1").as_str(),
        "nothing of the request is added, as nginx's return"
    );
    // upstream-vhost and x-forwarded-prefix: what the backend is sent.
    let (status, h, _) = ask(app.clone(), "/app1/page", vec![]).await?;
    assert_eq!(status, 200);
    assert_eq!(h["x-echo-host"], "internal.example");
    assert_eq!(h["x-echo-x-forwarded-prefix"], "/shop");
    assert_eq!(h["x-echo-x-forwarded-host"], app.as_str());
    // force-ssl-redirect: that Ingress's path goes to https (308) without a certificate
    // (the other Ingress's paths on the host do not).
    let (status, h, _) = ask(app.clone(), "/secure/x?y=1", vec![]).await?;
    assert_eq!(status, 308);
    assert_eq!(
        h["location"],
        format!("https://{app}/secure/x?y=1").as_str()
    );

    // enable-cors: a preflight from the allowed origin is answered here; another origin
    // gets no allowance; an actual request goes to the backend with the allowance.
    let (status, h, _) = web::request_with(
        at,
        "OPTIONS",
        &cors,
        "/api",
        &[
            ("origin", "https://site.test"),
            ("access-control-request-method", "PUT"),
        ],
    )
    .await?;
    assert_eq!(status, 204);
    assert!(!h.contains_key("x-echo-name"), "answered here: {h:?}");
    assert_eq!(h["access-control-allow-origin"], "https://site.test");
    assert_eq!(
        h["access-control-allow-methods"],
        "GET, PUT, POST, DELETE, PATCH, OPTIONS"
    );
    assert_eq!(h["access-control-allow-credentials"], "true");
    assert_eq!(h["access-control-max-age"], "60");
    let (status, h, _) = ask(cors.clone(), "/api", vec![("origin", "https://evil.test")]).await?;
    assert_eq!(status, 200);
    assert!(!h.contains_key("access-control-allow-origin"), "{h:?}");
    let (status, h, _) = ask(cors.clone(), "/api", vec![("origin", "https://site.test")]).await?;
    assert_eq!(status, 200);
    assert_eq!(h["access-control-allow-origin"], "https://site.test");
    // The snippet was never applied.
    assert!(!h.contains_key("x-injected"), "{h:?}");
    // The cors-* values: a wildcard origin, the headers allowed and exposed, no
    // credentials.
    let (status, h, _) = web::request_with(
        at,
        "OPTIONS",
        &cors2,
        "/",
        &[
            ("origin", "https://a.site.test"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "x-token"),
        ],
    )
    .await?;
    assert_eq!(status, 204);
    assert_eq!(h["access-control-allow-origin"], "https://a.site.test");
    assert!(
        h["access-control-allow-headers"]
            .to_str()?
            .eq_ignore_ascii_case("x-token"),
        "{h:?}"
    );
    assert!(!h.contains_key("access-control-allow-credentials"), "{h:?}");
    let (_, h, _) = ask(cors2.clone(), "/", vec![("origin", "https://a.site.test")]).await?;
    assert!(
        h["access-control-expose-headers"]
            .to_str()?
            .eq_ignore_ascii_case("x-total"),
        "{h:?}"
    );

    // use-regex alone: the path is a regular expression, case-insensitive, from the start,
    // and the path sent upstream is the request's.
    let (status, h, _) = ask(regex.clone(), "/V2/items/9", vec![]).await?;
    assert_eq!((status, h["x-echo-path"].to_str()?), (200, "/V2/items/9"));
    let (status, _, _) = ask(regex.clone(), "/vx/items", vec![]).await?;
    assert_eq!(status, 404);

    // rewrite-target: the path's groups, the query kept; case-insensitive, from the start.
    for (path, upstream) in [
        ("/something", "/"),
        ("/something/", "/"),
        ("/something/new?q=1", "/new?q=1"),
        ("/SOMETHING/a/b", "/a/b"),
    ] {
        let (status, h, _) = ask(rewrite.clone(), path, vec![]).await?;
        assert_eq!(status, 200, "{path}");
        assert_eq!(h["x-echo-path"], upstream, "{path}");
    }
    // use-regex is the host's, as in ingress-nginx: another Ingress's `/api` there matches
    // from the start (`/apiary`) and in any case; on a host without it, element-wise.
    let (status, h, _) = ask(rewrite.clone(), "/APIary", vec![]).await?;
    assert_eq!((status, h["x-echo-path"].to_str()?), (200, "/APIary"));
    let (status, _, _) = ask(other.clone(), "/apiary", vec![]).await?;
    assert_eq!(status, 404);

    // Source ranges: the client's own address decides; a forwarded one from a peer that is
    // not a trusted balancer is not read.
    let (status, _, _) = ask(allowed.clone(), "/x", vec![]).await?;
    assert_eq!(status, 200);
    let (status, h, body) = ask(
        refused.clone(),
        "/in",
        vec![("x-forwarded-for", "10.1.1.1")],
    )
    .await?;
    assert_eq!(status, 403);
    assert!(!h.contains_key("x-echo-name"), "refused here: {h:?}");
    assert!(
        !body.contains("127.0.0.1"),
        "the page tells the status only: {body}"
    );

    // proxy-body-size: 1 KiB here, by Content-Length at once or as a chunked body passes
    // (413); another host keeps the proxy's limit.
    let post = |host: &str, headers: &str, body: &str| {
        format!("POST / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}\r\n{body}")
    };
    let raw =
        |request: String| async move { super::proxy_fed_by_test::raw_head(at, &request).await };
    let fits = raw(post(&small, "Content-Length: 1024\r\n", &"b".repeat(1024))).await?;
    assert!(fits.starts_with("http/1.1 200"), "{fits}");
    let over = raw(post(&small, "Content-Length: 1025\r\n", "")).await?;
    assert!(over.starts_with("http/1.1 413"), "{over}");
    let chunk = format!("258\r\n{}\r\n", "c".repeat(600));
    let chunked = raw(post(
        &small,
        "Transfer-Encoding: chunked\r\n",
        &format!("{chunk}{chunk}0\r\n\r\n"),
    ))
    .await?;
    assert!(chunked.starts_with("http/1.1 413"), "{chunked}");
    let elsewhere = raw(format!(
        "POST /api HTTP/1.1\r\nHost: {other}\r\nConnection: close\r\nContent-Length: 2048\r\n\r\n{}",
        "b".repeat(2048)
    ))
    .await?;
    assert!(elsewhere.starts_with("http/1.1 200"), "{elsewhere}");

    // proxy-read-timeout: the wait for the response head is the Ingress's (1 s, then 504;
    // the proxy's own is 30 s).
    let (status, _, _) = ask(slow.clone(), "/x?delay_ms=100", vec![]).await?;
    assert_eq!(status, 200);
    let (status, _, _) = ask(slow.clone(), "/x?delay_ms=2500", vec![]).await?;
    assert_eq!(status, 504);
    let (status, _, _) = ask(other.clone(), "/api?delay_ms=1500", vec![]).await?;
    assert_eq!(status, 200, "another host keeps the proxy's");

    // limit-rps: 1 a second with a burst of 3, per client address: of 8 requests at once,
    // 4 (nginx's nodelay: the burst and one; 5 if a second has passed meanwhile) go
    // through and the rest get 503.
    let mut through = 0;
    for _ in 0..8 {
        match ask(limited.clone(), "/", vec![]).await?.0 {
            200 => through += 1,
            503 => {}
            other => anyhow::bail!("limit-rps answered {other}"),
        }
    }
    assert!((4..=5).contains(&through), "{through} of 8 went through");

    // The unserved annotation and the snippet: Warning Events on their Ingress, whose
    // rest is served (above).
    let events: Api<Event> = Api::namespaced(s.client.clone(), &ns);
    wait::until("the annotation Events", wait::T, || {
        let events = events.clone();
        async move {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let on_cors = |reason: &str, names: &str| {
                list.items.iter().any(|e| {
                    e.involved_object.name.as_deref() == Some("cors")
                        && e.type_.as_deref() == Some("Warning")
                        && e.reason.as_deref() == Some(reason)
                        && e.message.as_deref().is_some_and(|m| m.contains(names))
                })
            };
            Ok((on_cors("SnippetRefused", "configuration-snippet")
                && on_cors("SnippetRefused", "server-snippet")
                && on_cors("UnservedAnnotation", "limit-rpm"))
            .then_some(()))
        }
    })
    .await?;
    Ok(())
}

/// A canary Ingress (`canary: "true"`) for the same host and path as its main Ingress:
/// `canary-by-header` sends `always` to the canary and `never` to the main backend, and
/// `canary-weight` gives the canary its share of the rest. Each Service has one echo of
/// its own, so the echo's name says which backend answered.
#[tokio::test]
async fn a_canary_ingress_takes_the_requests_its_header_and_weight_give_it() -> anyhow::Result<()> {
    use holdfast_tests::objects::{endpoint_slice, service};
    let s = one_proxy("nginxcanary").await?;
    let ns = s.ns.clone();
    for (svc, address) in [("main", &s.backends[0]), ("beta", &s.backends[1])] {
        create(&s.client, Some(&ns), &service(svc, 80, 8080)).await?;
        create(
            &s.client,
            Some(&ns),
            &endpoint_slice(&format!("{svc}-1"), svc, 8080, &[address]),
        )
        .await?;
    }
    let host = format!("canary.{ns}.test");
    let at = s.proxy_addrs()[0];
    let ask_on = |host: String, headers: Vec<(&'static str, &'static str)>| async move {
        let (status, h, _) = web::request_with(at, "GET", &host, "/", &headers).await?;
        anyhow::ensure!(status == 200, "status {status}");
        Ok::<_, anyhow::Error>(h["x-echo-name"].to_str()?.to_owned())
    };
    let ask = |headers: Vec<(&'static str, &'static str)>| ask_on(host.clone(), headers);
    let main = annotated(&s, "main", (&host, &["/"], "main"), &[])?;
    create(&s.client, Some(&ns), &main).await?;
    // Served by the main backend alone first.
    let main_echo = wait::until("the main Ingress served", wait::T, || async {
        Ok(ask(vec![]).await.ok())
    })
    .await?;
    let canary = annotated(
        &s,
        "canary",
        (&host, &["/"], "beta"),
        &[
            ("canary", "true"),
            ("canary-by-header", "X-Canary"),
            ("canary-by-cookie", "canary_c"),
            ("canary-weight", "30"),
        ],
    )?;
    create(&s.client, Some(&ns), &canary).await?;
    let canary_echo = wait::until("the canary joined", wait::T, || async {
        Ok(ask(vec![("x-canary", "always")])
            .await
            .ok()
            .filter(|name| *name != main_echo))
    })
    .await?;
    for _ in 0..5 {
        assert_eq!(ask(vec![("x-canary", "always")]).await?, canary_echo);
        assert_eq!(ask(vec![("x-canary", "never")]).await?, main_echo);
        // canary-by-cookie, after the header rule.
        assert_eq!(
            ask(vec![("cookie", "a=1; canary_c=always")]).await?,
            canary_echo
        );
        assert_eq!(ask(vec![("cookie", "canary_c=never")]).await?, main_echo);
        assert_eq!(
            ask(vec![("x-canary", "never"), ("cookie", "canary_c=always")]).await?,
            main_echo,
            "the header decides first"
        );
    }
    // The rest by weight: 30 of every 100 (exactly, while the route is not rebuilt).
    let mut to_canary = 0;
    for _ in 0..100 {
        if ask(vec![("x-canary", "maybe")]).await? == canary_echo {
            to_canary += 1;
        }
    }
    assert!(
        (20..=40).contains(&to_canary),
        "{to_canary} of 100 to the canary, for a weight of 30"
    );

    // canary-by-header-value (that value alone) and canary-weight-total, on another host.
    let host2 = format!("canary2.{ns}.test");
    create(
        &s.client,
        Some(&ns),
        &annotated(&s, "main2", (&host2, &["/"], "main"), &[])?,
    )
    .await?;
    let canary2 = annotated(
        &s,
        "canary2",
        (&host2, &["/"], "beta"),
        &[
            ("canary", "true"),
            ("canary-by-header", "X-Env"),
            ("canary-by-header-value", "beta"),
            ("canary-weight", "1"),
            ("canary-weight-total", "4"),
        ],
    )?;
    create(&s.client, Some(&ns), &canary2).await?;
    wait::until("the second canary joined", wait::T, || async {
        Ok(ask_on(host2.clone(), vec![("x-env", "beta")])
            .await
            .ok()
            .filter(|name| *name == canary_echo))
    })
    .await?;
    let mut to_canary = 0;
    for _ in 0..40 {
        assert_eq!(
            ask_on(host2.clone(), vec![("x-env", "beta")]).await?,
            canary_echo
        );
        // Another value (and "always") is left to the weight: 1 of every 4.
        if ask_on(host2.clone(), vec![("x-env", "always")]).await? == canary_echo {
            to_canary += 1;
        }
    }
    assert!(
        (5..=15).contains(&to_canary),
        "{to_canary} of 40 to the canary, for a weight of 1 of 4"
    );

    // canary-by-header-pattern: a value matching the expression goes to the canary;
    // `always` is not special then.
    let host3 = format!("canary3.{ns}.test");
    create(
        &s.client,
        Some(&ns),
        &annotated(&s, "main3", (&host3, &["/"], "main"), &[])?,
    )
    .await?;
    let canary3 = annotated(
        &s,
        "canary3",
        (&host3, &["/"], "beta"),
        &[
            ("canary", "true"),
            ("canary-by-header", "X-Pat"),
            ("canary-by-header-pattern", "^be(ta|tter)$"),
        ],
    )?;
    create(&s.client, Some(&ns), &canary3).await?;
    wait::until("the third canary joined", wait::T, || async {
        Ok(ask_on(host3.clone(), vec![("x-pat", "better")])
            .await
            .ok()
            .filter(|name| *name == canary_echo))
    })
    .await?;
    assert_eq!(
        ask_on(host3.clone(), vec![("x-pat", "beta")]).await?,
        canary_echo
    );
    assert_eq!(
        ask_on(host3.clone(), vec![("x-pat", "always")]).await?,
        main_echo
    );
    assert_eq!(ask_on(host3.clone(), vec![]).await?, main_echo);
    Ok(())
}

/// The migration example of docs/reference.md, read from it and created as it is written (the
/// IngressClass name aside: the test's own), is served as its comments say.
#[tokio::test]
async fn the_documented_migration_example_is_served_unchanged() -> anyhow::Result<()> {
    use holdfast_tests::objects::{endpoint_slice, service};
    let s = one_proxy("nginxreadme").await?;
    let ns = s.ns.clone();
    let readme = std::fs::read_to_string(holdfast_tests::repo_root().join("docs/reference.md"))?;
    let after = readme
        .split_once("**A migration example.**")
        .ok_or_else(|| anyhow::anyhow!("docs/reference.md has no migration example"))?
        .1;
    let yaml = after
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .ok_or_else(|| anyhow::anyhow!("the migration example has no YAML block"))?
        .0;
    let mut shop: Ingress = serde_yaml::from_str(yaml)?;
    let spec = shop.spec.as_mut().expect("a spec");
    assert_eq!(spec.ingress_class_name.as_deref(), Some("nginx"));
    spec.ingress_class_name = Some(s.class.clone());
    create(&s.client, Some(&ns), &service("shop", 80, 8080)).await?;
    create(
        &s.client,
        Some(&ns),
        &endpoint_slice("shop-1", "shop", 8080, &[&s.backends[0]]),
    )
    .await?;
    create(&s.client, Some(&ns), &shop).await?;
    let at = s.proxy_addrs()[0];
    let ask = |method: &'static str,
               path: &'static str,
               headers: &'static [(&'static str, &'static str)]| async move {
        web::request_with(at, method, "shop.example", path, headers).await
    };
    wait::until("the example served", wait::T, || async {
        Ok(ask("GET", "/shop/cart", &[])
            .await
            .ok()
            .filter(|(status, _, _)| *status == 200)
            .map(|_| ()))
    })
    .await?;
    let (_, h, _) = ask("GET", "/shop/cart?x=1", &[]).await?;
    assert_eq!(h["x-echo-path"], "/cart?x=1");
    assert_eq!(h["x-echo-x-forwarded-prefix"], "/shop");
    let (status, h, _) = ask("GET", "/", &[]).await?;
    assert_eq!(status, 302);
    assert_eq!(h["location"], "http://shop.example/shop/home");
    let (status, h, _) = ask(
        "OPTIONS",
        "/shop/cart",
        &[
            ("origin", "https://site.example"),
            ("access-control-request-method", "POST"),
        ],
    )
    .await?;
    assert_eq!(status, 204);
    assert_eq!(h["access-control-allow-origin"], "https://site.example");
    Ok(())
}

/// `backend-protocol: GRPC` (and `H2C`): the Ingress's backend is reached over HTTP/2 with
/// prior knowledge (gRPC without TLS), while another Ingress to the same Service port
/// stays on HTTP/1.1. Requests that come in over HTTP/2 (as gRPC's do) reach it on both
/// engines; an HTTP/1.1 request reaches it through the hyper engine, and the native
/// engine answers it 502.
#[tokio::test]
async fn backend_protocol_grpc_reaches_the_backend_over_h2c() -> anyhow::Result<()> {
    let s = one_proxy("nginxh2c").await?;
    let ns = s.ns.clone();
    let (grpc, plain) = (format!("grpc.{ns}.test"), format!("plain.{ns}.test"));
    let h2c = format!("h2c.{ns}.test");
    for ing in [
        annotated(
            &s,
            "grpc",
            (&grpc, &["/"], SVC),
            &[("backend-protocol", "GRPC")],
        )?,
        annotated(
            &s,
            "h2c",
            (&h2c, &["/"], SVC),
            &[("backend-protocol", "H2C")],
        )?,
        annotated(&s, "plain", (&plain, &["/"], SVC), &[])?,
    ] {
        create(&s.client, Some(&ns), &ing).await?;
    }
    let at = s.proxy_addrs()[0];
    // Over h2c (prior knowledge) to the proxy: the version the backend was asked in.
    let version_behind = |host: String| async move {
        let (status, headers) = grpc_call(at, &host).await?;
        let version = headers
            .get("x-echo-version")
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        anyhow::Ok((status, version))
    };
    let served = wait::until("both Ingresses served", wait::T, || async {
        let grpc = version_behind(grpc.clone())
            .await
            .map_err(|e| e.to_string())?;
        let plain = version_behind(plain.clone())
            .await
            .map_err(|e| e.to_string())?;
        let h2c = version_behind(h2c.clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok((grpc.0 == 200 && plain.0 == 200 && h2c.0 == 200).then_some((grpc.1, plain.1, h2c.1)))
    })
    .await?;
    let http2 = Some("HTTP/2.0".to_owned());
    assert_eq!(
        served,
        (http2.clone(), Some("HTTP/1.1".to_owned()), http2),
        "(GRPC, plain, H2C)"
    );

    let (status, h, _) = web::request_with(at, "GET", &grpc, "/", &[]).await?;
    if std::env::var("HOLDFAST_H1_ENGINE").is_ok_and(|e| e == "hyper") {
        assert_eq!((status, h["x-echo-version"].to_str()?), (200, "HTTP/2.0"));
    } else {
        assert_eq!(status, 502, "{h:?}");
    }
    Ok(())
}

/// `backend-protocol: HTTPS` and `GRPCS` reach a backend that speaks only TLS: over
/// HTTP/1.1 and HTTP/2 (ALPN `h2`), with no SNI unless `proxy-ssl-server-name: "on"` sends
/// `proxy-ssl-name`, and keep-alive reuses the handshake. The same backend without the
/// annotation gets cleartext it cannot read (502). `proxy-ssl-verify: "on"` checks the
/// certificate against `proxy-ssl-secret`'s `ca.crt` for `proxy-ssl-name` (a certificate
/// for another name: 502), and without a Secret answers 500: never unverified.
#[tokio::test]
async fn backend_protocol_https_and_grpcs_reach_the_backend_over_tls_only_as_asked()
-> anyhow::Result<()> {
    use holdfast_tests::objects::{endpoint_slice, service};
    let mut s = one_proxy("nginxtls").await?;
    let ns = s.ns.clone();
    let dir = tempfile::tempdir()?;
    let ca = holdfast_tests::tls::TestCa::new("nginxtls backend CA");
    let (crt, key) = ca.server(&["secure.internal"]).write(dir.path(), "echo")?;
    let ip = s.net.add_host()?;
    let listen = format!("{ip}:8443");
    let echo = holdfast_tests::workspace_bin("holdfast-echo");
    let (crt, key) = (crt.to_string_lossy(), key.to_string_lossy());
    s.net.spawn(
        &echo,
        &[
            "--listen",
            &listen,
            "--name",
            "secure",
            "--tls-cert",
            &crt,
            "--tls-key",
            &key,
        ],
    )?;
    create(&s.client, Some(&ns), &service("secure", 80, 8443)).await?;
    let slice = endpoint_slice("secure-1", "secure", 8443, &[&ip.to_string()]);
    create(&s.client, Some(&ns), &slice).await?;
    let host = |h: &str| format!("{h}.{ns}.test");
    let (https, sni, grpcs) = (host("https"), host("sni"), host("grpcs"));
    let (plain, verify) = (host("plain"), host("verify"));
    let (checked, mismatched) = (host("checked"), host("mismatched"));
    // The Secret proxy-ssl-secret names: a kubernetes.io/tls Secret with the backend's CA
    // in ca.crt.
    let client = ca.client(&["proxy.internal"], &[]);
    let mut secret =
        holdfast_tests::objects::tls_secret("upstream", &client.cert_pem, &client.key_pem);
    secret
        .string_data
        .get_or_insert_default()
        .insert("ca.crt".into(), ca.cert_pem.clone());
    create(&s.client, Some(&ns), &secret).await?;
    let verified = |name: &'static str| {
        [
            ("backend-protocol", "HTTPS"),
            ("proxy-ssl-verify", "on"),
            ("proxy-ssl-secret", "upstream"),
            ("proxy-ssl-name", name),
        ]
    };
    for ing in [
        annotated(
            &s,
            "checked",
            (&checked, &["/"], "secure"),
            &verified("secure.internal"),
        )?,
        annotated(
            &s,
            "mismatched",
            (&mismatched, &["/"], "secure"),
            &verified("other.internal"),
        )?,
        annotated(
            &s,
            "https",
            (&https, &["/"], "secure"),
            &[("backend-protocol", "HTTPS")],
        )?,
        annotated(
            &s,
            "sni",
            (&sni, &["/"], "secure"),
            &[
                ("backend-protocol", "HTTPS"),
                ("proxy-ssl-server-name", "on"),
                ("proxy-ssl-name", "secure.internal"),
            ],
        )?,
        annotated(
            &s,
            "grpcs",
            (&grpcs, &["/"], "secure"),
            &[("backend-protocol", "GRPCS")],
        )?,
        annotated(&s, "plain", (&plain, &["/"], "secure"), &[])?,
        annotated(
            &s,
            "verify",
            (&verify, &["/"], "secure"),
            &[("backend-protocol", "HTTPS"), ("proxy-ssl-verify", "on")],
        )?,
    ] {
        create(&s.client, Some(&ns), &ing).await?;
    }
    let at = s.proxy_addrs()[0];
    let header = |h: &http::HeaderMap, name: &str| {
        h.get(name)
            .map(|v| v.to_str().unwrap_or_default().to_owned())
    };
    // Served once the last one created is (a snapshot holds what was read before it).
    let (status, h, _) = wait::until("the TLS backend answering", wait::T, || async {
        let r = web::request_with(at, "GET", &https, "/", &[])
            .await
            .map_err(|e| format!("{e:#}"))?;
        Ok((r.0 == 200).then_some(r))
    })
    .await?;
    assert_eq!(status, 200);
    assert_eq!(header(&h, "x-echo-name").as_deref(), Some("secure"));
    assert_eq!(header(&h, "x-echo-tls-sni").as_deref(), Some(""), "no SNI");
    assert_eq!(header(&h, "x-echo-tls-alpn").as_deref(), Some("http/1.1"));
    assert_eq!(header(&h, "x-echo-version").as_deref(), Some("HTTP/1.1"));
    wait::until("the other Ingresses served", wait::T, || async {
        let r = web::request_with(at, "GET", &verify, "/", &[])
            .await
            .map_err(|e| format!("{e:#}"))?;
        Ok((r.0 != 404).then_some(()))
    })
    .await?;
    let (status, h, _) = web::request_with(at, "GET", &sni, "/", &[]).await?;
    assert_eq!(status, 200);
    assert_eq!(
        header(&h, "x-echo-tls-sni").as_deref(),
        Some("secure.internal")
    );
    // Verified against the Secret's ca.crt for the name proxy-ssl-name gives: served when
    // the certificate is for that name, a failed handshake (502) when it is not.
    let (status, h, _) = web::request_with(at, "GET", &checked, "/", &[]).await?;
    assert_eq!(
        (status, header(&h, "x-echo-name").as_deref()),
        (200, Some("secure"))
    );
    let (status, h, _) = web::request_with(at, "GET", &mismatched, "/", &[]).await?;
    assert_eq!(status, 502, "{h:?}");
    // Cleartext to a TLS backend is not an answer; verification without a Secret to
    // verify with is refused.
    let (status, _, _) = web::request_with(at, "GET", &plain, "/", &[]).await?;
    assert_eq!(status, 502);
    let (status, h, _) = web::request_with(at, "GET", &verify, "/", &[]).await?;
    assert_eq!(status, 500, "{h:?}");
    assert_eq!(header(&h, "x-echo-name"), None);

    // GRPCS: HTTP/2 over TLS, ALPN h2 (the client speaks h2c to the proxy).
    let (status, h) = grpc_call(at, &grpcs).await?;
    assert_eq!(status, 200);
    assert_eq!(header(&h, "x-echo-version").as_deref(), Some("HTTP/2.0"));
    assert_eq!(header(&h, "x-echo-tls-alpn").as_deref(), Some("h2"));

    // Keep-alive: ten requests in a row, one client connection, open no new upstream
    // connection each (the handshake is reused; a worker opens at most one).
    let admin = s.proxies[0].admin;
    let opened = || async {
        let body = web::get(admin, "admin", "/metrics").await?.1;
        web::metric_value(&body, "holdfast_proxy_upstream_connections_opened_total")
    };
    let before = opened().await?;
    let stream = tokio::net::TcpStream::connect(at).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    // POSTs too: a request with a body takes a pooled connection only once it is checked
    // quiet (through the TLS session).
    for i in 0..10 {
        let method = if i % 2 == 0 { "GET" } else { "POST" };
        let body = if i % 2 == 0 { "" } else { "payload" };
        let req = http::Request::builder()
            .method(method)
            .uri("/")
            .header(http::header::HOST, &https)
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))?;
        let resp = tokio::time::timeout(wait::T, sender.send_request(req)).await??;
        assert_eq!(resp.status(), 200);
        http_body_util::BodyExt::collect(resp.into_body()).await?;
    }
    let after = opened().await?;
    assert!(
        after - before <= 1.0,
        "ten requests opened {} upstream connections",
        after - before
    );
    Ok(())
}

/// A gRPC-shaped POST for `host` over h2c (prior knowledge) to the proxy at `at`: the
/// status and headers of the answer.
async fn grpc_call(at: std::net::SocketAddr, host: &str) -> anyhow::Result<(u16, http::HeaderMap)> {
    let stream = tokio::net::TcpStream::connect(at).await?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await?;
    tokio::spawn(conn);
    let req = http::Request::post(format!("http://{host}/pkg.Echo/Call"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = tokio::time::timeout(wait::T, sender.send_request(req)).await??;
    Ok((resp.status().as_u16(), resp.headers().clone()))
}

/// The sum of `holdfast_proxy_error_responses_total` for `reasons`, None while there is no
/// such series yet.
fn errors_for(metrics: &str, reasons: &[&str]) -> Option<f64> {
    let scrape = holdfast_tests::metrics::Scrape::parse(metrics).ok()?;
    let errors = holdfast_tests::metrics::Series::new("holdfast_proxy_error_responses_total");
    let sums: Vec<f64> = reasons
        .iter()
        .filter_map(|r| scrape.sum(&errors.clone().label("reason", *r)))
        .collect();
    (!sums.is_empty()).then(|| sums.iter().sum())
}

/// `proxy-connect-timeout` and `proxy-send-timeout` bound what the proxy's own flags (20 s
/// here) would: a connect to an endpoint that never completes one (its accept queue full)
/// ends after the Ingress's 1 s, and so does a write of a request body to a backend that
/// reads nothing. Both are checked well under the proxy's 20 s. On the native HTTP/1.1
/// engine (the send timeout's writes are the native engine's; the hyper engine waits for
/// them within the response timeout, as docs/ingress-nginx.md says).
#[tokio::test]
async fn proxy_connect_and_send_timeouts_bound_the_connect_and_each_write_to_the_upstream()
-> anyhow::Result<()> {
    use holdfast_tests::objects::{endpoint_slice, service};
    use std::time::{Duration, Instant};
    let options = Options {
        ingresses: 1,
        proxies: 1,
        proxy_args: [
            "--h1-engine",
            "native",
            "--upstream-connect-timeout",
            "20s",
            "--upstream-response-timeout",
            "20s",
        ]
        .map(String::from)
        .to_vec(),
        ..Options::default()
    };
    let mut s = Scenario::start("nginxtimeouts", options).await?;
    let ns = s.ns.clone();
    let echo = holdfast_tests::workspace_bin("holdfast-echo");
    // An endpoint whose connects hang: it never accepts, and its queue is filled here.
    let stuck_ip = s.net.add_host()?;
    let stuck: std::net::SocketAddr = (stuck_ip, 8080).into();
    s.net.spawn(
        &echo,
        &[
            "--listen",
            &stuck.to_string(),
            "--name",
            "stuck",
            "--never-accept",
        ],
    )?;
    // Listening once a connect completes; then connects are queued until one hangs (its
    // SYN dropped: the queue is full).
    let first = wait::until("the stuck endpoint listening", wait::T, || async {
        Ok(tokio::net::TcpStream::connect(stuck).await.ok())
    })
    .await?;
    let mut queued = vec![first];
    let mut full = false;
    for _ in 0..8 {
        let connect = tokio::net::TcpStream::connect(stuck);
        match tokio::time::timeout(Duration::from_millis(500), connect).await {
            Ok(Ok(c)) => queued.push(c),
            Ok(Err(e)) => anyhow::bail!("connecting to the stuck endpoint: {e}"),
            Err(_) => {
                full = true;
                break;
            }
        }
    }
    anyhow::ensure!(
        full,
        "the stuck endpoint's queue never filled ({} queued)",
        queued.len()
    );
    // A backend that reads nothing for 30 s.
    let deaf_ip = s.net.add_host()?;
    let deaf = format!("{deaf_ip}:8080");
    s.net.spawn(
        &echo,
        &["--listen", &deaf, "--name", "deaf", "--delay-ms", "30000"],
    )?;
    for (name, ip) in [("stuck", stuck_ip), ("deaf", deaf_ip)] {
        create(&s.client, Some(&ns), &service(name, 80, 8080)).await?;
        let slice = endpoint_slice(&format!("{name}-1"), name, 8080, &[&ip.to_string()]);
        create(&s.client, Some(&ns), &slice).await?;
    }
    // The last created is served last (a snapshot holds what was read before it).
    for ing in [
        annotated(
            &s,
            "send",
            ("send.test", &["/"], "deaf"),
            &[("proxy-send-timeout", "1")],
        )?,
        annotated(
            &s,
            "connect",
            ("connect.test", &["/"], "stuck"),
            &[("proxy-connect-timeout", "1")],
        )?,
    ] {
        create(&s.client, Some(&ns), &ing).await?;
    }
    let at = s.proxy_addrs()[0];
    let admin = s.proxies[0].admin;
    wait::until("the Ingresses served", wait::T, || async {
        let status = web::request_with(at, "GET", "connect.test", "/x", &[]).await;
        Ok(status.ok().filter(|(s, _, _)| *s != 404).map(|_| ()))
    })
    .await?;

    // The connect: 502 after the Ingress's 1 s, not the proxy's 20 s.
    let started = Instant::now();
    let (status, _, _) = web::request_with(at, "GET", "connect.test", "/", &[]).await?;
    let took = started.elapsed();
    assert_eq!(status, 502);
    assert!(took < Duration::from_secs(6), "the connect took {took:?}");
    drop(queued);

    // The write: a 96 MiB body (more than every buffer on the way holds) to a backend
    // that reads none of it. The proxy gives up
    // the write after 1 s and answers an upstream error (the client, still writing, may
    // see its connection reset instead: the answer is read from the proxy's metrics).
    let metrics = || async { web::get(admin, "admin", "/metrics").await.map(|m| m.1) };
    let reasons = ["upstream_failed", "upstream_timeout"];
    // None: no such answer yet (the first one then makes the series).
    let before = errors_for(&metrics().await?, &reasons);
    let started = Instant::now();
    let upload = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let mut c = tokio::net::TcpStream::connect(at).await?;
        let size = 96 << 20;
        let head = format!("POST / HTTP/1.1\r\nHost: send.test\r\nContent-Length: {size}\r\n\r\n");
        c.write_all(head.as_bytes()).await?;
        let chunk = vec![b'x'; 64 << 10];
        for _ in 0..size / chunk.len() {
            c.write_all(&chunk).await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let answered = wait::until(
        "the stalled write answered",
        Duration::from_secs(6),
        || async {
            let m = metrics().await.map_err(|e| format!("{e:#}"))?;
            Ok(errors_for(&m, &reasons).filter(|n| before.is_none_or(|b| *n > b)))
        },
    )
    .await;
    let took = started.elapsed();
    upload.abort();
    answered?;
    assert!(
        took < Duration::from_secs(6),
        "the write was given up after {took:?}"
    );
    Ok(())
}

/// `limit-connections`: at most that many requests from one client address in progress at
/// once on the Ingress's paths, per proxy; more get 503 at once, and each request that
/// ends gives its place back. Another Ingress's host is not limited.
#[tokio::test]
async fn limit_connections_caps_a_clients_requests_in_progress_and_gives_places_back()
-> anyhow::Result<()> {
    let s = one_proxy("nginxconn").await?;
    let ns = s.ns.clone();
    for ing in [
        annotated(&s, "free", ("free.test", &["/"], SVC), &[])?,
        annotated(
            &s,
            "capped",
            ("capped.test", &["/"], SVC),
            &[("limit-connections", "2")],
        )?,
    ] {
        create(&s.client, Some(&ns), &ing).await?;
    }
    let at = s.proxy_addrs()[0];
    let ask = |host: &'static str, path: &'static str| async move {
        web::request_with(at, "GET", host, path, &[])
            .await
            .map(|(status, _, _)| status)
    };
    wait::until("the Ingresses served", wait::T, || async {
        let capped = ask("capped.test", "/").await.ok() == Some(200);
        let free = ask("free.test", "/").await.ok() == Some(200);
        Ok((capped && free).then_some(()))
    })
    .await?;
    // Four at once, each answered after 3 s: two are let through, two refused at once.
    let statuses = |host: &'static str| async move {
        let answers = futures::future::join_all((0..4).map(|_| ask(host, "/?delay_ms=3000"))).await;
        let mut statuses = answers.into_iter().collect::<anyhow::Result<Vec<u16>>>()?;
        statuses.sort_unstable();
        Ok::<_, anyhow::Error>(statuses)
    };
    assert_eq!(statuses("capped.test").await?, [200, 200, 503, 503]);
    // Their places are given back as they end (just after each answer is sent).
    wait::until("the places given back", wait::T, || async {
        let twice = futures::future::join_all((0..2).map(|_| ask("capped.test", "/"))).await;
        Ok(twice
            .iter()
            .all(|s| s.as_ref().ok() == Some(&200))
            .then_some(()))
    })
    .await?;
    assert_eq!(statuses("free.test").await?, [200, 200, 200, 200]);
    Ok(())
}

/// `affinity: cookie`: a request without the cookie is sent round robin and given a
/// cookie naming its endpoint (ingress-nginx's `INGRESSCOOKIE`, the path's Path,
/// HttpOnly); every request that brings it goes to that endpoint; one whose cookie names
/// no endpoint of the backend is given a new one.
#[tokio::test]
async fn affinity_cookie_sends_a_client_back_to_its_endpoint() -> anyhow::Result<()> {
    let s = one_proxy("nginxsticky").await?;
    let ns = s.ns.clone();
    let ing = annotated(
        &s,
        "sticky",
        ("sticky.test", &["/app"], SVC),
        &[("affinity", "cookie"), ("session-cookie-max-age", "60")],
    )?;
    create(&s.client, Some(&ns), &ing).await?;
    let at = s.proxy_addrs()[0];
    let ask = |cookie: Option<String>| async move {
        let headers: Vec<(&str, &str)> = cookie
            .as_deref()
            .map(|c| vec![("cookie", c)])
            .unwrap_or_default();
        let (status, headers, _) =
            web::request_with(at, "GET", "sticky.test", "/app", &headers).await?;
        anyhow::ensure!(status == 200, "sticky.test/app answered {status}");
        let name = headers
            .get("x-echo-name")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| anyhow::anyhow!("no x-echo-name"))?
            .to_owned();
        let set = headers
            .get(http::header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok::<_, anyhow::Error>((name, set))
    };
    wait::until("the sticky Ingress served", wait::T, || async {
        Ok(ask(None).await.ok())
    })
    .await?;
    // Without the cookie: both endpoints in turn, each answer with its cookie.
    let mut pinned = Vec::new();
    for _ in 0..2 {
        let (name, set) = ask(None).await?;
        let set = set.ok_or_else(|| anyhow::anyhow!("no Set-Cookie"))?;
        let (pair, attributes) = set.split_once(';').unwrap_or((&set, ""));
        anyhow::ensure!(pair.starts_with("INGRESSCOOKIE="), "{set}");
        assert_eq!(attributes, " Path=/app; Max-Age=60; HttpOnly", "{set}");
        pinned.push((name, pair.to_owned()));
    }
    assert_ne!(pinned[0].0, pinned[1].0, "round robin without the cookie");
    // With a cookie: its endpoint every time, and no new cookie.
    for (name, cookie) in &pinned {
        for _ in 0..6 {
            let (got, set) = ask(Some(cookie.clone())).await?;
            assert_eq!(&got, name, "{cookie}");
            assert_eq!(set, None, "{cookie}");
        }
    }
    // A cookie naming no endpoint of the backend: a new cookie.
    let (_, set) = ask(Some("INGRESSCOOKIE=0123456789abcdef".into())).await?;
    assert!(set.is_some_and(|c| c.starts_with("INGRESSCOOKIE=")));

    // The session-cookie annotations: name, Path, lifetime, SameSite, Secure.
    let ing = annotated(
        &s,
        "sticky-options",
        ("options.test", &["/shop"], SVC),
        &[
            ("affinity", "cookie"),
            ("affinity-mode", "persistent"),
            ("session-cookie-name", "route"),
            ("session-cookie-path", "/"),
            ("session-cookie-expires", "172800"),
            ("session-cookie-samesite", "Strict"),
            ("session-cookie-secure", "true"),
        ],
    )?;
    create(&s.client, Some(&ns), &ing).await?;
    let set = wait::until("the options Ingress served", wait::T, || async {
        let answer = web::request_with(at, "GET", "options.test", "/shop", &[]).await;
        Ok(answer
            .ok()
            .filter(|(status, _, _)| *status == 200)
            .and_then(|(_, headers, _)| headers.get(http::header::SET_COOKIE).cloned()))
    })
    .await?;
    let set = set.to_str()?;
    let (pair, attributes) = set.split_once(';').unwrap_or((set, ""));
    assert!(pair.starts_with("route="), "{set}");
    assert_eq!(
        attributes,
        " Path=/; Max-Age=172800; SameSite=Strict; Secure; HttpOnly"
    );
    Ok(())
}
