//! `LOG` rows and the live bytes of each segment (`SEGMENT_LIVE`), kept in
//! step in one transaction. Every insert and delete of a row goes through
//! here, so a checkpoint knows exactly which segments no row points into
//! (they can go) and which hold mostly dead frames (worth compacting),
//! without scanning the rows.

use std::collections::BTreeMap;
use std::ops::Range;

use redb::{ReadableTable, TableDefinition, WriteTransaction};

use super::segments::{Location, FRAME_HEADER_BYTES};
use super::store::{LogRow, StoreError, LOG};

/// Bytes of the frames rows point at, per segment (headers included):
/// segment id -> bytes. A segment without a row here holds no live frame.
pub(crate) const SEGMENT_LIVE: TableDefinition<u64, u64> = TableDefinition::new("segment_live");

/// Bytes a frame takes in its segment.
fn frame_bytes(at: &Location) -> i128 {
    i128::from(FRAME_HEADER_BYTES + u64::from(at.len))
}

/// Changes of live bytes per segment, applied once per call.
#[derive(Default)]
struct Delta(BTreeMap<u64, i128>);

impl Delta {
    fn add(&mut self, at: &Location) {
        *self.0.entry(at.segment).or_default() += frame_bytes(at);
    }

    fn sub(&mut self, at: &Location) {
        *self.0.entry(at.segment).or_default() -= frame_bytes(at);
    }

    fn apply(self, txn: &WriteTransaction) -> Result<(), StoreError> {
        let mut table = txn.open_table(SEGMENT_LIVE)?;
        for (segment, change) in self.0.into_iter().filter(|(_, change)| *change != 0) {
            let before = table.get(segment)?.map_or(0, |v| v.value());
            let after = i128::from(before) + change;
            match u64::try_from(after) {
                Ok(0) => {
                    table.remove(segment)?;
                }
                Ok(after) => {
                    table.insert(segment, after)?;
                }
                Err(_) => {
                    return Err(StoreError::Inconsistent(format!(
                        "segment {segment} would hold {after} live bytes ({before} before a change of {change})"
                    )))
                }
            }
        }
        Ok(())
    }
}

/// Insert (or replace) `group`'s rows at the given indexes.
pub(crate) fn insert_rows(
    txn: &WriteTransaction,
    group: &str,
    rows: impl IntoIterator<Item = (u64, LogRow)>,
) -> Result<(), StoreError> {
    let mut delta = Delta::default();
    {
        let mut table = txn.open_table(LOG)?;
        for (index, row) in rows {
            delta.add(&row.at);
            if let Some(replaced) = table.insert((group, index), postcard::to_stdvec(&row)?.as_slice())? {
                let replaced: LogRow = postcard::from_bytes(replaced.value())?;
                delta.sub(&replaced.at);
            }
        }
    }
    delta.apply(txn)
}

/// Delete `group`'s rows at `indexes` (index `u64::MAX` is never used).
pub(crate) fn delete_rows(txn: &WriteTransaction, group: &str, indexes: Range<u64>) -> Result<(), StoreError> {
    let mut delta = Delta::default();
    let mut undecodable = None;
    txn.open_table(LOG)?.retain_in((group, indexes.start)..(group, indexes.end), |_, value| {
        match postcard::from_bytes::<LogRow>(value) {
            Ok(row) => delta.sub(&row.at),
            Err(error) => undecodable = Some(error),
        }
        false
    })?;
    if let Some(error) = undecodable {
        return Err(error.into());
    }
    delta.apply(txn)
}

/// The live bytes of every segment that has any, in segment order.
pub(crate) fn live_bytes(table: &impl ReadableTable<u64, u64>) -> Result<BTreeMap<u64, u64>, StoreError> {
    let mut live = BTreeMap::new();
    for row in table.iter()? {
        let (segment, bytes) = row.map_err(redb::Error::from)?;
        live.insert(segment.value(), bytes.value());
    }
    Ok(live)
}

/// The live bytes per segment as the rows say (a scan of every row).
pub(crate) fn count_live_bytes(
    log: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
) -> Result<BTreeMap<u64, u64>, StoreError> {
    let mut delta = Delta::default();
    for row in log.iter()? {
        let (_, value) = row.map_err(redb::Error::from)?;
        let row: LogRow = postcard::from_bytes(value.value())?;
        delta.add(&row.at);
    }
    Ok(delta.0.into_iter().map(|(segment, bytes)| (segment, bytes as u64)).collect())
}

/// Count the live bytes anew from the rows (once, for a data directory
/// written before they were kept).
pub(crate) fn rebuild(txn: &WriteTransaction) -> Result<(), StoreError> {
    let counted = count_live_bytes(&txn.open_table(LOG)?)?;
    let mut table = txn.open_table(SEGMENT_LIVE)?;
    table.retain(|_, _| false)?;
    for (segment, bytes) in counted {
        table.insert(segment, bytes)?;
    }
    Ok(())
}
