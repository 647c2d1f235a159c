//! keel-proto: the `.proto` files and the code generated from them.
//!
//! - `v1`: the public API (produce, read, administer).
//! - `raft`: the internal broker-to-broker Raft transport (every group over
//!   one channel per peer).
//!
//! The public API (produce, consume, admin) joins it with the client-facing
//! services. Generated with madsim-tonic-build, so one build yields both the
//! real tonic code and the simulated one. No logic lives here: validation is
//! in `keel-server`, state machines in `keel-core`.

/// Most partitions one PollPartitions request may name: a member with more
/// sends more requests.
pub const POLL_PARTITIONS_MAX: usize = 1024;

/// The encoded descriptors of every keel service, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/keel_descriptor.bin"));

/// The public API: produce, read, administer.
pub mod v1 {
    #![allow(clippy::all)]
    tonic::include_proto!("keel.v1");
    include!(concat!(env!("OUT_DIR"), "/keel.v1.serde.rs"));
}

/// The internal Raft transport between brokers.
pub mod raft {
    #![allow(clippy::all)]
    tonic::include_proto!("keel.raft");
}

/// A status refused inside a reply (a ProduceStream answer, one partition
/// of a PollPartitions) travels as a message: these keep its code, message
/// and ASCII metadata (the leader and retry hints).
impl From<&tonic::Status> for v1::Refusal {
    fn from(status: &tonic::Status) -> Self {
        let metadata = status
            .metadata()
            .iter()
            .filter_map(|entry| match entry {
                tonic::metadata::KeyAndValueRef::Ascii(key, value) => {
                    value.to_str().ok().map(|value| (key.as_str().to_string(), value.to_string()))
                }
                tonic::metadata::KeyAndValueRef::Binary(..) => None,
            })
            .collect();
        v1::Refusal { code: status.code() as i32, message: status.message().to_string(), metadata }
    }
}

impl v1::Refusal {
    /// The status this error stands for.
    pub fn into_status(self) -> tonic::Status {
        let mut metadata = tonic::metadata::MetadataMap::new();
        for (key, value) in &self.metadata {
            if let (Ok(key), Ok(value)) =
                (key.parse::<tonic::metadata::AsciiMetadataKey>(), value.parse::<tonic::metadata::AsciiMetadataValue>())
            {
                metadata.insert(key, value);
            }
        }
        tonic::Status::with_metadata(tonic::Code::from_i32(self.code), self.message, metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::v1::Refusal;

    #[test]
    fn a_status_survives_the_trip_through_a_stream_error() {
        let mut status = tonic::Status::failed_precondition("not the leader");
        status.metadata_mut().insert("keel-leader", "2@10.0.0.2:7000".parse().unwrap());
        status.metadata_mut().insert("keel-retry-after-ms", "100".parse().unwrap());
        let back = Refusal::from(&status).into_status();
        assert_eq!(back.code(), tonic::Code::FailedPrecondition);
        assert_eq!(back.message(), "not the leader");
        assert_eq!(back.metadata().get("keel-leader").unwrap(), "2@10.0.0.2:7000");
        assert_eq!(back.metadata().get("keel-retry-after-ms").unwrap(), "100");
        // A code this version does not know stays a failure, never OK.
        let unknown = Refusal { code: 99, ..Default::default() }.into_status();
        assert_eq!(unknown.code(), tonic::Code::Unknown);
    }
}
