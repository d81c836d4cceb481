//! The delta log beside the state file (`<state-dir>/deltas.log`): each delta the proxy
//! applies is appended as one checksummed record before it is ACKed, so persisting a
//! change costs O(change), not a rewrite of the whole snapshot (the etcd WAL pattern).
//!
//! A record has the state file's framing: `HFDELTA1` (8 bytes), payload length (u64
//! little-endian), SHA-256 of the payload (32 bytes), payload (the protobuf
//! `SnapshotDelta`). It is appended with `O_APPEND` and `fdatasync`ed.
//!
//! **Load** ([`replay`]): the state file, then, in order, every intact record whose base
//! is the snapshot loaded so far, applied and verified exactly as a received delta is
//! (content hash, references, never backwards). Records for another base are skipped:
//! they are the ones a compaction already folded into the state file. The first torn or
//! corrupt record ends the log, and the file is cut there, so new records never follow
//! garbage.
//!
//! **Compaction** ([`StateFiles::append`]): once the log is larger than the state file,
//! a thread of its own re-reads the state file and the log's records so far, replays them
//! (verified, as a load does) and writes the snapshot they lead to as a new state file,
//! while deltas keep being appended (the applier never builds the whole snapshot). Then, under the lock appends take, the records
//! appended meanwhile are copied into a new log, and the new state file and then the new
//! log are renamed into place. A crash between the two renames leaves the new state file
//! with the old log, whose records up to it are skipped and the rest applied. A complete
//! snapshot written meanwhile (a resync) wins, and that compaction is dropped.
//!
//! **Complete snapshots** ([`StateFiles::store`]) replace the state file and remove the
//! log.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use holdfast_lock::Lock;
use holdfast_process::error_chain;
use holdfast_proto::delta;
use holdfast_proto::v1::{Snapshot, SnapshotDelta};
use prometheus_client::metrics::counter::Counter;
use prost::Message;
use sha2::{Digest, Sha256};

use super::{HEADER, PersistError, path_in, temp_name};

/// Name of the log inside the state directory.
pub const LOG_NAME: &str = "deltas.log";
const MAGIC: &[u8; 8] = b"HFDELTA1";

/// Path of the log in `dir`.
pub fn log_path_in(dir: &Path) -> PathBuf {
    dir.join(LOG_NAME)
}

/// One record's bytes.
pub fn record(delta: &SnapshotDelta) -> Vec<u8> {
    super::frame(MAGIC, &delta.encode_to_vec())
}

/// The delta of the intact record at the start of `bytes`, and the record's length;
/// `None` if it is torn, corrupt or not a record.
fn read_record(bytes: &[u8]) -> Option<(SnapshotDelta, usize)> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let len = usize::try_from(u64::from_le_bytes(bytes[8..16].try_into().ok()?)).ok()?;
    let end = HEADER.checked_add(len)?;
    let payload = bytes.get(HEADER..end)?;
    if Sha256::digest(payload).as_slice() != &bytes[16..HEADER] {
        return None;
    }
    Some((SnapshotDelta::decode(payload).ok()?, end))
}

/// `snapshot` (the state file's) brought forward by the log in `dir`: see the module
/// documentation. Never fails: a log that cannot be read, or a bad record, ends the
/// replay there, and what was verified up to then is returned.
pub fn replay(dir: &Path, snapshot: Snapshot) -> Snapshot {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = log_path_in(dir);
    // One handle, never through a symlink, to read and (if need be) cut the log.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path);
    let mut bytes = Vec::new();
    let file = match opened.and_then(|mut f| f.read_to_end(&mut bytes).map(|_| f)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return snapshot,
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), "cannot read the delta log; serving the state file alone and removing the log");
            remove_unusable_log(&path);
            return snapshot;
        }
    };
    let (current, good, applied) = replay_bytes(snapshot, &bytes);
    if good < bytes.len() {
        tracing::warn!(
            applied,
            dropped_bytes = bytes.len() - good,
            "the delta log ends in a torn or unusable record; cutting it there"
        );
        if let Err(error) = file.set_len(good as u64).and_then(|()| file.sync_all()) {
            // New records must never follow garbage.
            tracing::warn!(error = %error_chain(&error), "cannot cut the delta log; removing it");
            remove_unusable_log(&path);
        }
    } else if applied > 0 {
        tracing::info!(applied, version = %current.version, "replayed the delta log");
    }
    current
}

/// Removes a log that cannot be read or cut (what it held is lost; the state file is
/// served, and the next snapshot is written whole).
fn remove_unusable_log(path: &Path) {
    if let Err(error) = std::fs::remove_file(path)
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::error!(error = %error_chain(&error), "cannot remove the unusable delta log; appends are refused until a complete snapshot is written");
    }
}

