#!/usr/bin/env bash
# Runs the Gateway API conformance suite (GATEWAY-HTTP, -GRPC and -TLS, pinned in versions.env, built
# unmodified by `k8s.sh ensure`) against holdfast on a local cluster with workloads, and
# writes its ConformanceReport to docs/conformance/. The same test runs in the README's
# test command (tests/tests/e2e/conformance.rs); this only keeps the report it writes.
#
#   deploy/local/conformance.sh          build, run, write the report
#
# Needs what the test command needs (root, Go, the tools `k8s.sh ensure` builds).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=versions.env
. "$HERE/versions.env"

cd "$REPO"
bash deploy/local/k8s.sh ensure
cargo build --workspace --bins
report="$REPO/docs/conformance/standard-${GATEWAY_API_VERSION}-default-report.yaml"
HOLDFAST_CONFORMANCE_REPORT="$report" \
  cargo test -p holdfast-tests --test e2e -- --exact \
  conformance::the_gateway_api_conformance_suite_passes_gateway_http_grpc_and_tls
printf 'conformance.sh: report written to %s\n' "${report#"$REPO"/}"
