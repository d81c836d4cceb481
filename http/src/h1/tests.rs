use super::*;
use crate::framing::Tracker;

const LIMITS: Limits = Limits {
    max_bytes: 64 * 1024,
    max_headers: 100,
};

/// Finds the head's end in one read and parses it.
fn parse(head: &[u8]) -> Result<RequestHead, HeadError> {
    let len = HeadEnd::default()
        .find(head)
        .ok_or(HeadError::Malformed("no end"))?;
    let mut parsed = RequestHead::default();
    parsed.parse(head, len, LIMITS)?;
    Ok(parsed)
}

fn text(span: Option<Span>, buf: &[u8]) -> Option<&str> {
    span.map(|s| std::str::from_utf8(s.of(buf)).unwrap())
}

#[test]
fn a_request_head_is_read_into_positions_in_its_buffer() {
    let buf = b"POST /a/b?x=1&y HTTP/1.1\r\nHost:  Example.COM:8080 \r\nX-Two: a, b\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nabcGET";
    let h = parse(buf).unwrap();
    assert_eq!(h.method.of(buf), b"POST");
    assert_eq!(h.target.of(buf), b"/a/b?x=1&y");
    assert_eq!(h.path.of(buf), b"/a/b");
    assert_eq!(text(h.query, buf), Some("x=1&y"));
    assert_eq!(h.form, Some(TargetForm::Origin));
    assert_eq!(h.minor, 1);
    assert_eq!(text(h.host, buf), Some("Example.COM:8080"));
    assert_eq!(text(h.routing_host(), buf), Some("Example.COM:8080"));
    assert_eq!(h.framing(), BodyFraming::Length(3));
    assert!(h.expect_continue && !h.close && !h.upgrade);
    assert_eq!(
        &buf[h.len..h.len + 3],
        b"abc",
        "the body starts where the head ends"
    );
    let names: Vec<&[u8]> = h.headers.iter().map(|x| x.name.of(buf)).collect();
    assert_eq!(
        names,
        [&b"Host"[..], b"X-Two", b"Content-Length", b"Expect"]
    );
    assert_eq!(h.headers[1].value.of(buf), b"a, b");
    assert_eq!(h.headers[1].line.of(buf), b"X-Two: a, b\r\n");
    assert_eq!(h.headers[0].known, Known::Host);
}

#[test]
fn the_absolute_form_routes_on_its_authority_and_the_asterisk_form_has_no_path() {
    let buf = b"GET http://a.test:81/p?q HTTP/1.1\r\nHost: other\r\n\r\n";
    let h = parse(buf).unwrap();
    assert_eq!(h.form, Some(TargetForm::Absolute));
    assert_eq!(text(h.routing_host(), buf), Some("a.test:81"));
    assert_eq!(h.path.of(buf), b"/p");
    assert_eq!(text(h.query, buf), Some("q"));
    let buf = b"GET HTTPS://a.test?q HTTP/1.1\r\n\r\n";
    let h = parse(buf).unwrap();
    assert_eq!(text(h.routing_host(), buf), Some("a.test"));
    assert!(h.path.is_empty());
    let buf = b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n";
    let h = parse(buf).unwrap();
    assert_eq!(h.form, Some(TargetForm::Asterisk));
    let buf = b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n";
    assert_eq!(parse(buf).unwrap().form, Some(TargetForm::Authority));
}

