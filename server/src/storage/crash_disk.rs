//! A crash-simulating disk for redb: an in-memory [`redb::StorageBackend`] that keeps the
//! image made durable by the last `sync_data` apart from the writes and length changes issued
//! since, so that a test can pull the power at any moment and get back an image a real disk
//! might hold afterwards: any subset of the unsynced operations, with each write possibly torn
//! at 512-byte sector boundaries.
//!
//! It never touches the file system, never reads a clock, never spawns a thread and draws no
//! randomness of its own: every choice a crash makes comes from the `u64` seed passed to
//! [`CrashDisk::crash`], so a simulation replays exactly.
//!
//! How it is called: give a clone to `redb::Builder::new().create_with_backend(disk.clone())`
//! and keep the other clone. To simulate power loss, `let after = disk.crash(seed);` and reopen
//! `after` the same way. The crash freezes the old handle, so the abandoned `Database` (and
//! the fsync in its `Drop`) can no longer reach any image. [`CrashDisk::freeze`] cuts the
//! power without producing an image (before a simulated process kill, whose destructors would
//! otherwise close redb cleanly); [`CrashDisk::fail_after_writes`] cuts it after the next `n`
//! writes, so the loss can land in the middle of a commit; [`CrashDisk::new_lying`] is a
//! planted bug whose `sync_data` succeeds without making anything durable, for negative
//! controls.

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redb::StorageBackend;

use super::crash_image::Image;

/// The unit a torn write is cut into: each aligned 512-byte sector of a write survives a crash
/// or not on its own, the guarantee (and nothing more) that real disks give.
pub const SECTOR_SIZE: u64 = 512;

/// Why a disk operation failed. Handed to redb wrapped in an [`io::Error`]; recover it with
/// `err.get_ref().and_then(|e| e.downcast_ref::<CrashDiskError>())`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CrashDiskError {
    /// The power is out: the disk was crashed, frozen, or reached its power-loss point.
    #[error("the disk has lost power (crashed, frozen, or past its power-loss point)")]
    Frozen,
    /// A read asked for bytes beyond the end of the disk; redb relies on this failing.
    #[error("read of {len} bytes at offset {offset} runs past the end of the disk ({disk_len} bytes)")]
    ReadPastEnd { offset: u64, len: usize, disk_len: usize },
    /// A write this machine cannot address.
    #[error("{len} bytes at offset {offset} do not fit in the address space")]
    OutOfRange { offset: u64, len: usize },
    /// A length this machine cannot address.
    #[error("a disk of {len} bytes does not fit in the address space")]
    LengthOutOfRange { len: u64 },
    /// The device is full (ENOSPC): no write or change of length succeeds.
    #[error("no space left on the device")]
    Full,
    /// The device fails (EIO): no write, change of length or sync succeeds.
    #[error("input/output error: the device failed")]
    Failed,
}

impl From<CrashDiskError> for io::Error {
    fn from(err: CrashDiskError) -> Self {
        let kind = match err {
            CrashDiskError::Frozen => io::ErrorKind::Other,
            CrashDiskError::ReadPastEnd { .. } => io::ErrorKind::UnexpectedEof,
            CrashDiskError::OutOfRange { .. } | CrashDiskError::LengthOutOfRange { .. } => io::ErrorKind::InvalidInput,
            CrashDiskError::Full => io::ErrorKind::StorageFull,
            CrashDiskError::Failed => io::ErrorKind::Other,
        };
        io::Error::new(kind, err)
    }
}

/// Counters for one disk handle (and its clones); a disk returned by
/// [`CrashDisk::crash`] starts again from zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrashDiskStats {
    /// Successful `write` calls.
    pub writes: u64,
    /// Successful `sync_data` calls, including those a lying disk did not honour.
    pub syncs: u64,
    /// Bytes accepted by successful `write` calls.
    pub bytes_written: u64,
}

/// A cheap, cloneable handle to one simulated disk; all clones share the same state.
#[derive(Clone)]
pub struct CrashDisk {
    state: Arc<Mutex<DiskState>>,
}

impl CrashDisk {
    /// An empty, honest disk.
    pub fn new() -> Self {
        Self::from_state(DiskState::with_image(Image::default(), false))
    }

    /// An empty disk with the planted bug: `sync_data` reports success but makes nothing
    /// durable, so every write stays at the mercy of the next crash.
    pub fn new_lying() -> Self {
        Self::from_state(DiskState::with_image(Image::default(), true))
    }

