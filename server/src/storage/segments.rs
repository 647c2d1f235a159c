//! The node's segment log: append-only files of checksummed frames, the
//! layout chosen for Raft log entries (and so for partition records) by
//! `server/benches/segments.rs` over redb rows (BENCHMARKS.md).
//!
//! A frame is `[body length | SALTED: u32][checksum: u32][body]`, little
//! endian. The checksum is a CRC-32C of the frame's place (segment id and
//! offset) followed by the body, so a frame is valid only where it was
//! written. Frames are appended to the active segment, written out in one
//! `write` per batch and made durable by one `sync_data`; a segment is
//! created at its full size ([`SEGMENT_BYTES`]) so that appends do not
//! grow the file. What a frame holds is the caller's business: this module
//! only stores bodies and hands out where they are ([`Location`]).
//!
//! Recycling (as PostgreSQL recycles WAL files): a segment no longer needed
//! is kept as a spare, up to [`SPARE_SEGMENTS_MAX`], and the next segment
//! is a spare renamed rather than a new file. Writing into blocks written
//! before makes each `sync_data` cheaper than writing into freshly
//! allocated ones, which it must first mark written (about 40% on these
//! machines: BENCHMARKS.md). A recycled segment still holds its earlier
//! life's frames past the new ones; they fail their checksum, whose place
//! names the old segment id, so they are never taken for new frames.
//! Segments written before the salt (the `SALTED` bit clear in every
//! frame, CRC-32C of the body alone) are still read, and never recycled.
//!
//! Recovery after a crash: the frames of the segments from a checkpoint on
//! are scanned in order; the first frame whose length is zero, runs past
//! the segment or fails its checksum ends that segment (a torn or never
//! written tail: nothing after it was reported durable, because a sync
//! covers every earlier byte, and a segment is synced before the next one
//! is written to). Appends never resume in a segment that was
//! open before the restart: a new segment starts, so stale bytes beyond a
//! torn tail can never be read as frames. So a restart costs a scan of
//! what follows the checkpoint, not of everything stored.
//!
//! Every byte goes through [`SegmentDisk`], the seam the simulation's crash
//! disk replaces. After an I/O error the log refuses all further work.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redb::StorageBackend;

/// Size a segment is created at (unless opened with another). A frame larger than what is left of the
/// active segment starts the next one; a frame larger than this gets a
/// segment of its own, as large as it needs.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Largest frame body, in bytes (a Raft entry is bounded well below it).
pub const FRAME_BODY_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Bytes of a frame's header.
pub const FRAME_HEADER_BYTES: u64 = 8;
/// Spare segments kept for reuse, at most (each takes a segment's bytes
/// on disk; more freed segments are removed).
pub const SPARE_SEGMENTS_MAX: usize = 4;
/// Bit of a frame's length word: the checksum is salted with the frame's
/// place. Clear in frames written before recycling (and free then: a
/// body is at most [`FRAME_BODY_BYTES_MAX`], below 2^31 bytes).
const SALTED: u32 = 1 << 31;

/// The checksum of a frame holding `body` at `offset` of segment `segment`.
fn frame_checksum(segment: u64, offset: u64, body: &[u8]) -> u32 {
    let mut place = [0u8; 16];
    place[..8].copy_from_slice(&segment.to_le_bytes());
    place[8..].copy_from_slice(&offset.to_le_bytes());
    #[cfg(test)]
    if tests::UNSALTED.with(std::cell::Cell::get) {
        return crc32c::crc32c(body);
    }
    crc32c::crc32c_append(crc32c::crc32c(&place), body)
}

/// Where a frame is: its segment and the offset of its header there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Location {
    pub segment: u64,
    pub offset: u64,
    /// Bytes of the body.
    pub len: u32,
}

impl Location {
    /// Where the frame after this one starts, in the same segment.
    pub fn end(&self) -> u64 {
        self.offset + FRAME_HEADER_BYTES + u64::from(self.len)
    }
}

/// A point in the log to recover from: every frame before it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
}

/// Why the segment log failed. Fatal: restart the node from disk.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment log I/O: {0}")]
    Io(#[from] io::Error),
    #[error("a frame body of {0} bytes is larger than the {FRAME_BODY_BYTES_MAX}-byte limit")]
    FrameTooLarge(usize),
    #[error(
        "frame at {0:?} is not stored (its segment was removed, or it is past the end); the data directory is damaged"
    )]
    Missing(Location),
    #[error("frame at {0:?} fails its checksum; the data directory is damaged")]
    Corrupt(Location),
    #[error("an earlier I/O error stopped the segment log; restart the node")]
    Poisoned,
}

