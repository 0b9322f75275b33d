//! Writes a blob of the local (`file://`) backend straight to the disk, around the page
//! cache.
//!
//! Why: through the page cache every byte of a value is copied into new page-cache
//! pages, and that copy was 46% of the server's CPU in a 1 MiB PUT (docs/BENCHMARKS.md
//! "Large PUTs around the page cache"): new pages are memory the process has not
//! touched, and on a virtual machine whose host backs guest memory lazily each one is a
//! fault on the host as well. A value just written is not more likely to be read at
//! once than any other, so caching it at write time only evicts what readers use. Here
//! the bytes go from a reused buffer to the disk (`O_DIRECT`) in units aligned to 4 KiB,
//! one unit on its way to the disk while the next one fills; the last, partial unit is
//! padded with zeros and the file cut back to its size. A blob smaller than one unit
//! (256 KiB) goes through the page cache as before: there the copy is small
//! beside the `fsync`, and cutting a padded write back would cost a metadata change.
//! Where the filesystem refuses `O_DIRECT` (EINVAL), the same writes go through the
//! page cache, for this blob and every later one.
//!
//! A blob is published as object_store's local store publishes one, so reads, listings
//! and the sweep see no difference: written to a staging file `KEY#N` beside it,
//! `fsync`ed, renamed into place, its folder `fsync`ed (and any folder made for it).

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::read_buffers::{CHUNK_BYTES, ReadBuffers};

/// What `O_DIRECT` asks of offsets, lengths and memory (the logical block size is 512
/// or 4096 on the disks this runs on; 4096 suits both).
const ALIGN: usize = 4096;

/// `O_DIRECT` where the server knows it (Linux); elsewhere every write is buffered.
#[cfg(target_os = "linux")]
const O_DIRECT: i32 = libc::O_DIRECT;
#[cfg(not(target_os = "linux"))]
const O_DIRECT: i32 = 0;

/// Whether a blob folder takes `O_DIRECT` writes; starts true (on Linux) and turns false
/// for good at the first refusal (shared by the writers of one store).
#[derive(Clone)]
pub struct DirectWrites(Arc<DirectState>);

struct DirectState {
    enabled: AtomicBool,
    /// Bytes written with `O_DIRECT` so far (for tests: that the path is taken).
    bytes: AtomicU64,
}

impl DirectWrites {
    pub fn new(enabled: bool) -> Self {
        Self(Arc::new(DirectState {
            enabled: AtomicBool::new(enabled && O_DIRECT != 0),
            bytes: AtomicU64::new(0),
        }))
    }

    pub fn enabled(&self) -> bool {
        self.0.enabled.load(Ordering::Relaxed)
    }

    fn refused(&self, folder: &Path, error: &io::Error) {
        if self.0.enabled.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                folder = %folder.display(),
                %error,
                "the blob folder refuses direct writes (O_DIRECT): blobs are written through the page cache"
            );
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.0.bytes.load(Ordering::Relaxed)
    }
}

/// One blob being written. [`LocalBlobWriter::finish`] publishes it;
/// [`LocalBlobWriter::abort`], dropping it or a failed write removes what was written.
pub struct LocalBlobWriter {
    dest: PathBuf,
    direct: DirectWrites,
    buffers: Arc<ReadBuffers>,
    /// The unit being filled.
    filling: Unit,
    /// The staging file, once made; taken by the unit on its way to the disk.
    staging: Option<Staging>,
    /// The unit on its way to the disk; it gives the staging file and its buffer back
    /// (or, failing, has removed the staging file).
    in_flight: Option<JoinHandle<io::Result<(Staging, Unit)>>>,
    /// Bytes handed to the disk before `filling`.
    written: u64,
    /// A write failed: the blob has a hole, nothing more may be written or published.
    failed: bool,
}

impl LocalBlobWriter {
    pub fn new(dest: PathBuf, direct: DirectWrites, buffers: Arc<ReadBuffers>) -> Self {
        Self {
            filling: Unit::new(&buffers),
            dest,
            direct,
            buffers,
            staging: None,
            in_flight: None,
            written: 0,
            failed: false,
        }
    }

