//! The end-to-end suite: one test binary, so that the tests share one build, one link and
//! one API server (`LocalCluster::shared`) and run side by side; scenarios that must own
//! their API server (faults, lifecycle) start a private one.
//!
//! # Layout
//! One module per topic:
//! - [`local_k8s`], [`local_k8s_lifecycle`]: the local Kubernetes the others stand on;
//! - [`control_plane`], [`ha`], [`deltas`]: the control plane against the real API server,
//!   two replicas, delta delivery as a property;
//! - [`data_plane`], [`data_plane_e2e`], [`https`], [`https_e2e`], [`h2spec`]: the proxy
//!   fed by an in-test control plane, then end to end; HTTPS; HTTP/2 conformance;
//! - [`mtls`]: mutual TLS between the planes;
//! - [`faults`]: zero failed requests through API-server, etcd, control-plane and proxy
//!   faults;
//! - [`deploy`], [`demo`]: the manifests, the chart, the alerts and the demo, as an operator
//!   uses them;
//! - [`gateway_api`]: the pinned Gateway API CRDs, echo-basic and conformance suite;
//! - [`gateway_filters`]: HTTPRoute matches and filters beyond the core, on the real stack;
//! - [`workloads`]: the local cluster that runs workloads (controllers, scheduler, kwok);
//! - [`docs`]: every test the README and docs/design.md cite exists.
//!
//! Every wait has the one deadline [`holdfast_tests::wait::T`].

mod access_log;
mod conformance;
mod control_plane;
mod data_plane;
mod data_plane_e2e;
mod deltas;
mod demo;
mod deploy;
mod docs;
mod faults;
mod gateway_api;
mod gateway_filters;
mod h2spec;
mod ha;
mod https;
mod https_e2e;
mod ingress_nginx;
mod kubectl_plugin;
mod local_k8s;
mod local_k8s_lifecycle;
mod mtls;
mod traces;
mod workloads;