/// [`replay`] over the log's bytes: the snapshot reached, how many bytes are good
/// records, and how many records were applied.
pub fn replay_bytes(snapshot: Snapshot, bytes: &[u8]) -> (Snapshot, usize, usize) {
    let hashed = delta::Hashed::of(&snapshot);
    let mut held = delta::Held::new(snapshot, hashed);
    let (mut at, mut applied) = (0, 0);
    while at < bytes.len() {
        let Some((change, len)) = read_record(&bytes[at..]) else {
            break;
        };
        if change.base_version == held.version() {
            match held.check(&change) {
                Ok(checked) if change.cluster_revision >= held.cluster_revision() => {
                    held.commit(&change, checked);
                    applied += 1;
                }
                // Verified records do not fail; one that does ends the log.
                _ => break,
            }
        }
        at += len;
    }
    (held.to_snapshot(), at, applied)
}

/// The state directory's two files, written by one applier: complete snapshots, deltas
/// appended, and the compaction between them.
pub struct StateFiles {
    dir: PathBuf,
    files: Arc<Mutex<Files>>,
    compactions: Counter,
}

/// What the writers share.
#[derive(Debug, Default)]
struct Files {
    /// Bumped by every complete snapshot written; a compaction started before one is
    /// dropped.
    generation: u64,
    /// Size of the state file and of the log.
    snapshot_len: u64,
    log_len: u64,
    /// A compaction is running.
    compacting: bool,
    /// The version the log leads to (its last record's).
    log_version: String,
}

/// Starts a compaction in the background if the log has outgrown the state file and
/// none is running.
fn maybe_compact(f: &mut Files, dir: &Path, files: &Arc<Mutex<Files>>, compactions: &Counter) {
    if f.log_len <= f.snapshot_len || f.compacting || f.log_version.is_empty() {
        return;
    }
    f.compacting = true;
    let job = Compaction {
        dir: dir.to_path_buf(),
        files: files.clone(),
        version: f.log_version.clone(),
        generation: f.generation,
        offset: f.log_len,
        compactions: compactions.clone(),
    };
    let spawned = std::thread::Builder::new()
        .name("state-compaction".into())
        .spawn(move || job.run());
    if let Err(error) = spawned {
        tracing::warn!(error = %error_chain(&error), "cannot start the state file compaction");
        f.compacting = false;
    }
}

