//! An AccelFS ingest target (`kura ingest serve --dev SPEC /path`, `docs/ingest-protocol.md`
//! §10): each record is a file `/path/records/<id as 16 hex digits>` and the index is a
//! LevelDB database on the same file system (`/path/index`, through `kura-kv`), key `r` +
//! id (8 bytes, big-endian) → the 64-byte entry of §6 (`offset` 0, `generation` 0), plus key `n`
//! → the next id.
//!
//! A batch is stored as: the record files written, one AccelFS commit (`sync`), then one
//! LevelDB write of all entries and the next id with `sync` — only then are they acknowledged.
//! A crash before the LevelDB write leaves files nobody indexes; a writable open removes files
//! whose id is at or above the next id. Where `kura-kv` was built without LevelDB the open says
//! so before it mounts anything ([`FsTargetError::NoLevelDb`]; there is no second index
//! format).
//!
//! [`FsStore::open_read_only`] (`kura ingest get|ls --dev`) never writes the device: the file
//! system is mounted read-only (its journal replayed in memory), and since LevelDB writes a
//! lock and a new log at every open, the index files are copied to a scratch directory on the
//! host and opened there; the copy is removed at close. Orphan files are left alone (they are
//! not in the index, so nothing shows them).

use crate::layout::Entry;
use crate::session::Stage;
use kura_accelfs::{FileSystem, FsError, MountOptions};
use kura_engine::crc32c::crc32c;
use kura_engine::{BlockDevice, IoBuf};
use kura_kv::{Db, DbOptions, KvError, Location, WriteBatch};

/// Why an AccelFS target operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsTargetError {
    #[error("file system: {0}")]
    Fs(#[from] FsError),
    #[error("index (LevelDB): {0}")]
    Kv(#[from] KvError),
    #[error("no record with id {0}")]
    NoSuchRecord(u64),
    #[error("damaged index or record: {0}")]
    Damaged(String),
    #[error(
        "an AccelFS ingest target keeps its index in LevelDB, and this build's kura-kv has none \
         (libleveldb-dev was missing at build time, or KURA_NO_LEVELDB was set): install \
         libleveldb-dev and rebuild, or use a raw device target"
    )]
    NoLevelDb,
}

const NEXT_KEY: &[u8] = b"n";