    pub async fn write(&mut self, chunk: Bytes) -> io::Result<()> {
        self.usable()?;
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let taken = self.filling.fill(rest);
            rest = &rest[taken..];
            if self.filling.is_full() {
                // Failed until it returns: a write cancelled half-way leaves a hole.
                self.failed = true;
                self.send_filled().await?;
                self.failed = false;
            }
        }
        Ok(())
    }

    fn usable(&self) -> io::Result<()> {
        match self.failed {
            true => Err(io::Error::other("an earlier write of this blob failed")),
            false => Ok(()),
        }
    }

    /// Sends the full unit to the disk once the one before it got there, and fills the
    /// buffer that one gives back.
    async fn send_filled(&mut self) -> io::Result<()> {
        let next = match self.landed().await? {
            Some(unit) => unit,
            None => Unit::new(&self.buffers),
        };
        let unit = std::mem::replace(&mut self.filling, next);
        let offset = self.written;
        self.written += unit.len() as u64;
        let (staging, dest, direct) = (self.staging.take(), self.dest.clone(), self.direct.clone());
        self.in_flight = Some(tokio::task::spawn_blocking(move || {
            let mut staging = match staging {
                Some(staging) => staging,
                None => Staging::create(&dest, &direct, true)?,
            };
            match staging.write(&unit, offset, &direct) {
                Ok(()) => Ok((staging, unit)),
                Err(e) => {
                    staging.discard();
                    Err(e)
                }
            }
        }));
        Ok(())
    }

    /// Waits for the unit on its way to the disk; its buffer, emptied, when there was one.
    async fn landed(&mut self) -> io::Result<Option<Unit>> {
        // Awaited in place: a future dropped meanwhile (a cancelled request) leaves the
        // unit where `Drop` finds it and removes its staging file.
        let Some(task) = self.in_flight.as_mut() else {
            return Ok(None);
        };
        let joined = task.await;
        self.in_flight = None;
        let (staging, mut unit) = joined.map_err(io::Error::other)??;
        self.staging = Some(staging);
        unit.clear();
        Ok(Some(unit))
    }

    /// Writes what is left, makes the blob durable and publishes it under its key.
    pub async fn finish(mut self) -> io::Result<()> {
        self.usable()?;
        if let Some(unit) = self.landed().await? {
            unit.give_back(&self.buffers);
        }
        let mut last = std::mem::replace(&mut self.filling, Unit::empty());
        let (staging, dest, direct) = (self.staging.take(), self.dest.clone(), self.direct.clone());
        let (offset, buffers) = (self.written, self.buffers.clone());
        tokio::task::spawn_blocking(move || {
            let staging = match staging {
                Some(staging) => staging,
                // Smaller than a unit: through the page cache, where a small write costs
                // less than cutting a padded one back (and is likelier to be read again
                // soon).
                None => Staging::create(&dest, &direct, false)?,
            };
            let published = staging.publish(&mut last, offset, &direct, &dest);
            last.give_back(&buffers);
            published
        })
        .await
        .map_err(io::Error::other)?
    }

    /// Drops the blob: its staging file is removed.
    pub async fn abort(mut self) {
        // A unit that failed has removed the file itself.
        if let Some(task) = self.in_flight.as_mut() {
            let joined = task.await;
            self.in_flight = None;
            if let Ok(Ok((staging, unit))) = joined {
                unit.give_back(&self.buffers);
                self.staging = Some(staging);
            }
        }
        let filling = std::mem::replace(&mut self.filling, Unit::empty());
        filling.give_back(&self.buffers);
        if let Some(staging) = self.staging.take() {
            let _ = tokio::task::spawn_blocking(move || staging.discard()).await;
        }
    }
}

impl Drop for LocalBlobWriter {
    fn drop(&mut self) {
        // Outside a runtime (never in the server) the sweep removes the file later.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some(task) = self.in_flight.take() {
            runtime.spawn(async move {
                if let Ok(Ok((staging, _))) = task.await {
                    let _ = tokio::task::spawn_blocking(move || staging.discard()).await;
                }
            });
        }
        if let Some(staging) = self.staging.take() {
            drop(runtime.spawn_blocking(move || staging.discard()));
        }
    }
}

/// A buffer from the pool whose bytes from `start` on sit at an address aligned for
/// `O_DIRECT`; it holds up to `capacity` bytes there (a multiple of [`ALIGN`]).
struct Unit {
    buffer: Vec<u8>,
    start: usize,
    capacity: usize,
}

impl Unit {
    fn new(buffers: &ReadBuffers) -> Self {
        let mut buffer = buffers.take();
        // The pool's buffers are large allocations: page-aligned but for malloc's header.
        let start = (ALIGN - buffer.as_ptr().addr() % ALIGN) % ALIGN;
        buffer.resize(start, 0);
        // A whole chunk where the pool's room allows (a 1 MiB value is four units and
        // no partial one); a multiple of ALIGN in any case.
        let capacity = ((buffer.capacity() - start) / ALIGN * ALIGN).min(CHUNK_BYTES);
        Self {
            buffer,
            start,
            capacity,
        }
    }

