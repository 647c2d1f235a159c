//! Snapshot data stored in the node's database in bounded chunks.
//!
//! openraft moves snapshots through a `SnapshotData` that is an async
//! reader, writer and seeker. [`SnapshotFile`] is one, backed by rows of
//! [`CHUNK_BYTES`] in redb: it reads a chunk at a time and buffers at most
//! one chunk when writing, so building, sending, receiving and installing a
//! snapshot of a large partition never holds it whole in memory. All redb
//! calls are short and synchronous inside `poll_*` (never across an await).
//!
//! Layout of a snapshot stream: a length-prefixed postcard header, then
//! length-prefixed postcard items (records), each prefix a little-endian u32.

use std::io::{self, Read, SeekFrom};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use redb::ReadableDatabase;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use super::store::{NodeStore, StoreError, SNAPSHOT_CHUNKS};

/// Size of one stored chunk, and so the most a snapshot holds in memory.
pub const CHUNK_BYTES: usize = 1024 * 1024;
/// Largest single item (record or header) in a snapshot stream.
pub const ITEM_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The row holding a snapshot's total length.
const LENGTH_ROW: u64 = u64::MAX;
/// Present once a snapshot is complete (see [`seal`]).
const SEALED_ROW: u64 = u64::MAX - 1;

/// Writes a snapshot's chunks when it is first read (a snapshot that is
/// only state in the database until a follower needs its records), and
/// returns them opened: the open file's read view pins them, so whoever
/// removes them afterwards cannot take them from under this reader.
pub struct Deferred(Box<dyn FnOnce() -> Result<SnapshotFile, StoreError> + Send + Sync>);

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}

/// A snapshot's bytes under one key in the node's database.
#[derive(Debug)]
pub struct SnapshotFile {
    store: Arc<NodeStore>,
    key: String,
    position: u64,
    length: u64,
    /// The chunk being written (index, bytes), flushed when full or on
    /// shutdown.
    writing: Option<(u64, Vec<u8>)>,
    /// The chunk last read (index, bytes).
    reading: Option<(u64, Vec<u8>)>,
    /// The read transaction chunks are read through: it pins them, so a
    /// snapshot being streamed stays whole even if a newer one replaces it.
    view: Option<redb::ReadTransaction>,
    /// Writes the chunks before the first read, if they are not written yet.
    deferred: Option<Deferred>,
}

fn to_io(error: StoreError) -> io::Error {
    io::Error::other(error.to_string())
}

impl SnapshotFile {
    /// An empty snapshot under `key` (any old chunks under it are removed).
    pub fn create(store: Arc<NodeStore>, key: String) -> Result<SnapshotFile, StoreError> {
        remove(&store, &key)?;
        Ok(SnapshotFile {
            store,
            key,
            position: 0,
            length: 0,
            writing: None,
            reading: None,
            view: None,
            deferred: None,
        })
    }

    /// The snapshot under `key`, whose chunks `fill` writes (then seals)
    /// and opens before it is first read or sought.
    pub fn deferred(
        store: Arc<NodeStore>,
        key: String,
        fill: impl FnOnce() -> Result<SnapshotFile, StoreError> + Send + Sync + 'static,
    ) -> SnapshotFile {
        let deferred = Some(Deferred(Box::new(fill)));
        SnapshotFile { store, key, position: 0, length: 0, writing: None, reading: None, view: None, deferred }
    }

    /// Write the chunks of a deferred snapshot, then read them from here.
    fn ready(&mut self) -> Result<(), StoreError> {
        if let Some(Deferred(fill)) = self.deferred.take() {
            let opened = fill()?;
            (self.length, self.view, self.reading) = (opened.length, opened.view, None);
        }
        Ok(())
    }

    /// The snapshot stored under `key`.
    pub fn open(store: Arc<NodeStore>, key: String) -> Result<SnapshotFile, StoreError> {
        let view = store.db()?.begin_read()?;
        let length = {
            let table = view.open_table(SNAPSHOT_CHUNKS)?;
            let row = table.get((key.as_str(), LENGTH_ROW))?;
            row.map_or(0, |v| u64::from_le_bytes(v.value().try_into().unwrap_or([0; 8])))
        };
        Ok(SnapshotFile {
            store,
            key,
            position: 0,
            length,
            writing: None,
            reading: None,
            view: Some(view),
            deferred: None,
        })
    }

