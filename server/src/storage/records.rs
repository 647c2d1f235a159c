//! Partition records in the node's database, as keel-core's `RecordLog`.

use keel_core::partition::RecordLog;
use keel_core::record::StoredRecord;
use keel_core::Offset;
use redb::{ReadOnlyTable, ReadableTable, Table};

use super::store::StoreError;

type RecordTable<'txn> = Table<'txn, (&'static str, u64), &'static [u8]>;

fn decode(bytes: &[u8]) -> Result<StoredRecord, StoreError> {
    Ok(postcard::from_bytes(bytes)?)
}

/// Records of one partition inside a write transaction (used by apply).
pub struct RecordWriter<'a, 'txn> {
    pub(crate) table: &'a mut RecordTable<'txn>,
    pub(crate) group: &'a str,
}

impl RecordLog for RecordWriter<'_, '_> {
    type Error = StoreError;

    fn append(&mut self, record: StoredRecord) -> Result<(), StoreError> {
        let bytes = postcard::to_stdvec(&record)?;
        self.table.insert((self.group, record.offset.0), bytes.as_slice())?;
        Ok(())
    }

    fn get(&self, offset: Offset) -> Result<Option<StoredRecord>, StoreError> {
        let value = self.table.get((self.group, offset.0))?;
        value.map(|v| decode(v.value())).transpose()
    }

    fn remove_before(&mut self, offset: Offset) -> Result<(), StoreError> {
        self.table.retain_in((self.group, 0)..(self.group, offset.0), |_, _| false)?;
        Ok(())
    }
}

/// Records of one partition in a read transaction (used by reads).
pub struct RecordReader<'a> {
    pub(crate) table: ReadOnlyTable<(&'static str, u64), &'static [u8]>,
    pub(crate) group: &'a str,
}

impl RecordLog for RecordReader<'_> {
    type Error = StoreError;

    fn append(&mut self, _record: StoredRecord) -> Result<(), StoreError> {
        Err(StoreError::ReadOnly)
    }

    fn get(&self, offset: Offset) -> Result<Option<StoredRecord>, StoreError> {
        let value = self.table.get((self.group, offset.0))?;
        value.map(|v| decode(v.value())).transpose()
    }

    fn remove_before(&mut self, _offset: Offset) -> Result<(), StoreError> {
        Err(StoreError::ReadOnly)
    }
}