    fn empty() -> Self {
        Self {
            buffer: Vec::new(),
            start: 0,
            capacity: 0,
        }
    }

    /// Takes what fits of `bytes`; how many it took.
    fn fill(&mut self, bytes: &[u8]) -> usize {
        let taken = bytes.len().min(self.capacity - self.len());
        self.buffer.extend_from_slice(&bytes[..taken]);
        taken
    }

    fn len(&self) -> usize {
        self.buffer.len() - self.start
    }

    fn is_full(&self) -> bool {
        self.len() == self.capacity
    }

    fn bytes(&self) -> &[u8] {
        &self.buffer[self.start..]
    }

    fn clear(&mut self) {
        self.buffer.truncate(self.start);
    }

    /// Pads the bytes with zeros to a multiple of [`ALIGN`] (there is room: the
    /// capacity is one).
    fn pad(&mut self) {
        let padded = self.len().div_ceil(ALIGN) * ALIGN;
        self.buffer.resize(self.start + padded, 0);
    }

    fn give_back(self, buffers: &ReadBuffers) {
        buffers.give_back(self.buffer);
    }
}

/// The staging file a blob is written to before it is renamed into place.
struct Staging {
    file: File,
    path: PathBuf,
    /// Opened with `O_DIRECT`.
    direct: bool,
}

