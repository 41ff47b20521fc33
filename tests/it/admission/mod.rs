//! Admission in-process: the hostile-input bounds, the sparse views against `Value`, the
//! fixtures, the properties and bad AdmissionReviews.

mod bounds;
mod equivalence;
mod fixtures;
mod properties;
mod review;
