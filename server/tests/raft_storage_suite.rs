//! openraft's own storage test suite against keel's redb store.

use keel_core::Limits;
use keel_server::raft::types::{StorageError, TypeConfig};
use keel_server::storage::{GroupStateMachine, LogStore, NodeStore};
use openraft::testing::{StoreBuilder, Suite};
use tempfile::TempDir;

struct RedbStoreBuilder;

impl StoreBuilder<TypeConfig, LogStore, GroupStateMachine, TempDir> for RedbStoreBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, GroupStateMachine), StorageError> {
        let dir = TempDir::new().expect("temp dir");
        let store = NodeStore::open(dir.path()).expect("open store");
        let log = LogStore::new(store.clone(), "metadata".to_string());
        let state_machine = GroupStateMachine::open(
            store,
            "metadata".to_string(),
            GroupStateMachine::initial_metadata(Limits::default()),
        )
        .expect("open state machine");
        Ok((dir, log, state_machine))
    }
}

#[test]
#[allow(clippy::result_large_err)]
fn redb_store_passes_the_openraft_suite() -> Result<(), StorageError> {
    Suite::test_all(RedbStoreBuilder)
}
