//! The last applied snapshot on disk (`<state-dir>/snapshot.bin`), so a restarted proxy
//! serves at once, before any control plane answers (docs/design.md, invariant 6).
//!
//! Format: `HFSNAP01` (8 bytes), payload length (u64 little-endian), SHA-256 of the
//! payload (32 bytes), payload (the protobuf `Snapshot`). Written to a temporary file,
//! fsynced, renamed over the old one, and the directory fsynced, so a crash leaves either
//! the old or the new file, never a mix. On load, anything off (magic, length, checksum,
//! decoding, the snapshot's own validation) rejects the whole file.
//!
//! The file holds the private keys of the snapshot's certificates: the directory is made
//! 0700 and the file is created 0600 (a fresh temporary file each time, never one that
//! was already there).
//!
//! Deltas are appended to a log beside it rather than rewriting it ([`log`]); [`load`]
//! replays the log over the file.

pub mod log;

pub use log::StateFiles;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use holdfast_process::error_chain;
use holdfast_proto::snapshot::{InvalidSnapshot, validate};
use holdfast_proto::v1::Snapshot;
use prost::Message;
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"HFSNAP01";
const HEADER: usize = 8 + 8 + 32;
/// Name of the file inside the state directory.
pub const FILE_NAME: &str = "snapshot.bin";

/// Why a state file was rejected or could not be written (what failed; the cause, where
/// there is one, is the source: log it with `error_chain`).
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Reading or writing failed.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Too short, wrong magic, or wrong length: truncated or not ours.
    #[error("{path}: not a complete holdfast snapshot file ({reason})")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is off.
        reason: String,
    },
    /// The checksum does not match the payload.
    #[error("{path}: checksum mismatch (corrupt file)")]
    Checksum {
        /// The file.
        path: PathBuf,
    },
    /// The payload does not decode.
    #[error("{path}: payload does not decode")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: prost::DecodeError,
    },
    /// The snapshot decodes but is not valid.
    #[error("{path}: snapshot is invalid")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: InvalidSnapshot,
    },
}

/// Path of the state file in `dir`.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Encodes a snapshot as a state file's bytes.
pub fn encode(snapshot: &Snapshot) -> Vec<u8> {
    frame(MAGIC, &snapshot.encode_to_vec())
}

/// `magic`, the payload's length (u64 little-endian), its SHA-256, and the payload: the
/// framing of the state file and of each delta log record.
fn frame(magic: &[u8; 8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

/// Decodes and fully validates a state file's bytes.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Snapshot, PersistError> {
    let malformed = |reason: String| PersistError::Malformed {
        path: path.into(),
        reason,
    };
    if bytes.len() < HEADER {
        return Err(malformed(format!(
            "{} bytes, shorter than the header",
            bytes.len()
        )));
    }
    if &bytes[..8] != MAGIC {
        return Err(malformed("bad magic".into()));
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) as usize;
    let payload = &bytes[HEADER..];
    if payload.len() != len {
        return Err(malformed(format!(
            "payload is {} bytes, header says {len}",
            payload.len()
        )));
    }
    if Sha256::digest(payload).as_slice() != &bytes[16..48] {
        return Err(PersistError::Checksum { path: path.into() });
    }
    let snapshot = Snapshot::decode(payload).map_err(|source| PersistError::Decode {
        path: path.into(),
        source,
    })?;
    validate(&snapshot).map_err(|source| PersistError::Invalid {
        path: path.into(),
        source,
    })?;
    Ok(snapshot)
}

/// Loads the state file in `dir` and replays the delta log over it ([`log::replay`]);
/// `Ok(None)` when there is no state file.
pub fn load(dir: &Path) -> Result<Option<Snapshot>, PersistError> {
    let path = path_in(dir);
    match std::fs::read(&path) {
        Ok(bytes) => decode(&path, &bytes).map(|s| Some(log::replay(dir, s))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PersistError::Io { path, source }),
    }
}

/// Creates the state directory if needed, makes it private (0700), and removes temp
/// files a crash left behind.
pub fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let prefix = format!(".{FILE_NAME}.");
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            tracing::info!(file = %name, "removing a temp file left by an earlier run");
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// A temp file name no other writer uses: process id and a per-process counter.
fn temp_name() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(".{FILE_NAME}.{}.{n}.tmp", std::process::id())
}

/// Writes `snapshot` to the state file in `dir` atomically and durably, readable by this
/// user only (0600), and removes the delta log (its records are for older snapshots).
pub fn store(dir: &Path, snapshot: &Snapshot) -> Result<(), PersistError> {
    store_as(dir, snapshot, &temp_name())
}

