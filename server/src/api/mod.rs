//! The public gRPC API (`keel.v1.Keel`), served by every broker.
//!
//! Every request is validated here first (names, sizes, that the topic and
//! partition exist) and again by the state machine in apply. Writes must
//! reach the leader of the group that takes them; keel does not forward: a
//! broker that does not lead answers `FAILED_PRECONDITION` with the
//! leader's id and address in the `keel-leader` response metadata
//! (`<id>@<host:port>`), or, for a partition not hosted here, its replicas
//! in `keel-replicas` (`<id>@<host:port>,...`). The client library follows
//! these hints. Reads of committed records are served by any replica.

mod access;
mod admission;
mod consumer;
mod errors;
mod groups;
mod produce_stream;
mod rpcs;
mod rules;
mod service;

pub use access::{AccessSettings, Caller, Proof, SECRET_METADATA, USER_METADATA};
pub use admission::{RETRY_AFTER_METADATA, WRITE_BYTES_IN_FLIGHT_MAX};
pub use errors::{LEADER_METADATA, REPLICAS_METADATA};
pub use produce_stream::STREAM_REQUESTS_IN_FLIGHT_MAX;
pub use service::{to_record, KeelService};
