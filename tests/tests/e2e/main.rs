//! The end-to-end suite: one test binary, so that the tests share one build, one link and
//! one API server (`LocalCluster::shared`) and run side by side; scenarios that must own
//! their API server (faults, lifecycle) start a private one.
//!
//! # Layout
//! One module per topic:
//! - [`local_k8s`], [`local_k8s_lifecycle`]: the local Kubernetes the others stand on;
//! - [`control_plane`], [`ha`], [`deltas`]: the control plane against the real API server,
//!   two replicas, delta delivery as a property;
//! - [`proxy_fed_by_test`], [`https_fed_by_test`]: the proxy, over HTTP and HTTPS, fed by
//!   an in-test control plane (any snapshot, valid or not, can be pushed);
//! - [`proxy_on_cluster`], [`https_on_cluster`]: the proxy on the real stack (API server,
//!   control plane, backends in a network namespace); [`h2spec`]: HTTP/2 conformance;
//! - [`access_log`], [`traces`], [`kubectl_plugin`]: access logs, spans in a real
//!   OpenTelemetry Collector, and the kubectl plugin against the real stack;
//! - [`mtls`]: mutual TLS between the planes;
//! - [`faults`]: zero failed requests through API-server, etcd, control-plane and proxy
//!   faults;
//! - [`deploy`], [`demo`]: the manifests, the chart, the alerts and the demo, as an operator
//!   uses them;
//! - [`gateway_api`]: the pinned Gateway API CRDs, echo-basic and conformance suite;
//! - [`gateway_filters`]: HTTPRoute matches and filters beyond the core, on the real stack;
//! - [`workloads`]: the local cluster that runs workloads (controllers, scheduler, kwok);
//! - [`docs`]: every test the README and docs/ cite exists, and every link resolves.
//!
//! Every wait has the one deadline [`holdfast_tests::wait::T`].

mod access_log;
mod conformance;
mod control_plane;
mod deltas;
mod demo;
mod deploy;
mod docs;
mod faults;
mod gateway_api;
mod gateway_filters;
mod h2spec;
mod ha;
mod https_fed_by_test;
mod https_on_cluster;
mod ingress_nginx;
mod kubectl_plugin;
mod local_k8s;
mod local_k8s_lifecycle;
mod mtls;
mod proxy_fed_by_test;
mod proxy_on_cluster;
mod traces;
mod workloads;