/// The files of one segment log: real files in a directory, or the
/// simulation's crash disks.
pub trait SegmentDisk: Send + Sync + Debug {
    /// Create segment `id`, `len` bytes of zeros, and make its existence
    /// durable.
    fn create(&self, id: u64, len: u64) -> io::Result<Arc<dyn StorageBackend>>;
    /// Open segment `id`, which exists.
    fn open(&self, id: u64) -> io::Result<Arc<dyn StorageBackend>>;
    /// Remove segment `id` durably; no longer open anywhere.
    fn remove(&self, id: u64) -> io::Result<()>;
    /// The ids of every segment, in order.
    fn list(&self) -> io::Result<Vec<u64>>;
    /// Keep segment `id` (no longer open anywhere) as a spare, durably:
    /// it leaves the segments, its bytes stay.
    fn retire(&self, id: u64) -> io::Result<()>;
    /// Make the spare that was segment `spare` segment `id`, durably, and
    /// open it; it holds what its earlier life wrote.
    fn reuse(&self, spare: u64, id: u64) -> io::Result<Arc<dyn StorageBackend>>;
    /// Remove the spare that was segment `spare`, durably.
    fn remove_spare(&self, spare: u64) -> io::Result<()>;
    /// The spares (by the ids they had as segments), in order.
    fn spares(&self) -> io::Result<Vec<u64>>;
}

/// Segments as files `<id>.seg` (20 digits) in a directory.
#[derive(Debug)]
pub struct DirectoryDisk {
    dir: PathBuf,
}

impl DirectoryDisk {
    pub fn new(dir: PathBuf) -> io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(DirectoryDisk { dir })
    }

    fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:020}.seg"))
    }

    fn spare_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:020}.spare"))
    }

    /// The ids of the files named `<id><suffix>`, in order.
    fn ids(&self, suffix: &str) -> io::Result<Vec<u64>> {
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name.strip_suffix(suffix).and_then(|digits| digits.parse().ok()) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Make the directory's entries (a created or removed file) durable.
    fn sync_dir(&self) -> io::Result<()> {
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

impl SegmentDisk for DirectoryDisk {
    fn create(&self, id: u64, len: u64) -> io::Result<Arc<dyn StorageBackend>> {
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(self.path(id))?;
        // Blocks allocated now, so an append's sync need not allocate.
        // (A file system without fallocate gets a sparse file instead.)
        match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, len) {
            Err(rustix::io::Errno::OPNOTSUPP) => file.set_len(len)?,
            result => result?,
        }
        file.sync_all()?;
        self.sync_dir()?;
        Ok(Arc::new(SegmentFile { file }))
    }

    fn open(&self, id: u64) -> io::Result<Arc<dyn StorageBackend>> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(self.path(id))?;
        Ok(Arc::new(SegmentFile { file }))
    }

    fn remove(&self, id: u64) -> io::Result<()> {
        std::fs::remove_file(self.path(id))?;
        self.sync_dir()
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        self.ids(".seg")
    }

    fn retire(&self, id: u64) -> io::Result<()> {
        std::fs::rename(self.path(id), self.spare_path(id))?;
        self.sync_dir()
    }

    fn reuse(&self, spare: u64, id: u64) -> io::Result<Arc<dyn StorageBackend>> {
        // Never over a segment that exists (a damaged directory).
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            self.spare_path(spare),
            rustix::fs::CWD,
            self.path(id),
            rustix::fs::RenameFlags::NOREPLACE,
        )?;
        self.sync_dir()?;
        self.open(id)
    }

    fn remove_spare(&self, spare: u64) -> io::Result<()> {
        std::fs::remove_file(self.spare_path(spare))?;
        self.sync_dir()
    }

    fn spares(&self) -> io::Result<Vec<u64>> {
        self.ids(".spare")
    }
}

/// One segment file, read and written at offsets.
#[derive(Debug)]
struct SegmentFile {
    file: std::fs::File,
}

impl StorageBackend for SegmentFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, out, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, data, offset)
    }
}

/// Open segments, shared by the log and its readers.
type Open = Arc<Mutex<BTreeMap<u64, Arc<dyn StorageBackend>>>>;

/// Spare segments kept now, and segments made from spares since the log
/// opened (for metrics).
#[derive(Debug, Default)]
struct SpareCounts {
    spares: AtomicU64,
    recycled: AtomicU64,
}

/// The readers that hold a view of where frames are (a redb read
/// transaction over `LOG` rows), by the epoch they pinned in. The owner
/// of the log moves the epoch on after each change of what is in use
/// (a checkpoint), and removes a segment found unused in epoch `e` only
/// once no reader pinned before `e` remains: however long a reader holds
/// its view, every frame that view can name is still there.
#[derive(Debug, Default)]
struct PinBoard {
    epoch: u64,
    /// Epoch -> readers pinned in it (no entry at zero).
    pinned: BTreeMap<u64, usize>,
}

/// A reader's hold on every segment its view of the rows may name; take it
/// before the view (the read transaction) and keep it as long as the view.
#[derive(Debug)]
pub struct Pin {
    board: Arc<Mutex<PinBoard>>,
    epoch: u64,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut board = self.board.lock().expect("pin board");
        if let Some(count) = board.pinned.get_mut(&self.epoch) {
            *count -= 1;
            if *count == 0 {
                board.pinned.remove(&self.epoch);
            }
        }
    }
}

/// Reads frames at their locations; cheap to clone, usable from any
/// thread while the log appends.
#[derive(Debug, Clone)]
pub struct SegmentReader {
    disk: Arc<dyn SegmentDisk>,
    open: Open,
    pins: Arc<Mutex<PinBoard>>,
    spare_counts: Arc<SpareCounts>,
}