fn store_as(dir: &Path, snapshot: &Snapshot, temp: &str) -> Result<(), PersistError> {
    let tmp = write_temp(dir, snapshot, temp)?;
    let path = path_in(dir);
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| PersistError::Io { path: p, source }
    };
    if let Err(e) = std::fs::rename(&tmp, &path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(&path)(e));
    }
    // The new name is made durable before the log goes: a power loss must not leave the
    // old state file without its log. If a crash keeps the log, its records are for other
    // bases and are skipped.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    let log = log::log_path_in(dir);
    match std::fs::remove_file(&log) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => tracing::warn!(error = %error_chain(&error), "cannot remove the delta log"),
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(())
}

/// Writes `snapshot` as a state file to the new temp file `temp` in `dir`, synced;
/// returns its path.
fn write_temp(dir: &Path, snapshot: &Snapshot, temp: &str) -> Result<PathBuf, PersistError> {
    write_temp_bytes(dir, &encode(snapshot), temp)
}

/// Writes `bytes` to the new temp file `temp` in `dir` (0600), synced; returns its path.
fn write_temp_bytes(dir: &Path, bytes: &[u8], temp: &str) -> Result<PathBuf, PersistError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = dir.join(temp);
    // O_EXCL (create_new) and O_NOFOLLOW: the file is always created here, by us, with
    // our mode; nothing already at the path, a symlink included, is written through.
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
    if let Err(e) = written {
        // A full disk leaves a partial file: do not leave it taking space.
        let _ = std::fs::remove_file(&tmp);
        return Err(PersistError::Io {
            path: tmp,
            source: e,
        });
    }
    Ok(tmp)
}

#[cfg(test)]
mod tests {
    use holdfast_proto::snapshot::seal;
    use holdfast_proto::v1::{Backend, MatchKind, Route, VirtualHost};

    use super::*;

    fn sample() -> Snapshot {
        let mut s = Snapshot {
            virtual_hosts: vec![VirtualHost {
                host: "a.example.com".into(),
                routes: vec![Route {
                    match_kind: MatchKind::Prefix as i32,
                    path: "/".into(),
                    backend: "ns/web:80".into(),
                    source: None,
                }],
                ..Default::default()
            }],
            backends: vec![Backend {
                name: "ns/web:80".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        seal(&mut s, 7);
        s
    }

    #[test]
    fn store_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_none());
        store(dir.path(), &sample()).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(sample()));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [FILE_NAME], "no temp file left");
    }

    #[test]
    fn leftover_temp_files_are_removed_at_start_and_a_symlink_is_never_written_through() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        let leftover = dir.join(format!(".{FILE_NAME}.123.0.tmp"));
        std::fs::write(&leftover, b"junk").unwrap();
        prepare_dir(&dir).unwrap();
        assert!(!leftover.exists());

        // A symlink planted at the temp name the next write uses.
        let victim = parent.path().join("victim");
        std::fs::write(&victim, b"untouched").unwrap();
        let name = temp_name();
        std::os::unix::fs::symlink(&victim, dir.join(&name)).unwrap();
        assert!(
            store_as(&dir, &sample(), &name).is_err(),
            "O_EXCL|O_NOFOLLOW refuse the link"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"untouched");
    }

    #[test]
    fn the_state_file_is_0600_in_a_0700_directory_even_over_an_old_readable_file() {
        use std::os::unix::fs::PermissionsExt;
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("state");
        prepare_dir(&dir).unwrap();
        // An earlier version's world-readable file and a leftover temporary file.
        std::fs::write(path_in(&dir), b"old").unwrap();
        std::fs::set_permissions(path_in(&dir), std::fs::Permissions::from_mode(0o644)).unwrap();
        store(&dir, &sample()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path_in(&dir)), 0o600);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(load(&dir).unwrap(), Some(sample()));
    }

    #[test]
    fn truncated_files_are_rejected_at_every_length() {
        let bytes = encode(&sample());
        let p = Path::new("x");
        for len in 0..bytes.len() {
            assert!(
                decode(p, &bytes[..len]).is_err(),
                "accepted a file truncated to {len} bytes"
            );
        }
        assert!(decode(p, &bytes).is_ok());
    }

    #[test]
    fn any_flipped_byte_is_rejected() {
        let bytes = encode(&sample());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(
                decode(Path::new("x"), &bad).is_err(),
                "accepted a flip at byte {i}"
            );
        }
    }

    #[test]
    fn a_file_with_a_valid_checksum_but_an_invalid_snapshot_is_rejected() {
        let mut s = sample();
        s.backends.clear(); // the route now names a missing backend
        let err = decode(Path::new("x"), &encode(&s)).unwrap_err();
        assert!(matches!(err, PersistError::Invalid { .. }), "{err}");
    }
}