fn key(id: u64) -> [u8; 9] {
    let mut k = [b'r'; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// A record for [`FsStore::store_batch`]: its stored bytes in buffers and its entry fields.
#[derive(Debug)]
pub struct FsRecord<'a> {
    pub chunks: &'a [IoBuf],
    pub stored_len: u64,
    pub orig_len: u64,
    pub crc: u32,
    pub stage: u8,
    pub label: u8,
    pub seq: u64,
}

/// An opened AccelFS target.
pub struct FsStore {
    fs: FileSystem,
    db: Option<Db>,
    dir: String,
    next_id: u64,
    /// Read-only opens: the host directory holding the copy of the index.
    scratch: Option<std::path::PathBuf>,
}

impl Drop for FsStore {
    fn drop(&mut self) {
        drop(self.db.take());
        if let Some(dir) = self.scratch.take() {
            // Best effort: a copy left in the temp directory harms nothing.
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Normalises a target directory: `/path` without a trailing slash, `""` for the root.
fn target_dir(dir: &str) -> String {
    let dir = format!("/{}", dir.trim_matches('/'));
    if dir == "/" {
        String::new()
    } else {
        dir
    }
}

impl std::fmt::Debug for FsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsStore")
            .field("dir", &self.dir)
            .field("next_id", &self.next_id)
            .finish()
    }
}

impl FsStore {
    /// Mounts the AccelFS on `dev` (formatted with `kura mkfs`), opens or creates the target
    /// in directory `dir`, and removes record files a crash left unindexed.
    pub fn open(dev: Box<dyn BlockDevice>, dir: &str) -> Result<FsStore, FsTargetError> {
        if !kura_kv::leveldb_available() {
            return Err(FsTargetError::NoLevelDb);
        }
        let fs = FileSystem::mount(dev, MountOptions::default())?;
        let dir = target_dir(dir);
        fs.create_dir_all(&format!("{dir}/records"))?;
        let db = Db::open(
            Location::AccelFs {
                fs: fs.clone(),
                path: format!("{dir}/index"),
            },
            &DbOptions::default(),
        )?;
        let next_id = next_id(&db)?;
        let store = FsStore {
            fs,
            db: Some(db),
            dir,
            next_id,
            scratch: None,
        };
        let mut removed = 0;
        for e in store.fs.read_dir(&format!("{}/records", store.dir))? {
            let name = e.name_lossy();
            if u64::from_str_radix(&name, 16).is_ok_and(|id| id >= store.next_id) {
                store.fs.remove_file(&store.record_path_named(&name))?;
                removed += 1;
            }
        }
        if removed > 0 {
            store.fs.sync()?;
        }
        Ok(store)
    }

    /// Opens the target in `dir` on `dev` for reading without writing the device (see the
    /// module docs): a read-only mount, and the index copied to a host scratch directory.
    pub fn open_read_only(dev: Box<dyn BlockDevice>, dir: &str) -> Result<FsStore, FsTargetError> {
        if !kura_kv::leveldb_available() {
            return Err(FsTargetError::NoLevelDb);
        }
        let fs = FileSystem::mount_read_only(dev, MountOptions::default())?;
        let dir = target_dir(dir);
        let index = format!("{dir}/index");
        let files = fs.read_dir(&index)?;
        let scratch = std::env::temp_dir().join(format!(
            "kura-ingest-index-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let copy = || -> std::io::Result<Result<(), FsError>> {
            std::fs::create_dir(&scratch)?;
            for f in &files {
                if f.file_type != kura_accelfs::FileType::File {
                    continue;
                }
                let name = f.name_lossy();
                let bytes = match fs.read(&format!("{index}/{name}")) {
                    Ok(b) => b,
                    Err(e) => return Ok(Err(e)),
                };
                std::fs::write(scratch.join(&name), bytes)?;
            }
            Ok(Ok(()))
        };
        let copied = copy();
        let mut store = FsStore {
            fs,
            db: None,
            dir,
            next_id: 0,
            scratch: Some(scratch.clone()),
        };
        match copied {
            Err(e) => {
                return Err(FsTargetError::Damaged(format!(
                    "copying the index to {}: {e}",
                    scratch.display()
                )))
            }
            Ok(Err(e)) => return Err(e.into()),
            Ok(Ok(())) => {}
        }
        let db = Db::open(
            Location::Dir(scratch),
            &DbOptions {
                create_if_missing: false,
                ..DbOptions::default()
            },
        )?;
        store.next_id = next_id(&db)?;
        store.db = Some(db);
        Ok(store)
    }

    fn db(&self) -> &Db {
        // Present from open until drop.
        self.db.as_ref().unwrap_or_else(|| unreachable!())
    }

    fn record_path_named(&self, name: &str) -> String {
        format!("{}/records/{name}", self.dir)
    }

    fn record_path(&self, id: u64) -> String {
        self.record_path_named(&format!("{id:016x}"))
    }

    /// Stores a batch durably (files, AccelFS commit, LevelDB write with sync); ids in order.
    pub fn store_batch(&mut self, records: &[FsRecord<'_>]) -> Result<Vec<Entry>, FsTargetError> {
        let mut entries = Vec::with_capacity(records.len());
        let mut id = self.next_id;
        for r in records {
            let file = self.fs.create(&self.record_path(id))?;
            let mut at = 0u64;
            for c in r.chunks {
                let n = (r.stored_len - at).min(c.len() as u64) as usize;
                if n == 0 {
                    break;
                }
                file.write_at(at, &c[..n])?;
                at += n as u64;
            }
            entries.push(Entry {
                id,
                generation: 0,
                offset: 0,
                stored_len: r.stored_len,
                orig_len: r.orig_len,
                crc: r.crc,
                stage: r.stage,
                label: r.label,
                seq: r.seq,
            });
            id += 1;
        }
        self.fs.sync()?;
        let mut batch = WriteBatch::new();
        for e in &entries {
            batch.put(&key(e.id), &e.encode());
        }
        batch.put(NEXT_KEY, &id.to_le_bytes());
        self.db().write(batch, true)?;
        self.next_id = id;
        Ok(entries)
    }

    /// Every record's entry, in id order.
    pub fn entries(&self) -> Result<Vec<Entry>, FsTargetError> {
        let pairs = self.db().scan(b"r", Some(b"s"), usize::MAX)?;
        pairs
            .iter()
            .map(|(k, v)| {
                Entry::decode(v)
                    .filter(|e| k[..] == key(e.id))
                    .ok_or_else(|| FsTargetError::Damaged(format!("entry under key {k:02x?}")))
            })
            .collect()
    }

    /// The entry of record `id`.
    pub fn entry(&self, id: u64) -> Result<Entry, FsTargetError> {
        let v = self
            .db()
            .get(&key(id))?
            .ok_or(FsTargetError::NoSuchRecord(id))?;
        Entry::decode(&v).ok_or_else(|| FsTargetError::Damaged(format!("entry of record {id}")))
    }

    /// Record `id` as it was sent: its file checked against the entry's CRC, `zstd` undone.
    pub fn read_original(&self, id: u64) -> Result<Vec<u8>, FsTargetError> {
        let e = self.entry(id)?;
        let stored = self.fs.read(&self.record_path(id))?;
        if stored.len() as u64 != e.stored_len || crc32c(&stored) != e.crc {
            return Err(FsTargetError::Damaged(format!(
                "record {id}: file of {} bytes does not match its entry",
                stored.len()
            )));
        }
        if e.stage == Stage::Zstd as u8 {
            return crate::stage::decompress(&stored, e.orig_len as usize)
                .map_err(|err| FsTargetError::Damaged(format!("record {id}: {err}")));
        }
        Ok(stored)
    }

    /// Closes the index and unmounts (committing everything; a read-only open writes
    /// nothing and removes its copy of the index).
    pub fn close(mut self) -> Result<(), FsTargetError> {
        drop(self.db.take());
        self.fs.sync()?;
        Ok(())
    }
}

/// The next id the index `db` holds (0 for a new index).
fn next_id(db: &Db) -> Result<u64, FsTargetError> {
    Ok(match db.get(NEXT_KEY)? {
        None => 0,
        Some(v) => u64::from_le_bytes(
            v.as_slice()
                .try_into()
                .map_err(|_| FsTargetError::Damaged("next id is not 8 bytes".into()))?,
        ),
    })
}