impl SegmentReader {
    /// Pin the segments in use now: none of them is removed while the pin
    /// lives. Take it before reading the rows that locate frames.
    pub fn pin(&self) -> Pin {
        let mut board = self.pins.lock().expect("pin board");
        let epoch = board.epoch;
        *board.pinned.entry(epoch).or_insert(0) += 1;
        Pin { board: self.pins.clone(), epoch }
    }

    /// How many segments the log holds, and their bytes on disk.
    pub fn usage(&self) -> (u64, u64) {
        let open = self.open.lock().expect("open segments");
        let bytes = open.values().filter_map(|segment| segment.len().ok()).sum();
        (open.len() as u64, bytes)
    }

    /// Spare segments kept now, and segments made from spares since the
    /// log opened.
    pub fn spare_usage(&self) -> (u64, u64) {
        (self.spare_counts.spares.load(Ordering::Relaxed), self.spare_counts.recycled.load(Ordering::Relaxed))
    }

    /// The body of the frame at `location`, which was written out.
    pub fn read(&self, location: Location) -> Result<Vec<u8>, SegmentError> {
        let segment = {
            let mut open = self.open.lock().expect("open segments");
            match open.get(&location.segment) {
                Some(segment) => segment.clone(),
                None => {
                    let segment = self.disk.open(location.segment).map_err(|_| SegmentError::Missing(location))?;
                    open.insert(location.segment, segment.clone());
                    segment
                }
            }
        };
        read_frame(segment.as_ref(), location)
    }
}

fn read_frame(segment: &dyn StorageBackend, location: Location) -> Result<Vec<u8>, SegmentError> {
    let mut frame = vec![0u8; FRAME_HEADER_BYTES as usize + location.len as usize];
    segment.read(location.offset, &mut frame).map_err(|_| SegmentError::Missing(location))?;
    let (header, body) = frame.split_at(FRAME_HEADER_BYTES as usize);
    let word = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let expected =
        if word & SALTED != 0 { frame_checksum(location.segment, location.offset, body) } else { crc32c::crc32c(body) };
    if word & !SALTED != location.len || expected != crc {
        return Err(SegmentError::Corrupt(location));
    }
    frame.drain(..FRAME_HEADER_BYTES as usize);
    Ok(frame)
}

/// The appending end of the log. One owner (the node's writer).
#[derive(Debug)]
pub struct SegmentLog {
    disk: Arc<dyn SegmentDisk>,
    open: Open,
    /// Size new segments are created at.
    segment_bytes: u64,
    /// The segment appends go to, and where the next frame goes in it.
    active: u64,
    active_len: u64,
    end: u64,
    /// Frames appended since the last write-out, starting at `written`.
    buffer: Vec<u8>,
    written: u64,
    /// Segments with bytes written since the last sync (a roll leaves the
    /// previous one unsynced until the next sync).
    unsynced: Vec<u64>,
    /// Spare segments (by the ids they had), at most [`SPARE_SEGMENTS_MAX`].
    spares: Vec<u64>,
    spare_counts: Arc<SpareCounts>,
    pins: Arc<Mutex<PinBoard>>,
    poisoned: bool,
}

impl SegmentLog {
    /// Open the log on `disk`: hand every frame from `checkpoint` on (all
    /// of them if `None`) to `visit`, in order, then start a new segment
    /// for appends. A checkpoint past every segment (or in a removed one)
    /// visits the segments that follow it.
    pub fn open(
        disk: Arc<dyn SegmentDisk>,
        checkpoint: Option<Position>,
        visit: impl FnMut(Location, &[u8]) -> Result<(), SegmentError>,
    ) -> Result<SegmentLog, SegmentError> {
        Self::open_sized(disk, checkpoint, SEGMENT_BYTES, visit)
    }

    /// [`SegmentLog::open`] with segments of `segment_bytes` (the
    /// simulation's disks live in memory, and small segments roll often).
    pub fn open_sized(
        disk: Arc<dyn SegmentDisk>,
        checkpoint: Option<Position>,
        segment_bytes: u64,
        mut visit: impl FnMut(Location, &[u8]) -> Result<(), SegmentError>,
    ) -> Result<SegmentLog, SegmentError> {
        let from = checkpoint.unwrap_or(Position { segment: 0, offset: 0 });
        let ids = disk.list()?;
        let mut open = BTreeMap::new();
        for &id in &ids {
            let segment = disk.open(id)?;
            if id >= from.segment {
                let start = if id == from.segment { from.offset } else { 0 };
                scan(segment.as_ref(), id, start, u64::MAX, &mut visit)?;
                // What the scan saw may still be only in the page cache
                // (the process was killed before its sync): make it
                // durable before anything relies on it.
                segment.sync_data()?;
            }
            // Every segment is known, so that removal can find it.
            open.insert(id, segment);
        }
        let active = ids.last().map_or(0, |last| last + 1).max(from.segment);
        let mut spares = disk.spares()?;
        while spares.len() > SPARE_SEGMENTS_MAX {
            disk.remove_spare(spares.pop().expect("more spares than the bound"))?;
        }
        let open = Arc::new(Mutex::new(open));
        let mut log = SegmentLog {
            disk,
            open,
            segment_bytes,
            active,
            active_len: 0,
            end: 0,
            buffer: Vec::new(),
            written: 0,
            unsynced: Vec::new(),
            spares,
            spare_counts: Arc::default(),
            pins: Arc::default(),
            poisoned: false,
        };
        log.start_segment(active, segment_bytes)?;
        Ok(log)
    }

