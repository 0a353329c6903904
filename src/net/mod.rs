//! The peer network (DESIGN.md A9, C5): the only module that knows quinn and rustls.
//!
//! * [`certs`]: the cluster CA and node certificates (rcgen).
//! * `tls`: mutual TLS over our CA; the peer's node name comes from its certificate and must
//!   equal the name it claims in its first protocol message.
//! * `transport`: one quinn endpoint per node (server and client), one connection per peer,
//!   protocol frames through [`crate::codec`] on a QUIC stream.

pub mod certs;