    /// Turns the planted `sync_data` bug on or off from the next sync onwards.
    pub fn set_lie_about_sync(&self, lie: bool) {
        self.lock().lie_about_sync = lie;
    }

    /// Power loss. Returns a new disk holding the durable image plus, for each pending
    /// operation in issue order, none, all, or (for writes) a random subset of its sectors,
    /// all chosen from `seed`. Freezes this handle so a still-open `Database` cannot touch
    /// anything again. The new disk keeps the lying flag, is not frozen and has no power-loss
    /// point armed. This handle's state is left as it was, so calling `crash` again with other
    /// seeds samples other outcomes of the same power loss; with nothing pending, every seed
    /// gives an exact copy, which is how a test forks a disk.
    pub fn crash(&self, seed: u64) -> CrashDisk {
        let mut state = self.lock();
        state.frozen = true;
        let image = state.image_after_crash(seed);
        Self::from_state(DiskState::with_image(image, state.lie_about_sync))
    }

    /// A process kill (kill -9) rather than power loss: the page cache outlives the process,
    /// so the new disk reads every write issued, and what was not synced is still not durable
    /// (a later `crash` may take it). Freezes this handle, as `crash` does.
    pub fn kill(&self) -> CrashDisk {
        let mut state = self.lock();
        state.frozen = true;
        let mut after = DiskState::with_image(state.durable.clone(), state.lie_about_sync);
        after.current = state.current.clone();
        after.pending = state.pending.clone();
        Self::from_state(after)
    }

    /// Cuts the power: every later `StorageBackend` call on this handle fails. The control
    /// methods (`crash`, `stats`, ...) keep working.
    pub fn freeze(&self) {
        self.lock().frozen = true;
    }

    /// The device fills up: from now on every write and change of length fails with ENOSPC
    /// (reads and syncs of what was written still work). A `kill` or `crash` gives a disk
    /// with room again (the operator freed space).
    pub fn fill(&self) {
        self.lock().full = true;
    }

    /// The device fails: from now on every write, change of length and sync fails with EIO,
    /// and a failed sync forgets what it was to make durable (as Linux's page cache does
    /// after a failed fsync). A `kill` or `crash` gives a working disk again.
    pub fn fail(&self) {
        self.lock().failing = true;
    }

    /// Whether the power is out on this handle.
    pub fn is_frozen(&self) -> bool {
        self.lock().frozen
    }

    /// Arms a power-loss point: after `n` more successful `write` calls the disk freezes, so
    /// the write after them (or the sync that would have made them durable) fails. `n == 0`
    /// freezes at once. Replaces any point armed before.
    pub fn fail_after_writes(&self, n: u64) {
        let mut state = self.lock();
        state.writes_until_power_loss = Some(n);
        state.freeze_if_power_loss_due();
    }

    /// The counters so far.
    pub fn stats(&self) -> CrashDiskStats {
        self.lock().stats
    }

    fn from_state(state: DiskState) -> Self {
        Self { state: Arc::new(Mutex::new(state)) }
    }

    // No code here panics while holding the lock, and if a caller's panic did poison it the
    // state is still consistent (every mutation completes under the lock), so read through it.
    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for CrashDisk {
    fn default() -> Self {
        Self::new()
    }
}

// Hand-written: the derived impl would print every byte of the image, and redb formats its
// backend into its debug log when opening.
impl fmt::Debug for CrashDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("CrashDisk")
            .field("len", &state.current.len())
            .field("durable_len", &state.durable.len())
            .field("pending_ops", &state.pending.len())
            .field("frozen", &state.frozen)
            .field("lie_about_sync", &state.lie_about_sync)
            .field("stats", &state.stats)
            .finish()
    }
}

impl StorageBackend for CrashDisk {
    fn len(&self) -> Result<u64, io::Error> {
        let mut state = self.lock();
        Ok(to_u64(state.powered()?.current.len()))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        Ok(self.lock().powered()?.read(offset, out)?)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        Ok(self.lock().powered()?.set_len(len)?)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        Ok(self.lock().powered()?.sync()?)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        Ok(self.lock().powered()?.write(offset, data)?)
    }

    // Fails too once frozen: a crashed process gets no clean close.
    fn close(&self) -> Result<(), io::Error> {
        self.lock().powered()?;
        Ok(())
    }
}

