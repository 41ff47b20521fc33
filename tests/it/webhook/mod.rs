//! The HTTPS webhook as a server: bounds over TLS, hostile clients, load with change, TLS end to
//! end.

mod bounds;
mod hostile;
mod load_change;
mod tls;