#[test]
fn http_1_0_closes_unless_it_asks_to_keep_alive_and_1_1_closes_when_asked() {
    assert!(parse(b"GET / HTTP/1.0\r\n\r\n").unwrap().close);
    assert!(
        !parse(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
            .unwrap()
            .close
    );
    assert!(!parse(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap().close);
    assert!(
        parse(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, close\r\n\r\n")
            .unwrap()
            .close
    );
    let up =
        parse(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n");
    assert!(up.unwrap().upgrade);
    let not = parse(b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n");
    assert!(!not.unwrap().upgrade, "Upgrade without Connection: upgrade");
}

#[test]
fn smuggling_shapes_get_the_framing_checks_verdicts() {
    let cases: [(&[u8], BadRequest); 14] = [
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            BadRequest::LengthAndChunked,
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            BadRequest::DuplicateLength,
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\n",
            BadRequest::DuplicateLength,
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
            BadRequest::BadLength,
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
            BadRequest::BadLength,
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            BadRequest::BadTransferEncoding,
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            BadRequest::BadTransferEncoding,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            BadRequest::DuplicateHost,
        ),
        (b"GET / HTTP/1.1\nHost: a\r\n\r\n", BadRequest::BareLineFeed),
        (b"GET / HTTP/1.1\r\nHost: a\r\n\n", BadRequest::BareLineFeed),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: up\xc3grade\r\n\r\n",
            BadRequest::BadConnection,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            BadRequest::ChunkedWithoutBodyMethod,
        ),
        (
            b"HEAD / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            BadRequest::ChunkedWithoutBodyMethod,
        ),
        (
            b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\nTransfer-Encoding: chunked\r\n\r\n",
            BadRequest::ChunkedWithoutBodyMethod,
        ),
    ];
    for (head, why) in cases {
        assert_eq!(
            parse(head).unwrap_err(),
            HeadError::Bad(why),
            "{}",
            String::from_utf8_lossy(head)
        );
    }
    let ok = parse(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n");
    assert_eq!(ok.unwrap().framing(), BodyFraming::Chunked);
    let get = parse(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n");
    assert_eq!(
        get.unwrap().framing(),
        BodyFraming::Length(5),
        "a GET body by length"
    );
}

#[test]
fn malformed_heads_and_targets_http_would_refuse_are_refused() {
    let cases: [&[u8]; 13] = [
        b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
        b"G(T / HTTP/1.1\r\n\r\n",
        b"GET /a b HTTP/1.1\r\n\r\n",
        b"GET /<script> HTTP/1.1\r\n\r\n",
        b"GET /a#frag HTTP/1.1\r\n\r\n",
        b"GET /\xc3\xa9 HTTP/1.1\r\n\r\n",
        b"GET /?\"x\" HTTP/1.1\r\n\r\n",
        b"GET a.test HTTP/1.1\r\n\r\n",
        b"GET http:///p HTTP/1.1\r\n\r\n",
    ];
    for head in cases {
        let e = parse(head).unwrap_err();
        assert_eq!(e.status(), 400, "{}: {e}", String::from_utf8_lossy(head));
    }
    assert_eq!(
        parse(b"GET / HTTP/2.0\r\n\r\n").unwrap_err(),
        HeadError::Version
    );
    assert_eq!(
        parse(b"GET /{\"a\"} HTTP/1.1\r\n\r\n").unwrap().path.len(),
        6,
        "http accepts quotes and braces in a path"
    );
}

#[test]
fn heads_past_their_limits_are_refused_with_431() {
    let mut many = b"GET / HTTP/1.1\r\n".to_vec();
    for i in 0..=LIMITS.max_headers {
        many.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(parse(&many).unwrap_err(), HeadError::TooManyHeaders);
    let len = many.len();
    let mut h = RequestHead::default();
    let small = Limits {
        max_bytes: len - 1,
        max_headers: 1000,
    };
    assert_eq!(h.parse(&many, len, small), Err(HeadError::TooLarge));
    assert_eq!(HeadError::TooLarge.status(), 431);
}

#[test]
fn the_end_of_a_head_is_found_in_reads_of_any_size_and_only_once() {
    let stream = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n";
    let first = 27;
    for step in 1..stream.len() {
        let mut end = HeadEnd::default();
        let mut found = None;
        let mut have = 0;
        while found.is_none() && have < stream.len() {
            have = (have + step).min(stream.len());
            found = end.find(&stream[..have]);
        }
        assert_eq!(found, Some(first), "reads of {step}");
    }
    let mut end = HeadEnd::default();
    assert_eq!(end.find(&stream[first..]), Some(28), "the next head");
    // A head ended by bare LFs ends (and is refused), it does not wait for more.
    assert_eq!(
        HeadEnd::default().find(b"GET / HTTP/1.1\nHost: a\n\n"),
        Some(24)
    );
    assert_eq!(
        HeadEnd::default().find(b"GET / HTTP/1.1\r\nHost: a\r\n\r"),
        None
    );
}

/// Whatever the framing tracker refuses, the parse refuses too, and a head the parse
/// accepts the tracker accepts: the native engine is never looser than the checks
/// in front of hyper.
#[test]
fn the_parse_is_never_looser_than_the_framing_tracker() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let request_lines = [
        "GET / HTTP/1.1",
        "POST /x HTTP/1.1",
        "GET http://h/ HTTP/1.0",
    ];
    let lines: [&[u8]; 18] = [
        b"Host: a",
        b"Host: b:80",
        b"Content-Length: 5",
        b"content-length:  12 ",
        b"Content-Length: 1, 1",
        b"Content-Length: x",
        b"Transfer-Encoding: chunked",
        b"Transfer-Encoding: gzip, chunked",
        b"Transfer-Encoding: gzip",
        b"Connection: keep-alive, Upgrade",
        b"Connection: up\xc3grade",
        b"Upgrade: websocket",
        b"X-Colon: a:b",
        b"NoColon",
        b"Content-Length : 5",
        b" folded",
        b"X-Bin: \xff\xfe",
        b"Connection: close",
    ];
    let strategy = (
        0..request_lines.len(),
        proptest::collection::vec((0..lines.len(), any::<bool>()), 0..8),
    );
    let mut runner = TestRunner::new(Config {
        cases: 3000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(first, picked)| {
            let mut head = request_lines[first].as_bytes().to_vec();
            head.extend_from_slice(b"\r\n");
            for (i, bare) in &picked {
                head.extend_from_slice(lines[*i]);
                head.extend_from_slice(if *bare { b"\n" } else { b"\r\n" });
            }
            head.extend_from_slice(b"\r\n");
            let mut tracker = Tracker::default();
            tracker.feed(&head);
            let flagged = tracker.flagged().is_some();
            let ours = parse(&head);
            let shown = String::from_utf8_lossy(&head).into_owned();
            if flagged {
                prop_assert!(
                    ours.is_err(),
                    "the tracker refuses, the parse accepts: {shown:?}"
                );
            }
            if let Ok(h) = &ours {
                prop_assert!(!flagged, "{shown:?}");
                // The tracker follows the same body: after it, the next head is read.
                let mut stream = head.clone();
                match h.framing() {
                    BodyFraming::Length(n) => stream.extend(std::iter::repeat_n(b'x', n as usize)),
                    BodyFraming::Chunked => stream.extend_from_slice(b"1\r\nx\r\n0\r\n\r\n"),
                    _ => {}
                }
                if !h.upgrade {
                    stream.extend_from_slice(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n");
                    let mut t = Tracker::default();
                    t.feed(&stream);
                    prop_assert_eq!(
                        t.flagged().map(|f| f.0),
                        Some(1),
                        "the tracker reads the body elsewhere: {:?}",
                        shown
                    );
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn response_heads_say_how_their_bodies_end() {
    let cases: [(&[u8], bool, BodyFraming, bool); 9] = [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            false,
            BodyFraming::Length(5),
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n",
            false,
            BodyFraming::Length(5),
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
            BodyFraming::Chunked,
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            false,
            BodyFraming::Chunked,
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            false,
            BodyFraming::UntilClose,
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\n\r\n",
            false,
            BodyFraming::UntilClose,
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            true,
            BodyFraming::Empty,
            false,
        ),
        (
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
            false,
            BodyFraming::Empty,
            false,
        ),
        (
            b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n",
            false,
            BodyFraming::Length(5),
            true,
        ),
    ];
    for (head, head_request, framing, close) in cases {
        let len = HeadEnd::default().find(head).unwrap();
        let mut r = ResponseHead::default();
        r.parse(head, len, head_request).unwrap();
        let shown = String::from_utf8_lossy(head);
        assert_eq!(r.framing(), framing, "{shown}");
        assert_eq!(r.close, close, "{shown}");
        assert_eq!(r.status / 100, if r.status == 304 { 3 } else { 2 });
    }
    let mut r = ResponseHead::default();
    let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
    r.parse(interim, interim.len(), false).unwrap();
    assert!(r.is_interim());
    for bad in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
    ] {
        assert_eq!(
            r.parse(bad, bad.len(), false),
            Err(ResponseError::BadLength)
        );
    }
    for bad in [
        &b"HTTP/1.1 20 OK\r\n\r\n"[..],
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 200 OK\nX: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded\r\n\r\n",
    ] {
        assert!(
            r.parse(bad, bad.len(), false).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

/// The head the native engine sends upstream carries exactly the headers the hyper
/// engine's rewriting (`HeaderChanges::apply`, `strip_hop_by_hop`, `add_forwarded`, Host,
/// the loop header, and the framing hyper's client adds) gives for the same request: each
/// name with the same values in the same order.
#[test]
fn the_upstream_head_has_the_headers_the_hyper_engine_sends() {
    use super::onward::{MAX_PIECES, Onward, plan_upstream_head, write_upstream_head};
    use crate::headers::{
        HeaderChanges, Hop, REQUEST_ID, RequestId, add_forwarded, set_request_id, strip_hop_by_hop,
    };
    use http::{HeaderMap, HeaderName, HeaderValue};
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};

    let pool: [&[u8]; 31] = [
        b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        b"tracestate: vendor=1",
        b"X-Request-Id: from-the-balancer-1",
        b"X-Request-Id: not kept",
        b"Connection: x-request-id",
        b"Host: a.test",
        b"X-Forwarded-For: 10.1.1.1",
        b"X-Forwarded-For: 10.2.2.2, 10.3.3.3",
        b"X-Forwarded-For: \xfe",
        b"X-Forwarded-Proto: https",
        b"X-Forwarded-Host: elsewhere",
        b"X-Real-IP: 1.2.3.4",
        b"Forwarded: for=1.1.1.1",
        b"Forwarded: for=\xff",
        b"Connection: keep-alive, x-drop",
        b"Connection: close",
        b"Connection: x-forwarded-host, host, X-Keep",
        b"Connection: Upgrade",
        b"X-Drop: 1",
        b"X-Keep: 2",
        b"Keep-Alive: 5",
        b"TE: trailers",
        b"Trailer: x",
        b"Upgrade: websocket",
        b"Content-Length: 3",
        b"Transfer-Encoding: chunked",
        b"X-Holdfast-Loop: other",
        b"Accept: */*",
        b"close: yes",
        b"X-Bin: \xc3\xa9",
        b"Proxy-Authorization: x",
    ];
    let pair = |n: &str, v: &str| {
        (
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        )
    };
    let rules = [
        HeaderChanges::default(),
        HeaderChanges {
            set: vec![pair("x-keep", "set"), pair("accept", "text/html")],
            add: vec![
                pair("x-drop", "added"),
                pair("x-new", "1"),
                pair("x-request-id", "the-rules"),
            ],
            remove: vec![HeaderName::from_static("x-bin")],
        },
        HeaderChanges {
            set: vec![
                pair("x-forwarded-for", "9.9.9.9"),
                pair("host", "rule.test"),
            ],
            add: vec![
                pair("connection", "x-keep"),
                pair("forwarded", "for=8.8.8.8"),
            ],
            remove: vec![
                HeaderName::from_static("x-forwarded-proto"),
                HeaderName::from_static("x-request-id"),
            ],
        },
    ];
    let token = HeaderValue::from_static("tok123");
    let strategy = (
        proptest::collection::vec(0..pool.len(), 0..10),
        any::<bool>(),
        any::<bool>(),
        0..rules.len(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 3000,
        failure_persistence: None,
        ..Config::default()
    });
    // A parsed head's headers as a HeaderMap, names lower case.
    let to_map = |h: &RequestHead, buf: &[u8]| {
        let mut map = HeaderMap::new();
        for x in &h.headers {
            map.append(
                HeaderName::from_bytes(x.name.of(buf)).unwrap(),
                HeaderValue::from_bytes(x.value.of(buf)).unwrap(),
            );
        }
        map
    };
    let out = std::cell::RefCell::new(Vec::new());
    runner
        .run(
            &strategy,
            |(picked, trusted, keep_upgrade, rule, v6, traced, fresh)| {
                let out = &mut *out.borrow_mut();
                let mut raw = b"POST /p?q=1 HTTP/1.1\r\n".to_vec();
                for i in &picked {
                    raw.extend_from_slice(pool[*i]);
                    raw.extend_from_slice(b"\r\n");
                }
                raw.extend_from_slice(b"\r\n");
                let Ok(head) = parse(&raw) else {
                    // Refused heads are never forwarded.
                    return Ok(());
                };
                let client: std::net::IpAddr = if v6 {
                    "2001:db8::7".parse().unwrap()
                } else {
                    "10.9.9.9".parse().unwrap()
                };
                let hop = Hop {
                    client,
                    port: 8080,
                    proto: "http",
                    host: "a.test",
                    trusted,
                };
                let changes = Some(&rules[rule]).filter(|c| **c != HeaderChanges::default());
                let sent_id = head
                    .headers
                    .iter()
                    .find(|h| h.known == super::Known::RequestId)
                    .map(|h| h.value.of(&raw));
                let id = RequestId::choose(sent_id, trusted);
                // This hop's traceparent, when it traces.
                let ours = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
                let traceparent = traced.then_some(&ours[..]);
                // A trace started here (the client's traceparent absent or invalid).
                let drop_tracestate = traced && fresh;
                let onward = Onward {
                    target: b"/p?q=1",
                    hop,
                    keep_upgrade,
                    loop_header: ("x-holdfast-loop", token.as_bytes()),
                    changes,
                    upstream_host: None,
                    request_id: id.as_bytes(),
                    traceparent,
                    drop_tracestate,
                };
                // Planned for a vectored write, the head is the same bytes.
                let (mut rendered, mut pieces) = (Vec::new(), Vec::new());
                plan_upstream_head(&mut rendered, &mut pieces, &head, &raw, &onward);
                prop_assert!(pieces.len() <= MAX_PIECES, "{pieces:?}");
                let planned: Vec<u8> = pieces
                    .iter()
                    .flat_map(|p| p.of(&raw, &rendered).iter().copied())
                    .collect();
                write_upstream_head(out, &head, &raw, &onward);
                prop_assert_eq!(&planned, &*out, "the planned head is the written head");
                let out = &out[..];
                let mut sent = RequestHead::default();
                let len = HeadEnd::default().find(out);
                prop_assert_eq!(len, Some(out.len()), "one whole head");
                sent.parse(out, out.len(), LIMITS).map_err(|e| {
                    TestCaseError::fail(format!("{e}: {:?}", String::from_utf8_lossy(out)))
                })?;
                prop_assert_eq!(sent.method.of(out), b"POST");
                prop_assert_eq!(sent.target.of(out), b"/p?q=1");
                let ours = to_map(&sent, out);

                let mut theirs = to_map(&head, &raw);
                theirs.remove(REQUEST_ID);
                if let Some(c) = changes {
                    c.apply(&mut theirs);
                }
                strip_hop_by_hop(&mut theirs, keep_upgrade);
                add_forwarded(&mut theirs, hop);
                set_request_id(&mut theirs, &id, changes);
                if drop_tracestate {
                    theirs.remove("tracestate");
                }
                if let Some(t) = traceparent {
                    theirs.insert(
                        crate::trace::TRACEPARENT,
                        HeaderValue::from_bytes(t).unwrap(),
                    );
                }
                theirs.insert(http::header::HOST, HeaderValue::from_static("a.test"));
                theirs.append("x-holdfast-loop", token.clone());
                // hyper's client frames the body itself: the length it was told, or chunked.
                match head.framing() {
                    BodyFraming::Length(n) => {
                        theirs.insert(http::header::CONTENT_LENGTH, HeaderValue::from(n));
                    }
                    BodyFraming::Chunked => {
                        theirs.insert(
                            http::header::TRANSFER_ENCODING,
                            HeaderValue::from_static("chunked"),
                        );
                    }
                    _ => {}
                }
                let names: std::collections::BTreeSet<&str> = ours
                    .keys()
                    .chain(theirs.keys())
                    .map(HeaderName::as_str)
                    .collect();
                for name in names {
                    let a: Vec<&HeaderValue> = ours.get_all(name).iter().collect();
                    let b: Vec<&HeaderValue> = theirs.get_all(name).iter().collect();
                    prop_assert_eq!(
                        a,
                        b,
                        "{} for {:?} (trusted {}, upgrade {}, rule {})",
                        name,
                        String::from_utf8_lossy(&raw),
                        trusted,
                        keep_upgrade,
                        rule
                    );
                }
                Ok(())
            },
        )
        .unwrap();
}

/// The response head the native engine sends a client carries the headers the hyper
/// engine's mapping (`Forwarder::downstream_head`: Content-Length dropped beside
/// Transfer-Encoding, hop-by-hop headers removed, Upgrade kept only for a switch to an
/// allowed upgrade, the loop header removed) leaves, plus the framing, Date and
/// `Connection` this hop adds.
#[test]
fn the_downstream_head_has_the_headers_the_hyper_engine_sends() {
    use super::onward::{Back, write_downstream_head};
    use crate::headers::{HeaderChanges, strip_hop_by_hop};
    use http::{HeaderMap, HeaderName, HeaderValue};
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};

    let pool: [&[u8]; 16] = [
        b"Content-Type: text/plain",
        b"Content-Length: 5",
        b"Transfer-Encoding: chunked",
        b"Connection: keep-alive, x-drop",
        b"Connection: close",
        b"X-Drop: 1",
        b"X-Keep: 2",
        b"Keep-Alive: timeout=5",
        b"Upgrade: websocket",
        b"Connection: Upgrade",
        b"X-Holdfast-Loop: tok",
        b"Date: Sun, 06 Dec 2026 12:00:00 GMT",
        b"Set-Cookie: a=1",
        b"Set-Cookie: b=2",
        b"Trailer: x-t",
        b"Proxy-Authenticate: Basic",
    ];
    let statuses = [
        "200 OK",
        "101 Switching Protocols",
        "204 No Content",
        "404 Not Found",
    ];
    let pair = |n: &str, v: &str| {
        (
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        )
    };
    let name = |n: &str| HeaderName::from_bytes(n.as_bytes()).unwrap();
    // A Gateway rule's response header changes: none; the usual kinds; and ones naming
    // what this hop owns (framing, connection, upgrade, the loop header), never changed.
    let rules = [
        HeaderChanges::default(),
        HeaderChanges {
            set: vec![
                pair("x-keep", "set"),
                pair("x-new", "n"),
                pair("x-new", "last"),
            ],
            add: vec![pair("set-cookie", "c=3"), pair("x-added", "a")],
            remove: vec![name("content-type"), name("x-added")],
        },
        HeaderChanges {
            set: vec![
                pair("content-length", "99"),
                pair("connection", "close"),
                pair("x-holdfast-loop", "mine"),
                pair("date", "Tue, 01 Dec 2026 00:00:00 GMT"),
            ],
            add: vec![
                pair("transfer-encoding", "gzip"),
                pair("upgrade", "h2c"),
                pair("x-drop", "again"),
            ],
            remove: vec![name("keep-alive"), name("set-cookie"), name("trailer")],
        },
    ];
    let strategy = (
        0..statuses.len(),
        proptest::collection::vec(0..pool.len(), 0..8),
        any::<bool>(),
        any::<bool>(),
        0..rules.len(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        ..Config::default()
    });
    let to_map = |h: &ResponseHead, buf: &[u8]| {
        let mut map = HeaderMap::new();
        for x in &h.headers {
            map.append(
                HeaderName::from_bytes(x.name.of(buf)).unwrap(),
                HeaderValue::from_bytes(x.value.of(buf)).unwrap(),
            );
        }
        map
    };
    let out = std::cell::RefCell::new(Vec::new());
    runner
        .run(&strategy, |(status, picked, upgrade, close, rule)| {
            let out = &mut *out.borrow_mut();
            let mut raw = format!("HTTP/1.1 {}\r\n", statuses[status]).into_bytes();
            for i in &picked {
                raw.extend_from_slice(pool[*i]);
                raw.extend_from_slice(b"\r\n");
            }
            raw.extend_from_slice(b"\r\n");
            let mut response = ResponseHead::default();
            if response.parse(&raw, raw.len(), false).is_err() {
                return Ok(());
            }
            let chunked = response.framing() == BodyFraming::Chunked;
            let back = Back {
                upgrade,
                chunked,
                close,
                keep_alive: false,
                loop_header: "x-holdfast-loop",
                date_line: b"date: Mon, 07 Dec 2026 00:00:00 GMT\r\n",
                changes: Some(&rules[rule]).filter(|c| **c != HeaderChanges::default()),
            };
            write_downstream_head(out, &response, &raw, &back);
            let out = &out[..];
            let mut sent = ResponseHead::default();
            sent.parse(out, out.len(), false).map_err(|e| {
                TestCaseError::fail(format!("{e}: {:?}", String::from_utf8_lossy(out)))
            })?;
            prop_assert_eq!(sent.status, response.status);
            let ours = to_map(&sent, out);
            let mut theirs = to_map(&response, &raw);
            if theirs.contains_key(http::header::TRANSFER_ENCODING) {
                theirs.remove(http::header::CONTENT_LENGTH);
            }
            let switching = response.status == 101;
            strip_hop_by_hop(&mut theirs, switching && upgrade);
            theirs.remove("x-holdfast-loop");
            rules[rule].apply_to_response(&mut theirs, "x-holdfast-loop");
            // What this hop adds: a Date when there is none, its framing, and how the
            // connection goes on.
            if !theirs.contains_key(http::header::DATE) {
                theirs.insert(
                    http::header::DATE,
                    HeaderValue::from_static("Mon, 07 Dec 2026 00:00:00 GMT"),
                );
            }
            if chunked {
                theirs.insert(
                    http::header::TRANSFER_ENCODING,
                    HeaderValue::from_static("chunked"),
                );
            }
            if !(switching && upgrade) {
                theirs.remove(http::header::CONNECTION);
                if close {
                    theirs.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
                }
            }
            let names: std::collections::BTreeSet<&str> = ours
                .keys()
                .chain(theirs.keys())
                .map(HeaderName::as_str)
                .collect();
            for name in names {
                let a: Vec<&HeaderValue> = ours.get_all(name).iter().collect();
                let b: Vec<&HeaderValue> = theirs.get_all(name).iter().collect();
                prop_assert_eq!(
                    a,
                    b,
                    "{} for {:?} (upgrade {}, close {}, rule {})",
                    name,
                    String::from_utf8_lossy(&raw),
                    upgrade,
                    close,
                    rule
                );
            }
            Ok(())
        })
        .unwrap();
}

/// The byte-at-a-time scans the head's end, its bare LFs and its field values were found
/// by before they looked for line ends with `memchr` and at values without a branch per
/// byte: the new scans must agree with them on any bytes, read in any pieces.
#[test]
fn the_fast_scans_agree_with_byte_at_a_time_ones() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    fn head_end_bytewise(buf: &[u8]) -> Option<usize> {
        let (mut line, mut lines) = (0usize, 0usize);
        for (i, b) in buf.iter().enumerate() {
            match b {
                b'\n' => {
                    if line == 0 && lines > 0 {
                        return Some(i + 1);
                    }
                    lines += 1;
                    line = 0;
                }
                b'\r' if buf.get(i + 1) == Some(&b'\n') => {}
                b'\r' if i + 1 == buf.len() => return None,
                _ => line += 1,
            }
        }
        None
    }
    let byte = prop_oneof![
        Just(b'\r'),
        Just(b'\n'),
        Just(b'\t'),
        Just(0x7f_u8),
        Just(b'a'),
        Just(b' '),
        any::<u8>()
    ];
    let strategy = (
        proptest::collection::vec(byte, 0..64),
        proptest::collection::vec(1usize..8, 1..16),
    );
    let mut runner = TestRunner::new(Config {
        cases: 4096,
        ..Config::default()
    });
    runner
        .run(&strategy, |(bytes, steps)| {
            // Fed in reads of the given sizes, as the engine feeds a growing buffer.
            let mut end = HeadEnd::default();
            let (mut have, mut found, mut step) = (0, None, steps.iter().cycle());
            while found.is_none() && have < bytes.len() {
                have = (have + step.next().unwrap()).min(bytes.len());
                found = end.find(&bytes[..have]);
            }
            prop_assert_eq!(found, head_end_bytewise(&bytes), "{:?}", bytes);
            let bare = bytes
                .iter()
                .enumerate()
                .any(|(i, b)| *b == b'\n' && (i == 0 || bytes[i - 1] != b'\r'));
            prop_assert_eq!(has_bare_lf(&bytes), bare);
            let value = bytes
                .iter()
                .all(|b| matches!(b, b'\t' | b' '..=b'~' | 0x80..=0xff));
            prop_assert_eq!(is_field_value(&bytes), value);
            Ok(())
        })
        .unwrap();
}

/// The tchar table says what RFC 9110 §5.6.2 says, for every byte.
#[test]
fn the_tchar_table_is_rfc_9110s_token_characters() {
    const SYMBOLS: &[u8] = b"!#$%&'*+-.^_`|~";
    for b in 0..=u8::MAX {
        let rfc = b.is_ascii_digit()
            || b.is_ascii_lowercase()
            || b.is_ascii_uppercase()
            || SYMBOLS.contains(&b);
        assert_eq!(is_tchar(b), rfc, "byte {b:#04x}");
    }
    assert_eq!(
        (0..=u8::MAX).filter(|b| is_tchar(*b)).count(),
        62 + SYMBOLS.len()
    );
}