impl StateFiles {
    /// The files in `dir`; `compactions` counts finished compactions.
    pub fn new(dir: PathBuf, compactions: Counter) -> Self {
        let files = Files {
            snapshot_len: len_of(&path_in(&dir)),
            log_len: len_of(&log_path_in(&dir)),
            ..Files::default()
        };
        StateFiles {
            dir,
            files: Arc::new(Mutex::new(files)),
            compactions,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Files> {
        self.files.locked()
    }

    /// Reads the files' sizes again (after a load, which may cut the log).
    pub fn refresh(&self) {
        let mut f = self.lock();
        f.snapshot_len = len_of(&path_in(&self.dir));
        f.log_len = len_of(&log_path_in(&self.dir));
    }

    /// Writes `snapshot` as the state file and removes the log.
    pub fn store(&self, snapshot: &Snapshot) -> Result<(), PersistError> {
        let mut f = self.lock();
        f.generation += 1;
        let stored = super::store(&self.dir, snapshot);
        // The files are the truth (the log may have failed to go).
        f.snapshot_len = len_of(&path_in(&self.dir));
        f.log_len = len_of(&log_path_in(&self.dir));
        stored
    }

    /// Appends `change` to the log, durably. Once the log is larger than the state file,
    /// it is compacted into a new state file in the background: O(change) here.
    pub fn append(&self, change: &SnapshotDelta) -> Result<(), PersistError> {
        let mut f = self.lock();
        let bytes = record(change);
        append_bytes(&self.dir, f.log_len, &bytes)?;
        f.log_len += bytes.len() as u64;
        f.log_version = change.version.clone();
        maybe_compact(&mut f, &self.dir, &self.files, &self.compactions);
        Ok(())
    }

    /// Waits until no compaction is running (tests).
    pub fn wait_compacted(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.lock().compacting {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }
}

/// The size of the file at `path` (0 if there is none).
fn len_of(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Appends `bytes` to the log in `dir`, which is `len` bytes long, and syncs it; a
/// failed write is cut off again so the log never ends in half a record.
fn append_bytes(dir: &Path, len: u64, bytes: &[u8]) -> Result<(), PersistError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = log_path_in(dir);
    let io = |source| PersistError::Io {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&path)
        .map_err(io)?;
    // Only ever append to the log as this proxy wrote it: anything else (a log that could
    // not be removed or cut) is refused, and the snapshot is written whole instead.
    let on_disk = file.metadata().map_err(io)?.len();
    if on_disk != len {
        return Err(PersistError::Malformed {
            path: path.clone(),
            reason: format!("{on_disk} bytes, but {len} were written to it"),
        });
    }
    let written = file.write_all(bytes).and_then(|()| file.sync_data());
    if let Err(e) = written {
        let _ = file.set_len(len);
        return Err(io(e));
    }
    if len == 0 {
        // A new log: its directory entry must be durable too.
        File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

/// One compaction: the log's first `offset` bytes lead to snapshot `version`.
struct Compaction {
    dir: PathBuf,
    files: Arc<Mutex<Files>>,
    version: String,
    generation: u64,
    offset: u64,
    compactions: Counter,
}

impl Compaction {
    fn run(self) {
        let result = self.compact();
        let mut f = self.files.locked();
        f.compacting = false;
        match result {
            Ok(true) => {
                self.compactions.inc();
                // What was appended meanwhile may have outgrown the new state file.
                maybe_compact(&mut f, &self.dir, &self.files, &self.compactions);
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "state file compaction failed; the log keeps growing until the next one")
            }
        }
    }

    /// The snapshot the state file and the log's first `offset` bytes make, re-read
    /// from the files and verified as at start (so the applier never materialises the
    /// whole snapshot per delta).
    fn replayed(&self) -> Result<Snapshot, PersistError> {
        let path = path_in(&self.dir);
        let bytes = std::fs::read(&path).map_err(|source| PersistError::Io {
            path: path.clone(),
            source,
        })?;
        let base = super::decode(&path, &bytes)?;
        let log = log_path_in(&self.dir);
        let records = std::fs::read(&log).map_err(|source| PersistError::Io {
            path: log.clone(),
            source,
        })?;
        let prefix =
            records
                .get(..self.offset as usize)
                .ok_or_else(|| PersistError::Malformed {
                    path: log.clone(),
                    reason: "shorter than the records appended to it".into(),
                })?;
        let (snapshot, good, _) = replay_bytes(base, prefix);
        if good != prefix.len() || snapshot.version != self.version {
            return Err(PersistError::Malformed {
                path: log,
                reason: format!(
                    "replays to {} over {good} of {} bytes, not to {}",
                    snapshot.version,
                    prefix.len(),
                    self.version
                ),
            });
        }
        Ok(snapshot)
    }

    /// Ok(false): dropped, because a complete snapshot was written meanwhile.
    fn compact(&self) -> Result<bool, PersistError> {
        let generation = || self.files.locked().generation;
        let snapshot = match self.replayed() {
            Ok(s) => s,
            // The files were replaced under it by a complete snapshot: nothing to do.
            Err(_) if generation() != self.generation => return Ok(false),
            Err(e) => return Err(e),
        };
        let snapshot_tmp = super::write_temp(&self.dir, &snapshot, &temp_name())?;
        let mut f = self.files.locked();
        let done = (|| {
            if f.generation != self.generation {
                return Ok(false);
            }
            // The records appended since the compaction began.
            let log = log_path_in(&self.dir);
            let io = |p: &Path| {
                let p = p.to_path_buf();
                move |source| PersistError::Io { path: p, source }
            };
            let bytes = std::fs::read(&log).map_err(io(&log))?;
            if bytes.len() as u64 != f.log_len {
                return Err(PersistError::Malformed {
                    path: log.clone(),
                    reason: format!(
                        "{} bytes, but {} were written to it",
                        bytes.len(),
                        f.log_len
                    ),
                });
            }
            let rest = bytes
                .get(self.offset as usize..f.log_len as usize)
                .ok_or_else(|| PersistError::Malformed {
                    path: log.clone(),
                    reason: "shorter than the records appended to it".into(),
                })?;
            let log_tmp = super::write_temp_bytes(&self.dir, rest, &temp_name())?;
            // The new state file's name is made durable before the log is replaced: a
            // power loss must not leave the new log with the old state file.
            let sync_dir = || {
                File::open(&self.dir)
                    .and_then(|d| d.sync_all())
                    .map_err(io(&self.dir))
            };
            let renamed = std::fs::rename(&snapshot_tmp, path_in(&self.dir))
                .map_err(io(&path_in(&self.dir)))
                .and_then(|()| sync_dir())
                .and_then(|()| std::fs::rename(&log_tmp, &log).map_err(io(&log)))
                .and_then(|()| sync_dir());
            // The files are the truth, whatever happened.
            f.snapshot_len = len_of(&path_in(&self.dir));
            f.log_len = len_of(&log);
            if let Err(e) = renamed {
                let _ = std::fs::remove_file(&log_tmp);
                return Err(e);
            }
            Ok(true)
        })();
        drop(f);
        if !matches!(done, Ok(true)) {
            let _ = std::fs::remove_file(&snapshot_tmp);
        }
        done
    }
}

#[cfg(test)]
mod tests;
