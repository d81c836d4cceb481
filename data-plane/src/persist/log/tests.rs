use holdfast_proto::delta::{diff, inventory};
use holdfast_proto::snapshot::seal;
use holdfast_proto::v1::{Backend, MatchKind, Route, VirtualHost};

use super::*;
use crate::persist::{load, store};

/// A snapshot routing `hosts` hosts (each `/` to one backend), revision `revision`.
fn snapshot(hosts: usize, revision: u64) -> Snapshot {
    let mut s = Snapshot {
        virtual_hosts: (0..hosts)
            .map(|i| VirtualHost {
                host: format!("h{i:04}.example.test"),
                routes: vec![Route {
                    match_kind: MatchKind::Prefix as i32,
                    path: format!("/r{revision}"),
                    backend: "ns/web:80".into(),
                    source: None,
                }],
                ..Default::default()
            })
            .collect(),
        backends: vec![Backend {
            name: "ns/web:80".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    seal(&mut s, revision);
    s
}

/// A chain: `base` (40 hosts) and `n` snapshots each changing one host's route.
fn chain(n: usize) -> (Snapshot, Vec<(SnapshotDelta, Snapshot)>) {
    let base = snapshot(40, 1);
    let mut out = Vec::new();
    let mut current = base.clone();
    for step in 0..n {
        let mut next = current.clone();
        next.virtual_hosts[step % 40].routes[0].path = format!("/step{step}");
        seal(&mut next, 2 + step as u64);
        let d = diff(&current.version, &inventory(&current), &next);
        out.push((d, next.clone()));
        current = next;
    }
    (base, out)
}

fn files(dir: &Path) -> StateFiles {
    StateFiles::new(dir.to_path_buf(), Counter::default())
}

#[test]
fn deltas_appended_to_the_log_are_replayed_over_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let (base, steps) = chain(3);
    let f = files(dir.path());
    f.store(&base).unwrap();
    for (d, next) in &steps {
        f.append(d).unwrap();
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(next));
    }
    // Only the records were written: the state file is still the base.
    let on_disk = std::fs::read(path_in(dir.path())).unwrap();
    assert_eq!(on_disk, super::super::encode(&base));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(log_path_in(dir.path()))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_torn_or_corrupt_record_ends_the_log_and_the_log_is_cut_there() {
    let (base, steps) = chain(3);
    let records: Vec<Vec<u8>> = steps.iter().map(|(d, _)| record(d)).collect();
    let whole: Vec<u8> = records.concat();
    let first_two = records[0].len() + records[1].len();
    // Torn anywhere inside the third record: the second snapshot, cut at its end.
    for cut in first_two..whole.len() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), &base).unwrap();
        std::fs::write(log_path_in(dir.path()), &whole[..cut]).unwrap();
        assert_eq!(
            load(dir.path()).unwrap().as_ref(),
            Some(&steps[1].1),
            "cut at {cut}"
        );
        assert_eq!(len_of(&log_path_in(dir.path())), first_two as u64);
        // New records follow good ones.
        files(dir.path()).append(&steps[2].0).unwrap();
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&steps[2].1));
    }
    // A flipped byte in the second record: the first snapshot.
    for i in records[0].len()..first_two {
        let mut bad = whole.clone();
        bad[i] ^= 0x20;
        let (got, good, _) = replay_bytes(base.clone(), &bad);
        assert_eq!(
            (got, good),
            (steps[0].1.clone(), records[0].len()),
            "flip at {i}"
        );
    }
}

#[test]
fn records_for_other_bases_are_skipped_and_a_complete_snapshot_removes_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (base, steps) = chain(4);
    let f = files(dir.path());
    f.store(&base).unwrap();
    for (d, _) in &steps[..2] {
        f.append(d).unwrap();
    }
    // A crash between a compaction's renames: the state file is the second snapshot,
    // the log still starts with the records folded into it, and one more follows.
    super::super::store_as(dir.path(), &steps[1].1, "manual.tmp").unwrap();
    let log: Vec<u8> = steps[..3].iter().flat_map(|(d, _)| record(d)).collect();
    std::fs::write(log_path_in(dir.path()), &log).unwrap();
    assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&steps[2].1));

    // A complete snapshot replaces both.
    let f = files(dir.path());
    f.store(&steps[3].1).unwrap();
    assert!(!log_path_in(dir.path()).exists());
    assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&steps[3].1));
    // A log a crash left behind after one: every record is for an older base.
    std::fs::write(log_path_in(dir.path()), &log).unwrap();
    assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&steps[3].1));
}

