//! The metadata state machine: brokers, topics and their placement,
//! consumer groups, members, generations and assignments, and producer id
//! allocation. One instance runs on every broker, fed by the metadata Raft
//! group.
//!
//! [`MetadataState::apply`] is total and deterministic (G7): it takes the
//! leader's timestamp as an argument, reads only its own state, iterates only
//! ordered maps, and turns every invalid command into a typed
//! [`MetadataRejection`] that changes nothing.

mod command;
mod group;
mod rows;
mod state;

pub use command::{MetadataCommand, MetadataOutcome, MetadataRejection, MetadataResult, SETTLED_REPORTS_MAX};
pub use group::{GroupInfo, MemberInfo};
pub use rows::Rows;
pub use state::{BrokerInfo, GroupFloor, MetadataChanges, MetadataHead, MetadataState, RetentionPolicy, TopicInfo};
