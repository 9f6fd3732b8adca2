//! What the key-value tests share: whether this build has the LevelDB engine. A test that needs
//! it and finds it missing skips through `kura_testkit`, for the capability `libleveldb-dev`, so
//! the skip is printed and logged, and under CI (which installs libleveldb-dev and allows no such
//! skip) fails the run instead of passing as green.

use kura_testkit::Missing;

/// `Some` when kura-kv was built without LevelDB (libleveldb-dev missing, or `KURA_NO_LEVELDB`).
pub fn leveldb_missing() -> Option<Missing> {
    (!kura_kv::leveldb_available()).then(|| {
        Missing::new(
            "libleveldb-dev",
            "kura-kv was built without Google LevelDB (libleveldb-dev missing at build time, or \
             KURA_NO_LEVELDB=1): apt-get install libleveldb-dev and rebuild",
        )
    })
}
