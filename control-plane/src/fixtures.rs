//! A mocked API server for unit tests (tower-test, as controller-rs's fixtures): a test
//! says which requests must come, in which order and with what, and what each is
//! answered, so the exact call sequences of the control plane's few API writes and
//! reads are pinned down: the Ingress status patch, the Events for skipped rules, and the
//! fresh read that confirms a held removal.

use std::time::Duration;

use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::Value;
use tower_test::mock::{self, Handle};

/// How long a test waits for the next request before it fails.
const NEXT: Duration = Duration::from_secs(5);

/// The API server's side of a mocked client.
pub struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
}

/// A client whose every request goes to the returned [`ApiServer`].
pub fn client() -> (Client, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServer { handle })
}

/// One request the mocked API server received.
pub struct Received {
    /// `GET`, `POST`, `PATCH`, …
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The query string ("" if none).
    pub query: String,
    /// The Content-Type header ("" if none): says which kind of patch a PATCH is.
    pub content_type: String,
    /// The body as JSON (`Value::Null` if empty).
    pub body: Value,
}

impl ApiServer {
    /// Waits for the next request, checks its method and path, and answers `status` with
    /// what `answer` makes of the request, as JSON. Fails the test if none comes, or
    /// another one does.
    pub async fn expect(
        &mut self,
        method: Method,
        path: &str,
        status: u16,
        answer: impl FnOnce(&Received) -> Value,
    ) -> Received {
        let (request, send) = tokio::time::timeout(NEXT, self.handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("no request came; expected {method} {path}"))
            .unwrap_or_else(|| panic!("the client went away; expected {method} {path}"));
        let (parts, body) = request.into_parts();
        let bytes = http_body_util::BodyExt::collect(body)
            .await
            .expect("a request body")
            .to_bytes();
        let received = Received {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            body: if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).expect("a JSON request body")
            },
        };
        assert_eq!(
            (&received.method, received.path.as_str()),
            (&method, path),
            "unexpected request (query {:?}, body {})",
            received.query,
            received.body
        );
        let answer = answer(&received);
        send.send_response(
            Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(answer.to_string().into_bytes()))
                .expect("a response"),
        );
        received
    }
}