/// One operation issued since the last sync, in memory-addressable units.
#[derive(Debug, Clone)]
enum PendingOp {
    Write { offset: usize, data: Vec<u8> },
    SetLen(usize),
}

impl PendingOp {
    fn apply(&self, image: &mut Image) {
        match self {
            Self::Write { offset, data } => image.write(*offset, data),
            Self::SetLen(len) => image.resize(*len),
        }
    }

    // A length change is one metadata update, so it cannot tear: it lands or it does not.
    fn apply_torn(&self, image: &mut Image, rng: &mut SplitMix64) {
        match self {
            Self::Write { offset, data } => write_torn(image, *offset, data, rng),
            Self::SetLen(_) if rng.coin() => self.apply(image),
            Self::SetLen(_) => {}
        }
    }
}

struct DiskState {
    /// The bytes as of the last honoured `sync_data`.
    durable: Image,
    /// `durable` with every pending operation applied: what reads see.
    current: Image,
    pending: Vec<PendingOp>,
    frozen: bool,
    lie_about_sync: bool,
    writes_until_power_loss: Option<u64>,
    /// ENOSPC on every write and change of length.
    full: bool,
    /// EIO on every write, change of length and sync.
    failing: bool,
    stats: CrashDiskStats,
}

impl DiskState {
    fn with_image(image: Image, lie_about_sync: bool) -> Self {
        Self {
            current: image.clone(),
            durable: image,
            pending: Vec::new(),
            frozen: false,
            lie_about_sync,
            writes_until_power_loss: None,
            full: false,
            failing: false,
            stats: CrashDiskStats::default(),
        }
    }

    fn powered(&mut self) -> Result<&mut Self, CrashDiskError> {
        if self.frozen {
            return Err(CrashDiskError::Frozen);
        }
        Ok(self)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), CrashDiskError> {
        let (len, disk_len) = (out.len(), self.current.len());
        let past_end = || CrashDiskError::ReadPastEnd { offset, len, disk_len };
        let start = usize::try_from(offset).map_err(|_| past_end())?;
        self.current.read(start, out).ok_or_else(past_end)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), CrashDiskError> {
        if self.failing {
            return Err(CrashDiskError::Failed);
        }
        if self.full {
            return Err(CrashDiskError::Full);
        }
        let out_of_range = || CrashDiskError::OutOfRange { offset, len: data.len() };
        let start = usize::try_from(offset).map_err(|_| out_of_range())?;
        start.checked_add(data.len()).ok_or_else(out_of_range)?;
        let op = PendingOp::Write { offset: start, data: data.to_vec() };
        op.apply(&mut self.current);
        self.pending.push(op);
        self.stats.writes += 1;
        self.stats.bytes_written += to_u64(data.len());
        self.count_write_toward_power_loss();
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> Result<(), CrashDiskError> {
        if self.failing {
            return Err(CrashDiskError::Failed);
        }
        if self.full {
            return Err(CrashDiskError::Full);
        }
        let len = usize::try_from(len).map_err(|_| CrashDiskError::LengthOutOfRange { len })?;
        let op = PendingOp::SetLen(len);
        op.apply(&mut self.current);
        self.pending.push(op);
        Ok(())
    }

    // Replays the pending operations onto the durable image rather than copying `current`,
    // so a sync costs what was written since the last one, not the size of the disk.
    fn sync(&mut self) -> Result<(), CrashDiskError> {
        if self.failing {
            // What this sync was to make durable never will be.
            self.pending.clear();
            return Err(CrashDiskError::Failed);
        }
        self.stats.syncs += 1;
        if self.lie_about_sync {
            return Ok(());
        }
        for op in self.pending.drain(..) {
            op.apply(&mut self.durable);
        }
        Ok(())
    }

    fn count_write_toward_power_loss(&mut self) {
        if let Some(left) = self.writes_until_power_loss.as_mut() {
            *left = left.saturating_sub(1);
        }
        self.freeze_if_power_loss_due();
    }

    fn freeze_if_power_loss_due(&mut self) {
        if self.writes_until_power_loss == Some(0) {
            self.writes_until_power_loss = None;
            self.frozen = true;
        }
    }

    fn image_after_crash(&self, seed: u64) -> Image {
        let mut rng = SplitMix64::new(seed);
        let policy = CrashPolicy::draw(&mut rng);
        let mut image = self.durable.clone();
        for op in &self.pending {
            match policy.fate(&mut rng) {
                Fate::Lost => {}
                Fate::Kept => op.apply(&mut image),
                Fate::Torn => op.apply_torn(&mut image, &mut rng),
            }
        }
        image
    }
}

/// How one crash treats the whole pending list. Independent per-operation choices would
/// almost never keep all or none of a long list, yet "the commit fully landed" and "nothing
/// landed" are the outcomes a checker most needs to see, so each gets a share of the seeds.
#[derive(Debug, Clone, Copy)]
enum CrashPolicy {
    LoseAll,
    KeepAll,
    Mixed,
}

#[derive(Debug, Clone, Copy)]
enum Fate {
    Lost,
    Kept,
    Torn,
}

impl CrashPolicy {
    fn draw(rng: &mut SplitMix64) -> Self {
        match rng.below(4) {
            0 => Self::LoseAll,
            1 => Self::KeepAll,
            _ => Self::Mixed,
        }
    }