    /// The key the chunks are stored under.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Store the chunk being written, if any, and the length.
    fn flush_chunk(&mut self) -> Result<(), StoreError> {
        let Some((index, bytes)) = self.writing.take() else { return Ok(()) };
        let key = self.key.as_str();
        let length = self.length;
        self.store.write_now(false, |txn| {
            let mut table = txn.open_table(SNAPSHOT_CHUNKS)?;
            table.insert((key, index), bytes.as_slice())?;
            table.insert((key, LENGTH_ROW), length.to_le_bytes().as_slice())?;
            Ok(())
        })?;
        // Later reads must see what was just written.
        self.reading = None;
        self.view = None;
        Ok(())
    }

    fn chunk(&mut self, index: u64) -> Result<&[u8], StoreError> {
        if self.writing.as_ref().is_some_and(|(i, _)| *i == index) {
            self.flush_chunk()?;
        }
        if self.reading.as_ref().is_none_or(|(i, _)| *i != index) {
            if self.view.is_none() {
                self.view = Some(self.store.db()?.begin_read()?);
            }
            let view = self.view.as_ref().expect("view just opened");
            let row = view.open_table(SNAPSHOT_CHUNKS)?.get((self.key.as_str(), index))?.map(|v| v.value().to_vec());
            let bytes = match row {
                Some(bytes) => bytes,
                // A hole is only fine past the end (a chunk still being written).
                None if index * CHUNK_BYTES as u64 >= self.length => Vec::new(),
                None => return Err(StoreError::Snapshot(format!("chunk {index} of snapshot {} is missing", self.key))),
            };
            self.reading = Some((index, bytes));
        }
        Ok(&self.reading.as_ref().expect("chunk just loaded").1)
    }

    /// Copy bytes at the current position into `out`; 0 at the end.
    fn read_here(&mut self, out: &mut [u8]) -> Result<usize, StoreError> {
        self.ready()?;
        if self.position >= self.length || out.is_empty() {
            return Ok(0);
        }
        let index = self.position / CHUNK_BYTES as u64;
        let within = (self.position % CHUNK_BYTES as u64) as usize;
        let available = (self.length - self.position).min((CHUNK_BYTES - within) as u64) as usize;
        let chunk = self.chunk(index)?;
        let count = available.min(out.len()).min(chunk.len().saturating_sub(within));
        out[..count].copy_from_slice(&chunk[within..within + count]);
        self.position += count as u64;
        Ok(count)
    }

    /// Write bytes at the current position (writes are sequential).
    fn write_here(&mut self, data: &[u8]) -> Result<usize, StoreError> {
        let index = self.position / CHUNK_BYTES as u64;
        let within = (self.position % CHUNK_BYTES as u64) as usize;
        if self.writing.as_ref().is_some_and(|(i, _)| *i != index) {
            self.flush_chunk()?;
        }
        if self.writing.is_none() {
            // Continue a partly written chunk (after a seek back or reopen).
            let existing = if within > 0 { self.chunk(index)?.to_vec() } else { Vec::new() };
            self.writing = Some((index, existing));
        }
        let (_, bytes) = self.writing.as_mut().expect("chunk being written");
        let count = data.len().min(CHUNK_BYTES - within);
        if bytes.len() < within + count {
            bytes.resize(within + count, 0);
        }
        bytes[within..within + count].copy_from_slice(&data[..count]);
        self.position += count as u64;
        self.length = self.length.max(self.position);
        if within + count == CHUNK_BYTES {
            self.flush_chunk()?;
        }
        Ok(count)
    }

