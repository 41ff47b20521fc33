//! The real reconciler against the test API server: its runtime, the group-restart deadline and
//! parity with JobSet's own in-place restart controller.

mod controller;
mod deadline;
mod parity;