    fn fate(self, rng: &mut SplitMix64) -> Fate {
        match self {
            Self::LoseAll => Fate::Lost,
            Self::KeepAll => Fate::Kept,
            Self::Mixed => match rng.below(3) {
                0 => Fate::Lost,
                1 => Fate::Kept,
                _ => Fate::Torn,
            },
        }
    }
}

/// Writes each sector-aligned piece of `data` or not, on a coin flip per piece.
fn write_torn(image: &mut Image, offset: usize, data: &[u8], rng: &mut SplitMix64) {
    let sector = SECTOR_SIZE as usize;
    let end = offset + data.len();
    let mut start = offset;
    while start < end {
        let piece_end = ((start / sector + 1) * sector).min(end);
        if rng.coin() {
            image.write(start, &data[start - offset..piece_end - offset]);
        }
        start = piece_end;
    }
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).expect("usize fits in u64 on supported targets")
}

/// splitmix64: tiny, seedable and good enough to pick crash outcomes; keeps the module free of
/// `rand` so a simulation's only entropy is the seed it passes in.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    // The modulo bias for the tiny bounds used here is below 2^-60.
    fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEEDS: u64 = 256;

    fn contents(disk: &CrashDisk) -> Vec<u8> {
        let mut out = vec![0; usize::try_from(disk.len().unwrap()).unwrap()];
        disk.read(0, &mut out).unwrap();
        out
    }

    fn frozen_error(err: &io::Error) -> bool {
        err.get_ref().and_then(|e| e.downcast_ref::<CrashDiskError>()) == Some(&CrashDiskError::Frozen)
    }

    /// A disk holding `old` durably and a pending overwrite of it with `new`.
    fn overwrite_pending(old: u8, new: u8, len: usize) -> CrashDisk {
        let disk = CrashDisk::new();
        disk.write(0, &vec![old; len]).unwrap();
        disk.sync_data().unwrap();
        disk.write(0, &vec![new; len]).unwrap();
        disk
    }

    #[test]
    fn reads_see_pending_writes_and_length_changes() {
        let disk = CrashDisk::new();
        disk.set_len(8).unwrap();
        disk.write(2, &[1, 2, 3]).unwrap();
        assert_eq!(contents(&disk), [0, 0, 1, 2, 3, 0, 0, 0]);
        disk.set_len(4).unwrap();
        assert_eq!(contents(&disk), [0, 0, 1, 2]);
    }

    #[test]
    fn read_past_end_fails() {
        let disk = CrashDisk::new();
        disk.set_len(4).unwrap();
        let err = disk.read(2, &mut [0; 4]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(disk.read(u64::MAX, &mut [0; 1]).is_err());
    }

    #[test]
    fn write_past_end_grows_with_zeros() {
        let disk = CrashDisk::new();
        disk.write(3, &[9]).unwrap();
        assert_eq!(contents(&disk), [0, 0, 0, 9]);
    }

    #[test]
    fn synced_data_survives_every_crash() {
        let disk = CrashDisk::new();
        disk.set_len(4096).unwrap();
        disk.write(100, &[7; 1000]).unwrap();
        disk.set_len(600).unwrap();
        disk.write(800, &[8; 10]).unwrap();
        disk.sync_data().unwrap();
        let expected = contents(&disk);
        for seed in 0..SEEDS {
            assert_eq!(contents(&disk.crash(seed)), expected, "seed {seed}");
        }
    }

    #[test]
    fn crash_keeps_each_sector_whole_and_sees_all_outcomes() {
        let sectors = 4;
        let disk = overwrite_pending(1, 2, sectors * SECTOR_SIZE as usize);
        let (mut lost, mut kept, mut torn) = (false, false, false);
        for seed in 0..SEEDS {
            let image = contents(&disk.crash(seed));
            for sector in image.chunks(SECTOR_SIZE as usize) {
                assert!(sector.iter().all(|&b| b == sector[0]), "sector split");
            }
            let new = image.chunks(SECTOR_SIZE as usize).filter(|s| s[0] == 2);
            match new.count() {
                0 => lost = true,
                n if n == sectors => kept = true,
                _ => torn = true,
            }
        }
        assert!(lost && kept && torn, "lost {lost} kept {kept} torn {torn}");
    }

    #[test]
    fn torn_writes_split_at_absolute_sector_boundaries() {
        // A write straddling a boundary tears into the piece before it and the piece after.
        let disk = overwrite_pending(1, 2, 1024);
        disk.write(500, &[3; 24]).unwrap();
        for seed in 0..SEEDS {
            let image = contents(&disk.crash(seed));
            assert!(image[500..512].iter().all(|&b| b == image[500]));
            assert!(image[512..524].iter().all(|&b| b == image[512]));
        }
    }

    #[test]
    fn crash_is_deterministic_in_its_seed() {
        let disk = overwrite_pending(1, 2, 8 * SECTOR_SIZE as usize);
        disk.set_len(10_000).unwrap();
        for seed in 0..SEEDS {
            assert_eq!(contents(&disk.crash(seed)), contents(&disk.crash(seed)));
        }
    }

    #[test]
    fn unsynced_length_changes_may_be_lost() {
        let disk = CrashDisk::new();
        disk.set_len(100).unwrap();
        disk.sync_data().unwrap();
        disk.set_len(200).unwrap();
        let lens: Vec<u64> = (0..SEEDS).map(|s| disk.crash(s).len().unwrap()).collect();
        assert!(lens.contains(&100) && lens.contains(&200));
        assert!(lens.iter().all(|&len| len == 100 || len == 200));
    }

    #[test]
    fn crash_freezes_the_old_handle_and_its_clones() {
        let disk = overwrite_pending(1, 2, 16);
        let held_by_redb = disk.clone();
        let after = disk.crash(0);
        assert!(held_by_redb.is_frozen());
        assert!(frozen_error(&held_by_redb.len().unwrap_err()));
        assert!(frozen_error(&held_by_redb.read(0, &mut [0]).unwrap_err()));
        assert!(frozen_error(&held_by_redb.write(0, &[0]).unwrap_err()));
        assert!(frozen_error(&held_by_redb.set_len(0).unwrap_err()));
        assert!(frozen_error(&held_by_redb.sync_data().unwrap_err()));
        assert!(frozen_error(&held_by_redb.close().unwrap_err()));
        assert!(!after.is_frozen());
        after.write(0, &[5]).unwrap();
        after.sync_data().unwrap();
    }

    /// After a kill the new handle reads the unsynced overwrite, which a
    /// later power loss can still take; the old handle is frozen.
    #[test]
    fn a_kill_keeps_the_page_cache_but_not_its_durability() {
        let disk = overwrite_pending(1, 2, 16);
        let after = disk.kill();
        assert!(disk.is_frozen() && !after.is_frozen());
        assert_eq!(contents(&after), vec![2; 16]);
        let outcomes: std::collections::BTreeSet<Vec<u8>> = (0..64).map(|seed| contents(&after.crash(seed))).collect();
        assert!(outcomes.contains(&vec![1; 16]), "a power cut after the kill can lose the unsynced write");
        let after = overwrite_pending(1, 2, 16).kill();
        after.sync_data().unwrap();
        assert!((0..16).all(|seed| contents(&after.crash(seed)) == vec![2; 16]), "synced after the kill: kept");
    }

    /// A failing device refuses writes, syncs and new segments with EIO; a
    /// failed sync forgets what it was to make durable, so a later power
    /// cut keeps only what was synced before; a kill gives a working disk.
    #[test]
    fn a_failing_disk_refuses_writes_and_syncs_and_forgets_the_unsynced() {
        let dir = CrashDir::new();
        use super::super::segments::SegmentDisk;
        let segment = dir.create(0, 16).unwrap();
        segment.write(0, &[7; 16]).unwrap();
        segment.sync_data().unwrap();
        segment.write(0, &[8; 16]).unwrap();
        dir.fail();
        assert!(segment.write(0, &[1]).is_err());
        assert!(segment.sync_data().is_err());
        assert!(dir.create(1, 16).is_err());
        let after = dir.crash(3);
        let mut read = [0u8; 16];
        after.open(0).unwrap().read(0, &mut read).unwrap();
        assert_eq!(read, [7; 16], "the write whose sync failed is not durable");
        let killed = dir.kill();
        killed.open(0).unwrap().write(0, &[9; 16]).unwrap();
        killed.open(0).unwrap().sync_data().unwrap();
    }

    /// A full device refuses writes and new segments with ENOSPC, still
    /// reads and syncs what it holds, and a kill (space freed) writes again.
    #[test]
    fn a_full_disk_refuses_writes_until_space_is_freed() {
        let dir = CrashDir::new();
        use super::super::segments::SegmentDisk;
        let segment = dir.create(0, 16).unwrap();
        segment.write(0, &[7; 16]).unwrap();
        dir.fill();
        let full = |e: io::Error| e.kind() == io::ErrorKind::StorageFull;
        assert!(full(segment.write(0, &[1]).unwrap_err()));
        assert!(full(dir.create(1, 16).err().unwrap()));
        segment.sync_data().unwrap();
        let mut read = [0u8; 16];
        segment.read(0, &mut read).unwrap();
        assert_eq!(read, [7; 16]);
        let freed = dir.kill();
        freed.open(0).unwrap().write(0, &[1]).unwrap();
        freed.create(1, 16).unwrap();
    }

    #[test]
    fn freeze_cuts_the_power_but_crash_still_works() {
        let disk = overwrite_pending(1, 2, 16);
        disk.freeze();
        assert!(frozen_error(&disk.write(0, &[0]).unwrap_err()));
        assert_eq!(contents(&disk.crash(0)).len(), 16);
    }

    #[test]
    fn power_loss_point_freezes_after_n_writes() {
        let disk = CrashDisk::new();
        disk.fail_after_writes(2);
        disk.write(0, &[1]).unwrap();
        assert!(!disk.is_frozen());
        disk.write(1, &[2]).unwrap();
        assert!(disk.is_frozen());
        assert!(frozen_error(&disk.sync_data().unwrap_err()));
        assert_eq!(disk.stats().writes, 2);
    }

    #[test]
    fn power_loss_point_zero_freezes_at_once() {
        let disk = CrashDisk::new();
        disk.fail_after_writes(0);
        assert!(disk.is_frozen());
        assert!(!disk.crash(0).is_frozen(), "the point is not carried over");
    }

    #[test]
    fn honest_sync_is_kept_lying_sync_is_not() {
        let honest = overwrite_pending(1, 2, 16);
        honest.sync_data().unwrap();
        assert!((0..SEEDS).all(|s| contents(&honest.crash(s))[0] == 2));

        let lying = CrashDisk::new_lying();
        lying.write(0, &[2; 16]).unwrap();
        lying.sync_data().unwrap();
        let lost = (0..SEEDS).filter(|&s| contents(&lying.crash(s)).is_empty());
        assert!(lost.count() > 0, "a lying sync must lose data on some crash");
    }

    #[test]
    fn the_lie_can_be_switched_on_later_and_is_inherited() {
        let disk = CrashDisk::new();
        disk.set_lie_about_sync(true);
        disk.write(0, &[1]).unwrap();
        disk.sync_data().unwrap();
        let after = disk.crash(0);
        after.write(0, &[1]).unwrap();
        after.sync_data().unwrap();
        let lost = (0..SEEDS).filter(|&s| contents(&after.crash(s)).is_empty());
        assert!(lost.count() > 0, "the crashed disk must still lie");
    }

    #[test]
    fn stats_count_successful_calls() {
        let disk = CrashDisk::new();
        disk.write(0, &[0; 10]).unwrap();
        disk.write(10, &[0; 5]).unwrap();
        disk.sync_data().unwrap();
        disk.freeze();
        let _ = disk.write(0, &[0; 100]);
        let expected = CrashDiskStats { writes: 2, syncs: 1, bytes_written: 15 };
        assert_eq!(disk.stats(), expected);
    }

    #[test]
    fn debug_output_omits_the_image() {
        let disk = CrashDisk::new();
        disk.write(0, &[0xAB; 4096]).unwrap();
        assert!(format!("{disk:?}").len() < 300);
    }
}

