//! Waiting for a condition with a deadline.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(50);

/// The deadline of every wait in the end-to-end tests: how long a condition may take
/// before the test fails. Generous, because it only bounds a failing test; tests that
/// measure how fast something happens assert that time themselves.
pub const T: Duration = Duration::from_secs(60);

/// Polls `check` until it returns `Some`, or fails with `what` and the last observation
/// once `timeout` has passed.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => "condition not met".to_owned(),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}: {last}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Blocking variant of [`until`] for synchronous helpers.
pub fn until_blocking<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<Option<T>, String>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => "condition not met".to_owned(),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}: {last}");
        }
        std::thread::sleep(POLL);
    }
}

/// Waits (at most 10 minutes) until the leader of `cp` has written the status of at least
/// `routes` HTTPRoutes (`holdfast_status_writes_total{kind="HTTPRoute",result="ok"}`): the
/// steady state the benchmarks measure in. The series appears with the first write.
pub async fn first_statuses_written(
    cp: &crate::control_plane::ControlPlane,
    routes: usize,
) -> anyhow::Result<()> {
    let series = r#"holdfast_status_writes_total{kind="HTTPRoute",result="ok"}"#;
    until(
        &format!("the leader writing {routes} HTTPRoute statuses"),
        Duration::from_secs(600),
        || async {
            let written = cp.metric_value(series).await.map_err(|e| e.to_string())?;
            Ok((written >= routes as f64).then_some(()))
        },
    )
    .await
}
