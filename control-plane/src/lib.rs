//! holdfast's control plane.
//!
//! # Layout
//! - [`translate`]: the pure function `cluster objects → snapshot` (route semantics).
pub mod translate;