    /// A reader of this log's frames.
    pub fn reader(&self) -> SegmentReader {
        SegmentReader {
            disk: self.disk.clone(),
            open: self.open.clone(),
            pins: self.pins.clone(),
            spare_counts: self.spare_counts.clone(),
        }
    }

    /// Start a new pin epoch (after a change of which segments are in use
    /// became visible to new readers); returns it.
    pub fn next_epoch(&mut self) -> u64 {
        let mut board = self.pins.lock().expect("pin board");
        board.epoch += 1;
        board.epoch
    }

    /// Whether a reader pinned before `epoch` may still read.
    pub fn pinned_before(&self, epoch: u64) -> bool {
        self.pins.lock().expect("pin board").pinned.first_key_value().is_some_and(|(oldest, _)| *oldest < epoch)
    }

    /// The segment appends go to.
    pub fn active(&self) -> u64 {
        self.active
    }

    /// Bytes segment `id` takes (its size on disk), if it is stored.
    pub fn segment_len(&self, id: u64) -> Option<u64> {
        let segment = self.open.lock().expect("open segments").get(&id).cloned()?;
        segment.len().ok()
    }

    /// Visit the frames of segment `id` from `offset` on, up to about
    /// `budget` bytes of them; returns where to go on, or `None` past the
    /// segment's last frame.
    pub fn scan_segment(
        &mut self,
        id: u64,
        offset: u64,
        budget: u64,
        mut visit: impl FnMut(Location, &[u8]) -> Result<(), SegmentError>,
    ) -> Result<Option<u64>, SegmentError> {
        self.check()?;
        let segment = self.segment(id)?;
        let scanned = scan(segment.as_ref(), id, offset, budget, &mut visit);
        self.poison_on_segment_error(scanned)
    }

    /// Where the next frame will go: a checkpoint taken now covers every
    /// frame appended before.
    pub fn position(&self) -> Position {
        Position { segment: self.active, offset: self.end }
    }

    /// Append a frame holding `body`; it is readable once written out
    /// ([`SegmentLog::write_out`]) and durable once synced.
    pub fn append(&mut self, body: &[u8]) -> Result<Location, SegmentError> {
        self.check()?;
        if body.len() > FRAME_BODY_BYTES_MAX {
            return Err(SegmentError::FrameTooLarge(body.len()));
        }
        let frame_len = FRAME_HEADER_BYTES + body.len() as u64;
        if self.end + frame_len > self.active_len {
            // The full segment is made durable before the next one gets a
            // byte: only the last segment written can have a torn tail, so
            // recovery never returns frames after a lost one.
            self.sync()?;
            let next = self.active + 1;
            self.start_segment(next, self.segment_bytes.max(frame_len))?;
        }
        let location = Location { segment: self.active, offset: self.end, len: body.len() as u32 };
        self.buffer.extend_from_slice(&(body.len() as u32 | SALTED).to_le_bytes());
        self.buffer.extend_from_slice(&frame_checksum(location.segment, location.offset, body).to_le_bytes());
        self.buffer.extend_from_slice(body);
        self.end += frame_len;
        Ok(location)
    }

    /// Write the appended frames to the active segment (one write), so
    /// that readers can read them.
    pub fn write_out(&mut self) -> Result<(), SegmentError> {
        self.check()?;
        if self.buffer.is_empty() {
            return Ok(());
        }
        let segment = self.segment(self.active)?;
        let result = segment.write(self.written, &self.buffer);
        self.poison_on(result)?;
        self.written += self.buffer.len() as u64;
        self.buffer.clear();
        if self.unsynced.last() != Some(&self.active) {
            self.unsynced.push(self.active);
        }
        Ok(())
    }

    /// Make every frame appended so far durable.
    pub fn sync(&mut self) -> Result<(), SegmentError> {
        self.write_out()?;
        for id in std::mem::take(&mut self.unsynced) {
            let segment = self.segment(id)?;
            let result = segment.sync_data();
            self.poison_on(result)?;
        }
        Ok(())
    }

    /// Remove the segments `ids` (none of their frames is needed any more,
    /// by any reader); the active segment is never removed. Each is kept
    /// as a spare if it can be recycled and the spares are not full.
    pub fn remove(&mut self, ids: &[u64]) -> Result<(), SegmentError> {
        self.check()?;
        // Under the lock throughout: a reader must not open a segment
        // again between its leaving the map and its file going.
        let open = self.open.clone();
        let mut open = open.lock().expect("open segments");
        let active = self.active;
        for &id in ids.iter().filter(|id| **id < active) {
            if let Some(segment) = open.remove(&id) {
                let result = if self.spares.len() < SPARE_SEGMENTS_MAX && self.recyclable(segment.as_ref()) {
                    self.spares.push(id);
                    self.disk.retire(id)
                } else {
                    self.disk.remove(id)
                };
                self.poison_on(result)?;
            }
        }
        self.count_spares();
        Ok(())
    }

    fn count_spares(&self) {
        self.spare_counts.spares.store(self.spares.len() as u64, Ordering::Relaxed);
    }