/// The segment log's files on crash disks: one [`CrashDisk`] per segment
/// or spare. Creating, removing, retiring and reusing a segment is durable
/// at once (the real directory syncs itself after each). Cloning shares
/// the files.
#[derive(Debug, Clone, Default)]
pub struct CrashDir {
    files: Arc<Mutex<std::collections::BTreeMap<u64, CrashDisk>>>,
    /// Retired segments, by the id they had.
    spare_files: Arc<Mutex<std::collections::BTreeMap<u64, CrashDisk>>>,
    /// The device is full: no segment can be created (see [`CrashDisk::fill`]).
    full: Arc<std::sync::atomic::AtomicBool>,
    /// The device fails: no segment can be created (see [`CrashDisk::fail`]).
    failing: Arc<std::sync::atomic::AtomicBool>,
    /// The planted bug of [`CrashDisk::new_lying`], for every segment.
    lying: bool,
}

impl CrashDir {
    /// An empty, honest directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty directory whose segments lie about `sync_data`.
    pub fn new_lying() -> Self {
        CrashDir { lying: true, ..Self::default() }
    }

    fn files(&self) -> MutexGuard<'_, std::collections::BTreeMap<u64, CrashDisk>> {
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn spare_files(&self) -> MutexGuard<'_, std::collections::BTreeMap<u64, CrashDisk>> {
        self.spare_files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every file, segments then spares.
    fn every_file(&self) -> Vec<CrashDisk> {
        self.files().values().chain(self.spare_files().values()).cloned().collect()
    }