    /// Append one length-prefixed item.
    pub fn write_item<T: Serialize>(&mut self, item: &T) -> Result<(), StoreError> {
        let bytes = postcard::to_stdvec(item)?;
        let mut framed = (bytes.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(&bytes);
        let mut written = 0;
        while written < framed.len() {
            written += self.write_here(&framed[written..])?;
        }
        Ok(())
    }

    /// Store what is buffered: the snapshot is then complete.
    pub fn finish(&mut self) -> Result<(), StoreError> {
        self.flush_chunk()
    }

    /// Read the next length-prefixed item, or `None` at the end.
    pub fn read_item<T: DeserializeOwned>(&mut self) -> Result<Option<T>, StoreError> {
        self.ready()?;
        if self.position >= self.length {
            return Ok(None);
        }
        let mut prefix = [0u8; 4];
        self.read_exact(&mut prefix).map_err(|e| StoreError::Snapshot(e.to_string()))?;
        let length = u32::from_le_bytes(prefix) as usize;
        if length > ITEM_BYTES_MAX {
            return Err(StoreError::Snapshot(format!("an item claims {length} bytes")));
        }
        let mut bytes = vec![0u8; length];
        self.read_exact(&mut bytes).map_err(|e| StoreError::Snapshot(e.to_string()))?;
        Ok(Some(postcard::from_bytes(&bytes)?))
    }

    /// Move to the start.
    pub fn rewind(&mut self) {
        self.position = 0;
    }
}

/// Mark the snapshot under `key` complete (after [`SnapshotFile::finish`]).
pub fn seal(store: &NodeStore, key: &str) -> Result<(), StoreError> {
    store.write_now(false, |txn| {
        txn.open_table(SNAPSHOT_CHUNKS)?.insert((key, SEALED_ROW), [].as_slice())?;
        Ok(())
    })
}

/// Whether the snapshot under `key` is complete.
pub fn is_sealed(store: &NodeStore, key: &str) -> Result<bool, StoreError> {
    store.read(|txn| Ok(txn.open_table(SNAPSHOT_CHUNKS)?.get((key, SEALED_ROW))?.is_some()))
}

/// Copy the chunks under `from` to `to` (replacing what `to` held), one
/// chunk in memory at a time.
pub fn copy(store: &NodeStore, from: &str, to: &str) -> Result<(), StoreError> {
    remove(store, to)?;
    let mut index = 0u64;
    loop {
        let row = store.read(|txn| {
            let table = txn.open_table(SNAPSHOT_CHUNKS)?;
            let next = table.range((from, index)..=(from, u64::MAX))?.next();
            match next {
                Some(row) => {
                    let (key, value) = row.map_err(redb::Error::from)?;
                    Ok(Some((key.value().1, value.value().to_vec())))
                }
                None => Ok(None),
            }
        })?;
        let Some((chunk, bytes)) = row else { return Ok(()) };
        store.write_now(false, |txn| {
            txn.open_table(SNAPSHOT_CHUNKS)?.insert((to, chunk), bytes.as_slice())?;
            Ok(())
        })?;
        if chunk == u64::MAX {
            return Ok(());
        }
        index = chunk + 1;
    }
}

/// Remove every chunk of every snapshot `group` was receiving: called before
/// a new stream begins (openraft receives one at a time, so any earlier one
/// was abandoned or installed) and when the group opens (a stream never
/// survives a restart).
pub fn remove_incoming(store: &NodeStore, group: &str) -> Result<(), StoreError> {
    let (from, to) = (incoming_prefix(group), format!("{group}/incoming."));
    let any = store.read(|txn| {
        let table = txn.open_table(SNAPSHOT_CHUNKS)?;
        let mut range = table.range((from.as_str(), 0)..(to.as_str(), 0))?;
        Ok(range.next().is_some())
    })?;
    if !any {
        return Ok(());
    }
    store.write_now(false, |txn| {
        txn.open_table(SNAPSHOT_CHUNKS)?.retain_in((from.as_str(), 0)..(to.as_str(), 0), |_, _| false)?;
        Ok(())
    })
}

/// What the key of every snapshot `group` receives starts with.
pub fn incoming_prefix(group: &str) -> String {
    format!("{group}/incoming-")
}

/// Remove every chunk stored under `key`.
pub fn remove(store: &NodeStore, key: &str) -> Result<(), StoreError> {
    store.write_now(false, |txn| {
        txn.open_table(SNAPSHOT_CHUNKS)?.retain_in((key, 0)..=(key, u64::MAX), |_, _| false)?;
        Ok(())
    })
}

impl Read for SnapshotFile {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.read_here(out).map_err(to_io)
    }
}