    /// Whether `segment` can become a spare: created at the usual size,
    /// and written with salted checksums (its frames cannot pass for a
    /// later life's). A segment it cannot read is removed instead.
    fn recyclable(&self, segment: &dyn StorageBackend) -> bool {
        segment.len().ok() == Some(self.segment_bytes) && segment_is_salted(segment).unwrap_or(false)
    }

    /// Spare segments kept, and segments made from spares since the log
    /// opened.
    pub fn spare_usage(&self) -> (u64, u64) {
        self.reader().spare_usage()
    }

    /// The ids of the segments stored.
    pub fn segments(&self) -> Vec<u64> {
        self.open.lock().expect("open segments").keys().copied().collect()
    }

    fn start_segment(&mut self, id: u64, len: u64) -> Result<(), SegmentError> {
        let segment = match self.spares.pop() {
            // A spare's old id is below every new one, so its old frames'
            // checksums name another place (a spare at or past `id` could
            // only come from a directory damaged from outside).
            Some(spare) if len == self.segment_bytes && spare < id => {
                let reused = self.disk.reuse(spare, id).and_then(|segment| {
                    // A spare from a run with another segment size.
                    if segment.len()? != len {
                        segment.set_len(len)?;
                        segment.sync_data()?;
                    }
                    Ok(segment)
                });
                let segment = self.poison_on(reused)?;
                self.spare_counts.recycled.fetch_add(1, Ordering::Relaxed);
                segment
            }
            Some(spare) if spare >= id => {
                let removed = self.disk.remove_spare(spare);
                self.poison_on(removed)?;
                let created = self.disk.create(id, len);
                self.poison_on(created)?
            }
            spare => {
                self.spares.extend(spare);
                let created = self.disk.create(id, len);
                self.poison_on(created)?
            }
        };
        self.open.lock().expect("open segments").insert(id, segment);
        self.count_spares();
        (self.active, self.active_len, self.end, self.written) = (id, len, 0, 0);
        Ok(())
    }

    fn segment(&self, id: u64) -> Result<Arc<dyn StorageBackend>, SegmentError> {
        let open = self.open.lock().expect("open segments");
        open.get(&id).cloned().ok_or(SegmentError::Missing(Location { segment: id, offset: 0, len: 0 }))
    }

    fn check(&self) -> Result<(), SegmentError> {
        if self.poisoned {
            return Err(SegmentError::Poisoned);
        }
        Ok(())
    }

    fn poison_on_segment_error<T>(&mut self, result: Result<T, SegmentError>) -> Result<T, SegmentError> {
        if matches!(result, Err(SegmentError::Io(_))) {
            self.poisoned = true;
        }
        result
    }

    fn poison_on<T>(&mut self, result: io::Result<T>) -> Result<T, SegmentError> {
        result.map_err(|error| {
            self.poisoned = true;
            SegmentError::Io(error)
        })
    }
}

/// Whether the first frame of `segment` (so every frame) has a salted
/// checksum.
fn segment_is_salted(segment: &dyn StorageBackend) -> io::Result<bool> {
    if segment.len()? < FRAME_HEADER_BYTES {
        return Ok(false);
    }
    let mut word = [0u8; 4];
    segment.read(0, &mut word)?;
    Ok(u32::from_le_bytes(word) & SALTED != 0)
}