    /// The directory after `fate` befell every file (a spare `id` draws
    /// as segment `id` did).
    fn after(&self, fate: impl Fn(u64, &CrashDisk) -> CrashDisk) -> CrashDir {
        let files = self.files().iter().map(|(id, disk)| (*id, fate(*id, disk))).collect();
        let spare_files = self.spare_files().iter().map(|(id, disk)| (*id, fate(*id, disk))).collect();
        CrashDir {
            files: Arc::new(Mutex::new(files)),
            spare_files: Arc::new(Mutex::new(spare_files)),
            lying: self.lying,
            full: Arc::default(),
            failing: Arc::default(),
        }
    }

    /// Power loss for every segment (see [`CrashDisk::crash`]); segment `id`
    /// draws from `seed ^ id`.
    pub fn crash(&self, seed: u64) -> CrashDir {
        self.after(|id, disk| disk.crash(seed ^ id))
    }

    /// Turns the planted `sync_data` bug on or off for every segment made
    /// so far (see [`CrashDisk::set_lie_about_sync`]); later segments lie
    /// as the directory was made to.
    pub fn set_lie_about_sync(&self, lie: bool) {
        self.every_file().iter().for_each(|disk| disk.set_lie_about_sync(lie));
    }

    /// The device fills up, for every segment and for segments not yet made.
    pub fn fill(&self) {
        self.full.store(true, std::sync::atomic::Ordering::SeqCst);
        self.every_file().iter().for_each(CrashDisk::fill);
    }