impl AsyncRead for SnapshotFile {
    fn poll_read(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.ready().map_err(to_io)?;
        // Zero only what one read can fill: openraft reads a chunk into a
        // buffer of a whole chunk's capacity (1 MiB), and zeroing all of it
        // for a snapshot of a few KiB, twice per chunk, cost more than the
        // read.
        let left = usize::try_from(this.length.saturating_sub(this.position)).unwrap_or(usize::MAX);
        let fillable = left.min(CHUNK_BYTES).min(buf.remaining());
        let count = this.read_here(buf.initialize_unfilled_to(fillable)).map_err(to_io)?;
        buf.advance(count);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(self.get_mut().write_here(data).map_err(to_io))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().flush_chunk().map_err(to_io))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().flush_chunk().map_err(to_io))
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        this.ready().map_err(to_io)?;
        let target = match position {
            SeekFrom::Start(offset) => Some(offset),
            SeekFrom::End(delta) => this.length.checked_add_signed(delta),
            SeekFrom::Current(delta) => this.position.checked_add_signed(delta),
        };
        this.position = target.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(Ok(self.position))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    fn store() -> Arc<NodeStore> {
        NodeStore::open_with_backend(redb::backends::InMemoryBackend::new()).unwrap()
    }

    #[test]
    fn abandoned_incoming_snapshots_are_removed_and_nothing_else() {
        let store = store();
        let write = |key: &str| {
            let mut file = SnapshotFile::create(store.clone(), key.into()).unwrap();
            file.write_item(&vec![1u8; 1000]).unwrap();
            file.finish().unwrap();
        };
        write("p/t/1/0/incoming-0");
        write("p/t/1/0/incoming-7");
        write("p/t/1/0/snapshot-3");
        write("p/t/1/1/incoming-0");
        remove_incoming(&store, "p/t/1/0").unwrap();
        let keys: Vec<String> = store
            .read(|txn| {
                let table = txn.open_table(SNAPSHOT_CHUNKS)?;
                let mut keys = Vec::new();
                for row in table.range::<(&str, u64)>(..)? {
                    let (key, _) = row.map_err(redb::Error::from)?;
                    keys.push(key.value().0.to_string());
                }
                Ok(keys)
            })
            .unwrap();
        assert!(keys.iter().all(|k| k != "p/t/1/0/incoming-0" && k != "p/t/1/0/incoming-7"), "{keys:?}");
        assert!(keys.iter().any(|k| k == "p/t/1/0/snapshot-3"));
        assert!(keys.iter().any(|k| k == "p/t/1/1/incoming-0"), "another group's stream stays");
    }

    #[test]
    fn items_round_trip_across_chunk_boundaries() {
        let store = store();
        let mut file = SnapshotFile::create(store.clone(), "g/1".into()).unwrap();
        let items: Vec<Vec<u8>> = (0..40).map(|i| vec![i as u8; 100_000 + i]).collect();
        for item in &items {
            file.write_item(item).unwrap();
        }
        file.finish().unwrap();
        let mut reopened = SnapshotFile::open(store, "g/1".into()).unwrap();
        assert!(reopened.length > 3 * CHUNK_BYTES as u64);
        let mut read = Vec::new();
        while let Some(item) = reopened.read_item::<Vec<u8>>().unwrap() {
            read.push(item);
        }
        assert_eq!(read, items);
    }

    #[test]
    fn async_writes_at_offsets_then_reads_back() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let store = store();
            let data: Vec<u8> = (0..(3 * CHUNK_BYTES + 12_345)).map(|i| (i % 251) as u8).collect();
            let mut file = SnapshotFile::create(store.clone(), "g/in".into()).unwrap();
            // openraft seeks to each chunk's offset, then writes it.
            for (n, piece) in data.chunks(700_001).enumerate() {
                file.seek(SeekFrom::Start((n * 700_001) as u64)).await.unwrap();
                file.write_all(piece).await.unwrap();
            }
            file.shutdown().await.unwrap();
            let mut reader = SnapshotFile::open(store, "g/in".into()).unwrap();
            assert_eq!(reader.seek(SeekFrom::End(0)).await.unwrap(), data.len() as u64);
            reader.seek(SeekFrom::Start(0)).await.unwrap();
            let mut back = Vec::new();
            AsyncReadExt::read_to_end(&mut reader, &mut back).await.unwrap();
            assert_eq!(back, data);
        });
    }

    /// openraft's sender reads each chunk into a buffer of a whole chunk's
    /// capacity, seeking to the chunk's offset first; offsets need not fall
    /// on the store's own chunks, and the last read ends the snapshot.
    #[test]
    fn reads_into_a_chunk_sized_buffer_as_openraft_sends() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let store = store();
            for (key, len, send_chunk) in [("g/small", 3_000, CHUNK_BYTES), ("g/big", 2 * CHUNK_BYTES + 77, 700_001)] {
                let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
                let mut file = SnapshotFile::create(store.clone(), key.into()).unwrap();
                file.write_all(&data).await.unwrap();
                file.shutdown().await.unwrap();
                let mut reader = SnapshotFile::open(store.clone(), key.into()).unwrap();
                let mut sent = Vec::new();
                while sent.len() < len {
                    reader.seek(SeekFrom::Start(sent.len() as u64)).await.unwrap();
                    let mut buf = Vec::with_capacity(send_chunk);
                    while buf.capacity() > buf.len() {
                        if AsyncReadExt::read_buf(&mut reader, &mut buf).await.unwrap() == 0 {
                            break;
                        }
                    }
                    assert!(!buf.is_empty(), "{key}: a read before the end returned nothing");
                    sent.extend_from_slice(&buf);
                }
                assert_eq!(sent, data, "{key}");
            }
        });
    }
}
