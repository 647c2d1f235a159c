//! Records: what producers send and what a partition log stores.

use serde::{Deserialize, Serialize};

use crate::id::{Offset, TimestampMs};
use crate::limits::Limits;

/// One header of a record: a name and opaque bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub key: String,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// A record as a producer sends it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Record {
    #[serde(with = "serde_bytes")]
    pub key: Option<Vec<u8>>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub headers: Vec<Header>,
    /// The producer's own timestamp, if it sent one. Informational only:
    /// nothing in keel decides on the producer's clock.
    pub producer_timestamp_ms: Option<TimestampMs>,
}

impl Record {
    /// A record with just a value.
    pub fn from_value(value: impl Into<Vec<u8>>) -> Self {
        Record { value: value.into(), ..Record::default() }
    }

    /// The size that limits and retention count: key, value, header keys and
    /// header values, in bytes.
    pub fn size_bytes(&self) -> u64 {
        let key = self.key.as_ref().map_or(0, Vec::len);
        let headers: usize = self.headers.iter().map(|h| h.key.len() + h.value.len()).sum();
        (key + self.value.len() + headers) as u64
    }

    /// Check this record against the limits.
    pub fn validate(&self, limits: &Limits) -> Result<(), RecordError> {
        let key_bytes = self.key.as_ref().map_or(0, Vec::len) as u64;
        if key_bytes > u64::from(limits.record_key_bytes_max) {
            return Err(RecordError::KeyTooLarge { bytes: key_bytes, max: limits.record_key_bytes_max });
        }
        let value_bytes = self.value.len() as u64;
        if value_bytes > u64::from(limits.record_value_bytes_max) {
            return Err(RecordError::ValueTooLarge { bytes: value_bytes, max: limits.record_value_bytes_max });
        }
        if self.headers.len() as u64 > u64::from(limits.record_headers_max) {
            return Err(RecordError::TooManyHeaders {
                count: self.headers.len() as u64,
                max: limits.record_headers_max,
            });
        }
        let total = self.size_bytes();
        if total > u64::from(limits.record_bytes_max) {
            return Err(RecordError::RecordTooLarge { bytes: total, max: limits.record_bytes_max });
        }
        Ok(())
    }
}

/// A record as a partition log holds it: its offset and the time the
/// partition leader stamped on the append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRecord {
    pub offset: Offset,
    pub append_time_ms: TimestampMs,
    pub record: Record,
}

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RecordError {
    #[error("record key is {bytes} bytes; the limit is {max}: shorten the key")]
    KeyTooLarge { bytes: u64, max: u32 },
    #[error("record value is {bytes} bytes; the limit is {max}: split the value or raise record_value_bytes_max")]
    ValueTooLarge { bytes: u64, max: u32 },
    #[error("record has {count} headers; the limit is {max}: send fewer headers")]
    TooManyHeaders { count: u64, max: u32 },
    #[error("record is {bytes} bytes with key and headers; the limit is {max}: make it smaller")]
    RecordTooLarge { bytes: u64, max: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_counts_key_value_and_headers() {
        let record = Record {
            key: Some(b"ab".to_vec()),
            value: b"cde".to_vec(),
            headers: vec![Header { key: "f".into(), value: b"gh".to_vec() }],
            producer_timestamp_ms: None,
        };
        assert_eq!(record.size_bytes(), 8);
    }

    #[test]
    fn oversized_parts_are_refused() {
        let limits = Limits {
            record_key_bytes_max: 2,
            record_value_bytes_max: 3,
            record_headers_max: 1,
            record_bytes_max: 6,
            ..Limits::default()
        };
        let ok = Record { key: Some(b"ab".to_vec()), value: b"abc".to_vec(), ..Record::default() };
        assert_eq!(ok.validate(&limits), Ok(()));
        let key = Record { key: Some(b"abc".to_vec()), ..Record::default() };
        assert!(matches!(key.validate(&limits), Err(RecordError::KeyTooLarge { bytes: 3, max: 2 })));
        let value = Record::from_value(b"abcd".to_vec());
        assert!(matches!(value.validate(&limits), Err(RecordError::ValueTooLarge { .. })));
        let header = Header { key: "k".into(), value: vec![] };
        let headers = Record { headers: vec![header.clone(), header], ..Record::default() };
        assert!(matches!(headers.validate(&limits), Err(RecordError::TooManyHeaders { .. })));
        let total = Record {
            key: Some(b"ab".to_vec()),
            value: b"abc".to_vec(),
            headers: vec![Header { key: "kk".into(), value: vec![] }],
            producer_timestamp_ms: None,
        };
        assert!(matches!(total.validate(&limits), Err(RecordError::RecordTooLarge { bytes: 7, max: 6 })));
    }
}
