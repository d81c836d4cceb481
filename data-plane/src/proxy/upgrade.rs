//! Upgraded connections (WebSocket and the other protocols on `--allow-upgrade`) on the
//! hyper engine: which requests may upgrade. The tunnels are
//! [`holdfast_http::tunnel::Tunnels`].

use http::{Request, Version};

use holdfast_http::headers::{is_upgrade, upgrade_allowed};

/// Does `req` ask for an upgrade that is forwarded as one? Only HTTP/1.1, and only the
/// protocols on the allowlist (never h2c); any other goes upstream as a plain request,
/// its Upgrade header removed.
pub(super) fn requested<B>(req: &Request<B>, allowed: &[String]) -> bool {
    req.version() == Version::HTTP_11
        && is_upgrade(req.headers())
        && upgrade_allowed(req.headers(), allowed)
}
