//! Taking a std lock in holdfast: a lock whose holder panicked is taken as it is.
//!
//! Every state behind a holdfast lock stays valid between statements (a counter, a map, a
//! queue), so a panic in one task must not take the lock, and with it every other task
//! that needs it, down too. [`Lock`] is the one way the workspace takes a `Mutex` or an
//! `RwLock`; `lock().unwrap()` and a hand-written poison recovery are not used.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A `Mutex` taken even when an earlier holder panicked.
pub trait Lock<T: ?Sized> {
    /// The guard, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Lock<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An `RwLock` taken even when an earlier writer panicked.
pub trait ReadWrite<T: ?Sized> {
    /// A shared guard, poisoned or not.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// The exclusive guard, poisoned or not.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWrite<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_mutex_whose_holder_panicked_is_taken_with_what_it_holds() {
        let shared = Arc::new(Mutex::new(1));
        let holder = Arc::clone(&shared);
        let panicked = std::thread::spawn(move || {
            let mut value = holder.locked();
            *value = 2;
            panic!("the holder panics");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*shared.locked(), 2);
        *shared.locked() = 3;
        assert_eq!(*shared.locked(), 3);
    }

    #[test]
    fn an_rwlock_whose_writer_panicked_is_read_and_written() {
        let shared = Arc::new(RwLock::new(vec![1]));
        let writer = Arc::clone(&shared);
        let panicked = std::thread::spawn(move || {
            writer.write_locked().push(2);
            let _held = writer.write_locked();
            panic!("the writer panics");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*shared.read_locked(), [1, 2]);
        shared.write_locked().push(3);
        assert_eq!(*shared.read_locked(), [1, 2, 3]);
    }
}
