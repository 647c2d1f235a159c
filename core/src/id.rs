//! Identifiers and names: small newtypes with validated constructors.
//!
//! Names (topics, groups, members) are checked once, here, so every other
//! module can take a `TopicName` and know it is legal. Deserialising a name
//! runs the same check, so bad bytes on the wire become an error, not a
//! state that breaks an invariant later.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest legal topic, group or member name, in bytes.
pub const NAME_BYTES_MAX: usize = 249;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum NameError {
    /// The name is empty; give it 1 to 249 characters.
    #[error("{kind} name is empty: use 1-{NAME_BYTES_MAX} characters of [A-Za-z0-9._-]")]
    Empty { kind: String },
    /// The name is longer than [`NAME_BYTES_MAX`] bytes (legal names are
    /// ASCII, so bytes and characters agree for them).
    #[error("{kind} name is {bytes} bytes long: use at most {NAME_BYTES_MAX} characters of [A-Za-z0-9._-]")]
    TooLong { kind: String, bytes: usize },
    /// The name contains a character outside `[A-Za-z0-9._-]`.
    #[error("{kind} name contains {found:?}: use only [A-Za-z0-9._-]")]
    IllegalCharacter { kind: String, found: char },
    /// `.` and `..` are reserved (they would be confusing in paths and URLs).
    #[error("{kind} name {name:?} is reserved: pick another")]
    Reserved { kind: String, name: String },
}

/// Check a name against the rules shared by topics, groups and members.
fn validate_name(kind: &str, name: &str) -> Result<(), NameError> {
    let kind = kind.to_string();
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    // Characters first: for a name of non-ASCII characters, the character
    // is the thing to fix.
    if let Some(found) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(NameError::IllegalCharacter { kind, found });
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(NameError::TooLong { kind, bytes: name.len() });
    }
    if name == "." || name == ".." {
        return Err(NameError::Reserved { kind, name: name.to_string() });
    }
    Ok(())
}

macro_rules! validated_name {
    ($(#[$doc:meta])* $type:ident, $kind:literal) => {
        $(#[$doc])*
        ///
        /// Shared, not copied: a clone is a reference count (an assignment
        /// names a member once per partition it owns).
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
        #[serde(try_from = "String")]
        pub struct $type(std::sync::Arc<str>);

        impl $type {
            /// Validate and wrap a name: 1-249 characters of `[A-Za-z0-9._-]`.
            pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
                let name = name.into();
                validate_name($kind, &name)?;
                Ok(Self(name.into()))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $type {
            type Error = NameError;
            fn try_from(name: String) -> Result<Self, NameError> {
                Self::new(name)
            }
        }

        impl From<$type> for String {
            fn from(name: $type) -> String {
                name.0.to_string()
            }
        }

        impl Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

validated_name!(
    /// A topic name: 1-249 characters of `[A-Za-z0-9._-]`.
    TopicName,
    "topic"
);
validated_name!(
    /// A consumer group name: 1-249 characters of `[A-Za-z0-9._-]`.
    GroupName,
    "group"
);
validated_name!(
    /// Who makes a request: a user (authenticated by its secret) or the
    /// common name of a client certificate. 1-249 characters of
    /// `[A-Za-z0-9._-]`.
    Principal,
    "principal"
);
validated_name!(
    /// A consumer group member id, chosen by the member: 1-249 characters of
    /// `[A-Za-z0-9._-]`.
    MemberId,
    "member"
);

macro_rules! number_id {
    ($(#[$doc:meta])* $type:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $type(pub $inner);

        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

number_id!(
    /// A broker's id, unique in the cluster, chosen by the operator.
    BrokerId(u64)
);
number_id!(
    /// A partition's index within its topic, from 0.
    PartitionIndex(u32)
);
number_id!(
    /// A record's position in a partition log. Offsets are dense from 0.
    Offset(u64)
);
number_id!(
    /// An idempotent producer's id, allocated by the metadata group.
    ProducerId(u64)
);
number_id!(
    /// A producer's per-partition batch sequence number: 0, 1, 2, ...
    Sequence(u64)
);
number_id!(
    /// A consumer group's generation; every assignment change bumps it.
    Generation(u64)
);
number_id!(
    /// Milliseconds since the Unix epoch, as read by a leader's clock and
    /// stamped into a command. Core never reads a clock itself.
    TimestampMs(u64)
);

impl Offset {
    /// The offset after this one.
    pub fn next(self) -> Offset {
        Offset(self.0.saturating_add(1))
    }
}

impl Generation {
    /// The generation after this one.
    pub fn next(self) -> Generation {
        Generation(self.0.saturating_add(1))
    }
}

number_id!(
    /// Milliseconds on a node's monotonic clock, from an arbitrary origin:
    /// for deadlines (member sessions), which a step of the wall clock must
    /// neither stretch nor cut. Never stored in replicated state.
    MonotonicMs(u64)
);

impl TimestampMs {
    /// This time plus a duration, saturating.
    pub fn plus_ms(self, duration_ms: u64) -> TimestampMs {
        TimestampMs(self.0.saturating_add(duration_ms))
    }
}

impl MonotonicMs {
    /// This instant plus a duration, saturating.
    pub fn plus_ms(self, duration_ms: u64) -> MonotonicMs {
        MonotonicMs(self.0.saturating_add(duration_ms))
    }
}

/// One partition of one topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TopicPartition {
    pub topic: TopicName,
    pub partition: PartitionIndex,
}

impl TopicPartition {
    pub fn new(topic: TopicName, partition: PartitionIndex) -> Self {
        Self { topic, partition }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legal_names_are_accepted() {
        for name in ["a", "orders", "orders.v2", "A_b-C.9", &"x".repeat(NAME_BYTES_MAX)] {
            assert_eq!(TopicName::new(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn illegal_names_are_refused_with_a_reason() {
        assert!(matches!(TopicName::new(""), Err(NameError::Empty { .. })));
        assert!(matches!(TopicName::new("x".repeat(NAME_BYTES_MAX + 1)), Err(NameError::TooLong { bytes: 250, .. })));
        // 200 x "é" is 400 bytes: the character is what to fix.
        let accented = TopicName::new("é".repeat(200)).unwrap_err();
        assert!(matches!(accented, NameError::IllegalCharacter { found: 'é', .. }), "{accented}");
        assert!(matches!(GroupName::new("a/b"), Err(NameError::IllegalCharacter { found: '/', .. })));
        assert!(matches!(MemberId::new("é"), Err(NameError::IllegalCharacter { found: 'é', .. })));
        assert!(matches!(TopicName::new(".."), Err(NameError::Reserved { .. })));
        let message = TopicName::new("a b").unwrap_err().to_string();
        assert!(message.contains("[A-Za-z0-9._-]"), "{message}");
    }

    #[test]
    fn deserialising_an_illegal_name_fails() {
        assert!(serde_json::from_str::<TopicName>("\"a b\"").is_err());
        assert_eq!(serde_json::from_str::<TopicName>("\"ab\"").unwrap().as_str(), "ab");
    }
}