/// Visit the frames of one segment from `offset` to its first invalid one,
/// stopping once `budget` bytes of frames were visited; returns where the
/// next frame starts, or `None` if the segment has no more.
fn scan(
    segment: &dyn StorageBackend,
    id: u64,
    mut offset: u64,
    budget: u64,
    visit: &mut impl FnMut(Location, &[u8]) -> Result<(), SegmentError>,
) -> Result<Option<u64>, SegmentError> {
    let len = segment.len()?;
    let stop = offset.saturating_add(budget);
    // Every frame of a segment has the format of its first: in a salted
    // (perhaps recycled) segment, an unsalted frame is stale bytes.
    let salted = segment_is_salted(segment)?;
    while offset + FRAME_HEADER_BYTES <= len {
        if offset >= stop {
            return Ok(Some(offset));
        }
        let mut header = [0u8; FRAME_HEADER_BYTES as usize];
        segment.read(offset, &mut header)?;
        let word = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let body_len = u64::from(word & !SALTED);
        if body_len == 0 || (word & SALTED != 0) != salted || offset + FRAME_HEADER_BYTES + body_len > len {
            return Ok(None);
        }
        let location = Location { segment: id, offset, len: body_len as u32 };
        let Ok(body) = read_frame(segment, location) else { return Ok(None) };
        visit(location, &body)?;
        offset = location.end();
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::crash_disk::CrashDir;

    /// Small segments: the tests' frames fill several.
    const TEST_SEGMENT_BYTES: u64 = 16 * 1024;

    thread_local! {
        /// The planted bug: checksums without the frame's place, so that
        /// a recycled segment's old frames pass for new ones.
        pub(super) static UNSALTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    fn recovered(disk: Arc<dyn SegmentDisk>, from: Option<Position>) -> (SegmentLog, Vec<(Location, Vec<u8>)>) {
        let mut seen = Vec::new();
        let log = SegmentLog::open_sized(disk, from, TEST_SEGMENT_BYTES, |location, body| {
            seen.push((location, body.to_vec()));
            Ok(())
        })
        .unwrap();
        (log, seen)
    }

    #[test]
    fn frames_read_back_where_they_were_appended_and_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let disk = || Arc::new(DirectoryDisk::new(dir.path().to_path_buf()).unwrap()) as Arc<dyn SegmentDisk>;
        let (mut log, seen) = recovered(disk(), None);
        assert!(seen.is_empty());
        let bodies: Vec<Vec<u8>> = (0..100u32).map(|i| vec![i as u8; 1 + i as usize * 37]).collect();
        let locations: Vec<Location> = bodies.iter().map(|b| log.append(b).unwrap()).collect();
        log.sync().unwrap();
        let reader = log.reader();
        for (location, body) in locations.iter().zip(&bodies) {
            assert_eq!(&reader.read(*location).unwrap(), body);
        }
        drop(log);
        let (log, seen) = recovered(disk(), None);
        assert_eq!(seen.iter().map(|(l, _)| *l).collect::<Vec<_>>(), locations);
        assert_eq!(seen.into_iter().map(|(_, b)| b).collect::<Vec<_>>(), bodies);
        // They filled several segments; appends go on in a new one.
        let last = locations.last().unwrap().segment;
        assert!(last >= 2, "{last}");
        assert_eq!(log.position(), Position { segment: last + 1, offset: 0 });
        assert_eq!(log.segments(), (0..=last + 1).collect::<Vec<_>>());
    }

    #[test]
    fn a_checkpoint_skips_what_it_covers_and_old_segments_can_go() {
        let dir = Arc::new(CrashDir::new());
        let (mut log, _) = recovered(dir.clone(), None);
        log.append(b"before").unwrap();
        let checkpoint = log.position();
        let after = log.append(b"after").unwrap();
        log.sync().unwrap();
        drop(log);
        let (mut log, seen) = recovered(dir.clone(), Some(checkpoint));
        assert_eq!(seen, vec![(after, b"after".to_vec())]);
        let late = log.append(b"late").unwrap();
        log.sync().unwrap();
        let older: Vec<u64> = (0..late.segment).collect();
        log.remove(&older).unwrap();
        assert_eq!(log.segments(), vec![late.segment]);
        // Segments before the checkpoint (not scanned) went from the disk too.
        assert_eq!(dir.list().unwrap(), vec![late.segment]);
        assert!(matches!(log.reader().read(after), Err(SegmentError::Missing(_))));
        assert_eq!(log.reader().read(late).unwrap(), b"late");
    }

    #[test]
    fn a_scan_goes_on_where_its_budget_ended() {
        let dir = Arc::new(CrashDir::new());
        let (mut log, _) = recovered(dir.clone(), None);
        let bodies: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100]).collect();
        let locations: Vec<Location> = bodies.iter().map(|b| log.append(b).unwrap()).collect();
        log.sync().unwrap();
        let mut seen = Vec::new();
        let mut from = Some(0);
        let mut steps = 0;
        while let Some(offset) = from {
            from = log
                .scan_segment(0, offset, 250, |location, body| {
                    seen.push((location, body.to_vec()));
                    Ok(())
                })
                .unwrap();
            steps += 1;
        }
        assert_eq!(seen, locations.into_iter().zip(bodies).collect::<Vec<_>>());
        assert!(steps >= 4, "{steps} steps of 250 bytes for 1,080 bytes of frames");
    }

    #[test]
    fn pins_tell_which_epochs_readers_still_hold() {
        let dir = Arc::new(CrashDir::new());
        let (mut log, _) = recovered(dir, None);
        let reader = log.reader();
        let first = reader.pin();
        let epoch = log.next_epoch();
        assert!(log.pinned_before(epoch));
        let second = reader.pin();
        let later = log.next_epoch();
        drop(first);
        assert!(!log.pinned_before(epoch));
        assert!(log.pinned_before(later));
        drop(second);
        assert!(!log.pinned_before(later));
    }

    #[test]
    fn a_frame_larger_than_what_is_left_starts_the_next_segment() {
        let dir = Arc::new(CrashDir::new());
        let (mut log, _) = recovered(dir.clone(), None);
        let big = vec![7u8; (TEST_SEGMENT_BYTES / 2) as usize];
        let first = log.append(&big).unwrap();
        let second = log.append(&big).unwrap();
        let huge = vec![9u8; TEST_SEGMENT_BYTES as usize + 10];
        let third = log.append(&huge).unwrap();
        let fourth = log.append(b"small").unwrap();
        log.sync().unwrap();
        assert_eq!((first.segment, second.segment, third.segment, fourth.segment), (0, 1, 2, 3));
        let reader = log.reader();
        assert_eq!(reader.read(third).unwrap(), huge);
        assert_eq!(reader.read(fourth).unwrap(), b"small");
        drop(log);
        let (_, seen) = recovered(dir, None);
        assert_eq!(seen.iter().map(|(l, _)| *l).collect::<Vec<_>>(), vec![first, second, third, fourth]);
    }

    /// After any power cut, recovery finds a prefix of the appended frames
    /// that includes every frame synced before the cut, each intact, and
    /// appends after the restart never bring back a frame that was lost.
    #[test]
    fn a_power_cut_keeps_every_synced_frame_and_returns_a_prefix() {
        for seed in 0..200u64 {
            if let Err(violation) = power_cut(seed, false, false) {
                panic!("{violation}");
            }
        }
    }

    /// The check above catches a disk whose sync is a lie.
    #[test]
    fn a_lying_disk_fails_the_power_cut_check() {
        assert!((0..50u64).any(|seed| power_cut(seed, true, false).is_err()), "no seed caught the lying disk");
    }

    /// The same in recycled segments, whose earlier life left valid-looking
    /// frames of the same sizes at the same offsets past the new ones.
    #[test]
    fn a_power_cut_in_recycled_segments_returns_a_prefix() {
        for seed in 0..200u64 {
            if let Err(violation) = power_cut(seed, false, true) {
                panic!("{violation}");
            }
        }
    }

    /// The check above catches checksums that do not name the frame's
    /// place (the planted bug): an old frame then passes for a lost one.
    #[test]
    fn unsalted_checksums_fail_the_recycled_power_cut_check() {
        UNSALTED.with(|unsalted| unsalted.set(true));
        let caught = (0..50u64).filter(|seed| power_cut(*seed, false, true).is_err()).count();
        UNSALTED.with(|unsalted| unsalted.set(false));
        // 47 of 50 when written.
        assert!(caught >= 25, "only {caught} of 50 seeds caught the unsalted checksums");
    }

    /// Append (some frames synced), cut the power, recover, append more,
    /// recover again; `Err` says what was lost or reordered. `recycled`:
    /// the frames go to recycled segments, and all have one size.
    fn power_cut(seed: u64, lying: bool, recycled: bool) -> Result<(), String> {
        {
            let dir = Arc::new(if lying { CrashDir::new_lying() } else { CrashDir::new() });
            let (mut log, _) = recovered(dir.clone(), None);
            let body_len = |i: u64| if recycled { 100 + seed % 900 } else { 100 + (i * 7919 + seed) % 3000 } as usize;
            let mut from = None;
            if recycled {
                // An earlier life fills segments 0 to 2, which become
                // spares; segment 3 fills up, and appends go on in the
                // spare that was segment 2.
                while log.active() < 3 {
                    log.append(&vec![0xAA; body_len(0)]).unwrap();
                }
                log.sync().unwrap();
                log.remove(&[0, 1, 2]).unwrap();
                assert_eq!(log.spare_usage(), (3, 0));
                while log.active() < 4 {
                    log.append(&vec![0xBB; body_len(0)]).unwrap();
                }
                log.sync().unwrap();
                assert_eq!(log.spare_usage(), (2, 1));
                from = Some(log.position());
            }
            let mut appended = Vec::new();
            let mut synced = 0;
            for i in 0..(20 + seed % 30) {
                let body = vec![(i % 251) as u8; body_len(i)];
                appended.push((log.append(&body).unwrap(), body));
                if (i + seed) % 5 == 0 {
                    log.write_out().unwrap();
                }
                if (i + seed) % 11 == 0 {
                    log.sync().unwrap();
                    synced = appended.len();
                }
            }
            log.write_out().unwrap();
            let crashed = Arc::new(dir.crash(seed));
            let (mut log, seen) = recovered(crashed.clone(), from);
            if seen.len() < synced {
                return Err(format!("seed {seed}: {} frames back, {synced} were synced", seen.len()));
            }
            if seen.len() > appended.len() || seen != appended[..seen.len()] {
                return Err(format!("seed {seed}: the {} frames back are not a prefix of those appended", seen.len()));
            }
            // Appends after the restart, then another clean restart: the
            // frames lost in the cut stay lost.
            let more = log.append(b"after the cut").unwrap();
            log.sync().unwrap();
            drop(log);
            let (_, again) = recovered(crashed, from);
            let mut expected = seen.clone();
            expected.push((more, b"after the cut".to_vec()));
            assert_eq!(again, expected, "seed {seed}");
        }
        Ok(())
    }

    /// A process killed before its sync leaves frames in the page cache:
    /// the next open sees them and hands them on, so it must make them
    /// durable before a later power cut can take them.
    #[test]
    fn frames_a_restart_saw_survive_a_later_power_cut() {
        for seed in 0..50u64 {
            let dir = Arc::new(CrashDir::new());
            let (mut log, _) = recovered(dir.clone(), None);
            log.append(b"synced").unwrap();
            log.sync().unwrap();
            log.append(b"written, not synced").unwrap();
            log.write_out().unwrap();
            // Killed: no sync, but the same disk (its page cache) stays.
            drop(log);
            let (log, seen) = recovered(dir.clone(), None);
            assert_eq!(seen.len(), 2, "seed {seed}: the restart sees both frames");
            drop(log);
            let (_, after_cut) = recovered(Arc::new(dir.crash(seed)), None);
            assert_eq!(after_cut, seen, "seed {seed}: a frame the restart saw was lost in a later power cut");
        }
    }

    #[test]
    fn freed_segments_are_recycled_up_to_the_bound_and_their_old_frames_stay_dead() {
        let dir = tempfile::tempdir().unwrap();
        let disk = || Arc::new(DirectoryDisk::new(dir.path().to_path_buf()).unwrap()) as Arc<dyn SegmentDisk>;
        let (mut log, _) = recovered(disk(), None);
        let body = vec![1u8; 1000];
        let freed = SPARE_SEGMENTS_MAX as u64 + 2;
        while log.active() < freed {
            log.append(&body).unwrap();
        }
        log.sync().unwrap();
        log.remove(&(0..freed).collect::<Vec<_>>()).unwrap();
        // The bound holds; the rest went.
        assert_eq!(log.spare_usage(), (SPARE_SEGMENTS_MAX as u64, 0));
        assert_eq!(disk().spares().unwrap().len(), SPARE_SEGMENTS_MAX);
        assert_eq!(disk().list().unwrap(), vec![freed]);
        // New segments are spares renamed, written over.
        let checkpoint = log.position();
        let newer: Vec<Vec<u8>> = (0..60u32).map(|i| vec![i as u8 + 2; 999]).collect();
        let locations: Vec<Location> = newer.iter().map(|b| log.append(b).unwrap()).collect();
        log.sync().unwrap();
        assert!(log.active() >= freed + 3, "the frames span several segments");
        let (spares, recycled) = log.spare_usage();
        assert_eq!(spares + recycled, SPARE_SEGMENTS_MAX as u64);
        assert_eq!(recycled, log.active() - freed, "each new segment was a spare");
        let reader = log.reader();
        for (location, body) in locations.iter().zip(&newer) {
            assert_eq!(&reader.read(*location).unwrap(), body);
        }
        drop(log);
        // A restart finds the new frames and none of the old ones (of
        // another size, so misaligned, and at aligned places too).
        let (log, seen) = recovered(disk(), Some(checkpoint));
        assert_eq!(seen.into_iter().map(|(_, b)| b).collect::<Vec<_>>(), newer);
        // (The restart's new segment took a spare, if one was left.)
        assert_eq!(log.spare_usage(), (spares.saturating_sub(1), u64::from(spares > 0)));
    }

    /// A directory whose segments were deleted from outside, leaving a
    /// spare: new ids start again at its old one, so it must not be
    /// reused there (its old frames would pass).
    #[test]
    fn a_spare_is_never_reused_at_or_below_its_old_id() {
        let dir = Arc::new(CrashDir::new());
        let (mut log, _) = recovered(dir.clone(), None);
        while log.active() < 1 {
            log.append(&[5u8; 1000]).unwrap();
        }
        log.sync().unwrap();
        log.remove(&[0]).unwrap();
        drop(log);
        assert_eq!(dir.spares().unwrap(), vec![0]);
        dir.remove(1).unwrap();
        let (mut log, seen) = recovered(dir.clone(), None);
        assert!(seen.is_empty());
        assert_eq!(log.spare_usage(), (0, 0), "the spare went, a new segment 0 was made");
        let location = log.append(b"new").unwrap();
        log.sync().unwrap();
        drop(log);
        let (_, seen) = recovered(dir, None);
        assert_eq!(seen, vec![(location, b"new".to_vec())]);
    }

    #[test]
    fn segments_written_before_salted_checksums_are_read_and_never_recycled() {
        let dir = Arc::new(CrashDir::new());
        // A segment as the last version wrote it: CRC-32C of the body alone.
        let old = dir.create(0, TEST_SEGMENT_BYTES).unwrap();
        let mut offset = 0;
        for body in [&b"first"[..], b"second"] {
            let mut frame = (body.len() as u32).to_le_bytes().to_vec();
            frame.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
            frame.extend_from_slice(body);
            old.write(offset, &frame).unwrap();
            offset += frame.len() as u64;
        }
        old.sync_data().unwrap();
        let (mut log, seen) = recovered(dir.clone(), None);
        assert_eq!(seen.iter().map(|(_, b)| b.as_slice()).collect::<Vec<_>>(), vec![&b"first"[..], b"second"]);
        assert_eq!(log.reader().read(seen[1].0).unwrap(), b"second");
        log.remove(&[0]).unwrap();
        assert_eq!(log.spare_usage(), (0, 0));
        assert!(dir.spares().unwrap().is_empty());
    }

    #[test]
    fn a_damaged_frame_is_reported_not_returned() {
        let dir = Arc::new(CrashDir::new());
        let (mut log, _) = recovered(dir.clone(), None);
        let location = log.append(b"precious").unwrap();
        log.sync().unwrap();
        let segment = dir.open(location.segment).unwrap();
        segment.write(location.offset + FRAME_HEADER_BYTES, b"X").unwrap();
        assert!(matches!(log.reader().read(location), Err(SegmentError::Corrupt(_))));
    }

    #[test]
    fn an_io_error_stops_the_log() {
        let dir = Arc::new(CrashDir::new());
        let (mut log, _) = recovered(dir.clone(), None);
        log.append(b"one").unwrap();
        log.sync().unwrap();
        dir.freeze();
        log.append(b"two").unwrap();
        assert!(matches!(log.sync(), Err(SegmentError::Io(_))));
        assert!(matches!(log.append(b"three"), Err(SegmentError::Poisoned)));
        assert!(matches!(log.sync(), Err(SegmentError::Poisoned)));
    }
}
