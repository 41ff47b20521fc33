//! Admission in-process: the hostile-input bounds, the sparse views against `Value`, the
//! fixtures, the properties, bad AdmissionReviews and the docs' rule tables.

mod bounds;
mod equivalence;
mod fixtures;
mod properties;
mod review;
mod rule_tables;
