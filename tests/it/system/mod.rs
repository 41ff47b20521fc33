//! End to end on the simulated kubelet: the real agent binary in every pod and the real
//! reconciler, with and without injected faults.

mod chaos;
mod e2e;