    /// The device fails (EIO), for every segment and for segments not yet made.
    pub fn fail(&self) {
        self.failing.store(true, std::sync::atomic::Ordering::SeqCst);
        self.every_file().iter().for_each(CrashDisk::fail);
    }

    /// A process kill for every segment (see [`CrashDisk::kill`]).
    pub fn kill(&self) -> CrashDir {
        self.after(|_, disk| disk.kill())
    }

    /// Cut the power of every segment.
    pub fn freeze(&self) {
        self.every_file().iter().for_each(CrashDisk::freeze);
    }

    /// Whether any segment has lost power.
    pub fn is_frozen(&self) -> bool {
        self.every_file().iter().any(CrashDisk::is_frozen)
    }

    /// Arm a power-loss point on every existing segment.
    pub fn fail_after_writes(&self, n: u64) {
        self.every_file().iter().for_each(|disk| disk.fail_after_writes(n));
    }

    /// The device refuses directory changes once it fails.
    fn check_device(&self) -> io::Result<()> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(CrashDiskError::Failed.into());
        }
        Ok(())
    }
}

impl super::segments::SegmentDisk for CrashDir {
    fn create(&self, id: u64, len: u64) -> io::Result<Arc<dyn StorageBackend>> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(CrashDiskError::Failed.into());
        }
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(CrashDiskError::Full.into());
        }
        let disk = CrashDisk::new();
        disk.set_len(len)?;
        disk.sync_data()?;
        disk.set_lie_about_sync(self.lying);
        self.files().insert(id, disk.clone());
        Ok(Arc::new(disk))
    }

    fn open(&self, id: u64) -> io::Result<Arc<dyn StorageBackend>> {
        let disk = self.files().get(&id).cloned().ok_or(io::ErrorKind::NotFound)?;
        if disk.is_frozen() {
            return Err(CrashDiskError::Frozen.into());
        }
        Ok(Arc::new(disk))
    }

    fn remove(&self, id: u64) -> io::Result<()> {
        let mut files = self.files();
        if files.get(&id).is_some_and(CrashDisk::is_frozen) {
            return Err(CrashDiskError::Frozen.into());
        }
        files.remove(&id);
        Ok(())
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        Ok(self.files().keys().copied().collect())
    }

    fn retire(&self, id: u64) -> io::Result<()> {
        self.check_device()?;
        let mut files = self.files();
        let disk = files.get(&id).cloned().ok_or(io::ErrorKind::NotFound)?;
        if disk.is_frozen() {
            return Err(CrashDiskError::Frozen.into());
        }
        files.remove(&id);
        self.spare_files().insert(id, disk);
        Ok(())
    }

    fn reuse(&self, spare: u64, id: u64) -> io::Result<Arc<dyn StorageBackend>> {
        self.check_device()?;
        let disk = {
            let mut spares = self.spare_files();
            let disk = spares.get(&spare).cloned().ok_or(io::ErrorKind::NotFound)?;
            if disk.is_frozen() {
                return Err(CrashDiskError::Frozen.into());
            }
            spares.remove(&spare);
            disk
        };
        // A later segment lies as the directory was made to.
        disk.set_lie_about_sync(self.lying);
        // (Locks in one order: segments, then spares.)
        self.files().insert(id, disk.clone());
        Ok(Arc::new(disk))
    }

    fn remove_spare(&self, spare: u64) -> io::Result<()> {
        let mut spares = self.spare_files();
        if spares.get(&spare).is_some_and(CrashDisk::is_frozen) {
            return Err(CrashDiskError::Frozen.into());
        }
        spares.remove(&spare);
        Ok(())
    }

    fn spares(&self) -> io::Result<Vec<u64>> {
        Ok(self.spare_files().keys().copied().collect())
    }
}