impl Staging {
    /// A new staging file `DEST#N` (the first N free), making `dest`'s folder if needed;
    /// opened for direct writes if `try_direct` and the folder takes them.
    fn create(dest: &Path, direct: &DirectWrites, try_direct: bool) -> io::Result<Self> {
        let folder = dest.parent().unwrap_or(Path::new("/"));
        // The folder can go between its making and the open (object_store removes a
        // user's empty folder with its last blob): made again, a few times.
        let mut folders_made = 0;
        let mut n = 1u32;
        loop {
            let mut path = dest.as_os_str().to_owned();
            path.push(format!("#{n}"));
            let path = PathBuf::from(path);
            let use_direct = try_direct && direct.enabled();
            match open_new(&path, use_direct) {
                Ok(file) => {
                    return Ok(Self {
                        file,
                        path,
                        direct: use_direct,
                    });
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => n += 1,
                Err(e) if e.kind() == ErrorKind::NotFound && folders_made < 3 => {
                    make_folders(folder)?;
                    folders_made += 1;
                }
                Err(e) if use_direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    // Linux made the file before it refused the flag: ours (O_EXCL), so
                    // removed, and the same name taken again without it.
                    let _ = std::fs::remove_file(&path);
                    direct.refused(folder, &e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes `unit` (a multiple of [`ALIGN`] unless it is the last) at `offset`.
    fn write(&mut self, unit: &Unit, offset: u64, direct: &DirectWrites) -> io::Result<()> {
        let bytes = unit.bytes();
        let mut done = 0;
        while done < bytes.len() {
            match self.file.write_at(&bytes[done..], offset + done as u64) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if self.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    // An aligned write refused: the folder does not take O_DIRECT after
                    // all. A short write leaves the rest unaligned: only this file goes
                    // on through the page cache.
                    if done == 0 {
                        direct.refused(self.path.parent().unwrap_or(&self.path), &e);
                    }
                    self.file = OpenOptions::new().write(true).open(&self.path)?;
                    self.direct = false;
                }
                Err(e) => return Err(e),
            }
        }
        if self.direct {
            direct.0.bytes.fetch_add(done as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Writes the last bytes, makes the file durable and renames it to `dest`; on an
    /// error the staging file is removed.
    fn publish(
        mut self,
        last: &mut Unit,
        offset: u64,
        direct: &DirectWrites,
        dest: &Path,
    ) -> io::Result<()> {
        let size = offset + last.len() as u64;
        let written = if self.direct && !last.len().is_multiple_of(ALIGN) {
            last.pad();
            self.write(last, offset, direct)
                .and_then(|()| self.file.set_len(size))
        } else if last.len() > 0 {
            self.write(last, offset, direct)
        } else {
            Ok(())
        };
        let Staging { file, path, .. } = self;
        let durable = written.and_then(|()| file.sync_all());
        // Closed before the rename (some filesystems, NFS among them, commit there).
        drop(file);
        if let Err(e) = durable.and_then(|()| std::fs::rename(&path, dest)) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        sync_folder(dest.parent().unwrap_or(Path::new("/")))
    }

    /// Removes the staging file (the blob is not to be).
    fn discard(self) {
        let Staging { file, path, .. } = self;
        drop(file);
        let _ = std::fs::remove_file(&path);
    }
}

fn open_new(path: &Path, direct: bool) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(if direct { O_DIRECT } else { 0 })
        .open(path)
}

/// Makes `folder` and any missing parent, each one's parent `fsync`ed so its entry
/// survives a crash (also when another writer made it first: its fsync may not have
/// happened yet).
fn make_folders(folder: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = folder;
    while !at.exists() {
        missing.push(at);
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    for made in missing.into_iter().rev() {
        match std::fs::create_dir(made) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        sync_folder(made.parent().unwrap_or(Path::new("/")))?;
    }
    Ok(())
}

fn sync_folder(folder: &Path) -> io::Result<()> {
    File::open(folder)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a unit of the pool's buffers holds.
    fn unit_bytes() -> usize {
        let buffers = ReadBuffers::default();
        Unit::new(&buffers).capacity
    }

    fn value(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// The names in `folder`, sorted.
    fn names(folder: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(folder)
            .map(|read| {
                read.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// A writer of `dest` with a pool of its own.
    fn writer_of(dest: &Path, direct: &DirectWrites) -> LocalBlobWriter {
        LocalBlobWriter::new(
            dest.to_owned(),
            direct.clone(),
            Arc::new(ReadBuffers::default()),
        )
    }

    async fn write(dest: &Path, direct: &DirectWrites, bytes: &[u8], chunk: usize) {
        let mut writer = writer_of(dest, direct);
        for piece in bytes.chunks(chunk.max(1)) {
            writer
                .write(Bytes::copy_from_slice(piece))
                .await
                .expect("write");
        }
        writer.finish().await.expect("finish");
    }

    /// Whether `folder`'s filesystem takes `O_DIRECT`.
    fn takes_direct(folder: &Path) -> bool {
        let probe = folder.join("probe");
        let taken = open_new(&probe, true).is_ok();
        let _ = std::fs::remove_file(probe);
        taken && O_DIRECT != 0
    }

    #[tokio::test]
    async fn blobs_of_every_size_read_back_whole_direct_or_not() {
        let unit = unit_bytes();
        assert_eq!(unit, CHUNK_BYTES, "a unit is a whole chunk");
        let sizes = [
            0,
            1,
            ALIGN - 1,
            ALIGN,
            ALIGN + 1,
            unit - 1,
            unit,
            unit + 1,
            3 * unit + 17,
        ];
        for enabled in [true, false] {
            let dir = tempfile::tempdir().expect("temp dir");
            let direct = DirectWrites::new(enabled);
            for (i, &size) in sizes.iter().enumerate() {
                let bytes = value(size);
                for (j, chunk) in [size, 1000, 7 * 1024 + 3].into_iter().enumerate() {
                    // A folder of its own, made by the writer, like a user's first blob.
                    let folder = dir.path().join(format!("u{i}-{j}"));
                    let dest = folder.join("blob");
                    write(&dest, &direct, &bytes, chunk).await;
                    let read = std::fs::read(&dest).expect("read the blob");
                    assert!(
                        read == bytes,
                        "{size} bytes in chunks of {chunk}: read back differs"
                    );
                    assert_eq!(names(&folder), ["blob"], "no staging file is left");
                }
            }
            if !enabled {
                assert_eq!(direct.bytes(), 0, "off means off");
            } else if takes_direct(dir.path()) {
                // Every unit went around the page cache; only blobs smaller than one
                // (and tails) did not.
                assert!(direct.enabled(), "the folder takes O_DIRECT: still on");
                // Blobs of a unit or more: their units, and their tail padded to ALIGN.
                let units: usize = sizes
                    .iter()
                    .filter(|&&size| size >= unit)
                    .map(|size| size / unit * unit + (size % unit).div_ceil(ALIGN) * ALIGN)
                    .sum();
                assert!(
                    direct.bytes() == 3 * units as u64,
                    "{} bytes direct",
                    direct.bytes()
                );
            } else {
                eprintln!(
                    "{} does not take O_DIRECT: written through the page cache",
                    dir.path().display()
                );
            }
        }
    }

    #[tokio::test]
    async fn an_aborted_or_dropped_blob_leaves_no_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let direct = DirectWrites::new(true);
        let unit = unit_bytes();
        let dest = dir.path().join("aborted");
        let mut writer = writer_of(&dest, &direct);
        writer
            .write(Bytes::from(value(2 * unit + 5)))
            .await
            .expect("write");
        assert_eq!(
            names(dir.path()),
            ["aborted#1"],
            "written to a staging file"
        );
        writer.abort().await;
        assert!(names(dir.path()).is_empty());

        let dest = dir.path().join("dropped");
        let mut writer = writer_of(&dest, &direct);
        // Dropped with a unit on its way to the disk (the request's future dropped).
        writer
            .write(Bytes::from(value(unit + 1)))
            .await
            .expect("write");
        assert!(writer.in_flight.is_some());
        drop(writer);
        for _ in 0..100 {
            if names(dir.path()).is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!(
            "a dropped writer's staging file is still there: {:?}",
            names(dir.path())
        );
    }

    #[tokio::test]
    async fn a_failed_write_removes_its_staging_file_and_refuses_more() {
        let dir = tempfile::tempdir().expect("temp dir");
        let dest = dir.path().join("blob");
        let unit = unit_bytes();
        let mut writer = writer_of(&dest, &DirectWrites::new(true));
        // A staging file that cannot be written (opened read-only): the disk failing.
        let path = dir.path().join("blob#1");
        std::fs::write(&path, b"").expect("write");
        writer.staging = Some(Staging {
            file: File::open(&path).expect("open"),
            path,
            direct: false,
        });
        writer.write(Bytes::from(value(unit))).await.expect("sent");
        let failed = writer.write(Bytes::from(value(unit))).await;
        assert!(failed.is_err(), "the first unit's failure is told");
        assert!(names(dir.path()).is_empty(), "its staging file is gone");
        assert!(writer.write(Bytes::from_static(b"x")).await.is_err());
        assert!(
            writer.finish().await.is_err(),
            "a blob with a hole is not published"
        );
        assert!(names(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn a_staging_name_in_use_is_passed_over() {
        let dir = tempfile::tempdir().expect("temp dir");
        let dest = dir.path().join("blob");
        // Left by a crash: not touched, the sweep's to remove.
        std::fs::write(dir.path().join("blob#1"), b"left").expect("write");
        write(&dest, &DirectWrites::new(true), b"value", 5).await;
        assert_eq!(std::fs::read(&dest).expect("read"), b"value");
        assert_eq!(
            std::fs::read(dir.path().join("blob#1")).expect("read"),
            b"left"
        );
    }

    #[test]
    fn a_refused_direct_write_goes_through_the_page_cache_from_then_on() {
        let dir = tempfile::tempdir().expect("temp dir");
        let dest = dir.path().join("blob");
        let direct = DirectWrites::new(true);
        let mut staging = Staging::create(&dest, &direct, true).expect("staging file");
        if !staging.direct {
            eprintln!("skipped: {} does not take O_DIRECT", dir.path().display());
            return;
        }
        // Memory O_DIRECT cannot take (one byte off the alignment): the kernel says EINVAL.
        let buffers = ReadBuffers::default();
        let mut unit = Unit::new(&buffers);
        unit.start += 1;
        unit.capacity -= ALIGN;
        unit.buffer.push(0);
        assert_eq!(unit.fill(&value(ALIGN)), ALIGN);
        staging
            .write(&unit, 0, &direct)
            .expect("written all the same");
        if staging.direct {
            // tmpfs (Linux 6.6 on) and btrfs take any memory: nothing to refuse there.
            eprintln!(
                "skipped: {} takes unaligned direct writes",
                dir.path().display()
            );
            return;
        }
        assert!(
            !staging.direct && !direct.enabled(),
            "direct writes are off now"
        );
        let mut last = Unit::new(&buffers);
        last.fill(b"tail");
        staging
            .publish(&mut last, ALIGN as u64, &direct, &dest)
            .expect("published");
        let mut expected = value(ALIGN);
        expected.extend_from_slice(b"tail");
        assert_eq!(std::fs::read(&dest).expect("read"), expected);
        assert_eq!(names(dir.path()), ["blob"]);
        // The next blob does not try again.
        let next = Staging::create(&dir.path().join("next"), &direct, true).expect("staging file");
        assert!(!next.direct);
        next.discard();

        // Refused at the padded last write, once the earlier units went direct: the
        // tail through the page cache, the file still cut to its size.
        let direct = DirectWrites::new(true);
        let dest = dir.path().join("tail");
        let mut staging = Staging::create(&dest, &direct, true).expect("staging file");
        assert!(staging.direct);
        let mut first = Unit::new(&buffers);
        first.fill(&value(ALIGN));
        staging.write(&first, 0, &direct).expect("an aligned write");
        let mut last = Unit::new(&buffers);
        last.start += 1;
        last.capacity -= ALIGN;
        last.buffer.push(0);
        last.fill(b"tail");
        staging
            .publish(&mut last, ALIGN as u64, &direct, &dest)
            .expect("published");
        assert!(!direct.enabled());
        assert_eq!(std::fs::read(&dest).expect("read"), expected);
        assert_eq!(names(dir.path()), ["blob", "tail"], "no staging file left");
    }
}