#[test]
fn once_the_log_outgrows_the_state_file_it_is_compacted_and_later_records_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (base, steps) = chain(200);
    let compactions = Counter::default();
    let f = StateFiles::new(dir.path().to_path_buf(), compactions.clone());
    f.store(&base).unwrap();
    let state_len = len_of(&path_in(dir.path()));
    for (d, _) in &steps {
        f.append(d).unwrap();
    }
    assert!(f.wait_compacted(std::time::Duration::from_secs(30)));
    assert!(compactions.get() >= 1, "no compaction");
    assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&steps[199].1));
    // The log stays bounded by about the state file's size.
    assert!(
        len_of(&log_path_in(dir.path())) <= 2 * state_len,
        "log {} state {state_len} compactions {}",
        len_of(&log_path_in(dir.path())),
        compactions.get()
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
}

#[test]
fn a_compaction_that_a_complete_snapshot_overtook_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (base, steps) = chain(2);
    let f = files(dir.path());
    f.store(&base).unwrap();
    f.append(&steps[0].0).unwrap();
    let (generation, offset) = {
        let files = f.lock();
        (files.generation, files.log_len)
    };
    let stale = Compaction {
        dir: dir.path().to_path_buf(),
        files: f.files.clone(),
        version: steps[0].1.version.clone(),
        generation,
        offset,
        compactions: Counter::default(),
    };
    // A resync writes a complete snapshot before the compaction finishes.
    f.store(&steps[1].1).unwrap();
    assert!(!stale.compact().unwrap());
    assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&steps[1].1));
}

#[test]
fn a_log_that_is_not_as_written_gets_no_appends_until_a_complete_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (base, steps) = chain(3);
    let f = files(dir.path());
    f.store(&base).unwrap();
    f.append(&steps[0].0).unwrap();
    // Something else lengthened the log (a removal or a cut that failed, say): appending
    // after it could leave a record no restart reaches, so it is refused.
    let mut bytes = std::fs::read(log_path_in(dir.path())).unwrap();
    bytes.extend_from_slice(b"garbage");
    std::fs::write(log_path_in(dir.path()), &bytes).unwrap();
    let refused = f.append(&steps[1].0);
    assert!(
        matches!(refused, Err(PersistError::Malformed { .. })),
        "{refused:?}"
    );
    // The applier then writes the snapshot whole, and appends go on from there.
    f.store(&steps[1].1).unwrap();
    f.append(&steps[2].0).unwrap();
    assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&steps[2].1));
}

#[test]
fn a_symlink_in_place_of_the_log_is_never_followed() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    let (base, steps) = chain(1);
    store(&dir, &base).unwrap();
    let victim = parent.path().join("victim");
    std::fs::write(&victim, b"not a log, and untouched").unwrap();
    std::os::unix::fs::symlink(&victim, log_path_in(&dir)).unwrap();
    // The load neither reads nor cuts through it: it removes the link (only the link).
    assert_eq!(load(&dir).unwrap(), Some(base.clone()));
    assert_eq!(std::fs::read(&victim).unwrap(), b"not a log, and untouched");
    assert!(std::fs::symlink_metadata(log_path_in(&dir)).is_err());
    // Appending never writes through a link planted later either.
    std::os::unix::fs::symlink(&victim, log_path_in(&dir)).unwrap();
    let f = files(&dir);
    assert!(f.append(&steps[0].0).is_err());
    assert_eq!(std::fs::read(&victim).unwrap(), b"not a log, and untouched");
}
