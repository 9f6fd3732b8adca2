//! The snapshots and iterators handed to Python, per database: a database's `close` releases
//! every one still alive, so none outlives the engine it reads, whoever still holds it.

use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, Weak};

/// Locks `m`; a panic elsewhere cannot leave the guarded values half-changed (weak handles,
/// counters), so a poisoned lock is used as it is.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Read-locks `l`, poisoned or not (as [`lock`]).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// Something a database releases when it closes.
pub(crate) trait Release {
    fn release(&self);
}

/// A database's live views, held weakly so a view Python dropped is gone at once.
pub(crate) struct Views<T>(Mutex<Vec<Weak<T>>>);

impl<T: Release> Views<T> {
    pub(crate) fn new() -> Self {
        Views(Mutex::new(Vec::new()))
    }

    /// Remembers `view` (forgetting views already dropped, so the list stays bounded by the
    /// live ones).
    pub(crate) fn register(&self, view: &Arc<T>) {
        let mut views = lock(&self.0);
        views.retain(|v| v.strong_count() > 0);
        views.push(Arc::downgrade(view));
    }

    /// Releases every view still alive and forgets them all.
    pub(crate) fn release_all(&self) {
        for view in lock(&self.0).drain(..) {
            if let Some(view) = view.upgrade() {
                view.release();
            }
        }
    }
}