/// A broker's whole simulated disk: its redb database and its segment
/// log, losing power together.
#[derive(Debug, Clone, Default)]
pub struct NodeDisk {
    pub database: CrashDisk,
    pub segments: CrashDir,
}

impl NodeDisk {
    pub fn new() -> Self {
        Self::default()
    }

    /// Both parts lie about `sync_data` (the planted bug).
    pub fn new_lying() -> Self {
        NodeDisk { database: CrashDisk::new_lying(), segments: CrashDir::new_lying() }
    }

    /// Turns the planted `sync_data` bug on or off for both parts (see
    /// [`CrashDir::set_lie_about_sync`]): a test's way to make a power cut
    /// drop writes the broker believed durable.
    pub fn set_lie_about_sync(&self, lie: bool) {
        self.database.set_lie_about_sync(lie);
        self.segments.set_lie_about_sync(lie);
    }

    /// Power loss for both parts (see [`CrashDisk::crash`]).
    pub fn crash(&self, seed: u64) -> NodeDisk {
        NodeDisk { database: self.database.crash(seed), segments: self.segments.crash(seed.rotate_left(17)) }
    }

    /// The device fills up (see [`CrashDisk::fill`]).
    pub fn fill(&self) {
        self.database.fill();
        self.segments.fill();
    }

    /// The device fails (see [`CrashDisk::fail`]).
    pub fn fail(&self) {
        self.database.fail();
        self.segments.fail();
    }

    /// A process kill for both parts (see [`CrashDisk::kill`]).
    pub fn kill(&self) -> NodeDisk {
        NodeDisk { database: self.database.kill(), segments: self.segments.kill() }
    }

    pub fn freeze(&self) {
        self.database.freeze();
        self.segments.freeze();
    }

    pub fn is_frozen(&self) -> bool {
        self.database.is_frozen() || self.segments.is_frozen()
    }

    /// Arm a power-loss point after `n` more writes on the database and
    /// on each segment.
    pub fn fail_after_writes(&self, n: u64) {
        self.database.fail_after_writes(n);
        self.segments.fail_after_writes(n);
    }
}
