// kura-kv's bridge to Google LevelDB: an Env whose files live on AccelFS (every call goes to
// Rust through the KuraFsOps table), and a small C ABI over leveldb::DB for the safe Rust API.
// Compiled with -fno-rtti to match Debian's libleveldb. Errors cross the boundary as strings
// the caller frees with kura_free; nothing here throws.

#include <leveldb/cache.h>
#include <leveldb/db.h>
#include <leveldb/env.h>
#include <leveldb/filter_policy.h>
#include <leveldb/iterator.h>
#include <leveldb/options.h>
#include <leveldb/write_batch.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

extern "C" {

// Storage callbacks implemented in Rust (src/ffi.rs). Each returns 0 on success or a positive
// errno; the message of the last failure on this thread is fetched with last_error.
struct KuraFsOps {
  void* ctx;
  int (*open)(void* ctx, const char* path, int mode, uint64_t* handle);
  int (*read_at)(void* ctx, uint64_t handle, uint64_t offset, char* buf, size_t n, size_t* got);
  int (*append)(void* ctx, uint64_t handle, const char* data, size_t n);
  int (*sync)(void* ctx, uint64_t handle);
  int (*close)(void* ctx, uint64_t handle);
  int (*exists)(void* ctx, const char* path);
  int (*list)(void* ctx, const char* dir, void* out, void (*push)(void* out, const char* name, size_t len));
  int (*remove)(void* ctx, const char* path);
  int (*mkdir)(void* ctx, const char* path);
  int (*rmdir)(void* ctx, const char* path);
  int (*size)(void* ctx, const char* path, uint64_t* size);
  int (*rename)(void* ctx, const char* from, const char* to);
  size_t (*last_error)(void* ctx, char* buf, size_t n);
};

struct KuraDbOptions {
  int create_if_missing;
  int error_if_exists;
  int paranoid_checks;
  int compression;
  size_t block_cache_bytes;
  size_t write_buffer_bytes;
  int bloom_bits;
  int max_open_files;
  size_t resident_table_bytes;
};

}  // extern "C"

namespace {

enum OpenMode { kRead = 0, kTruncate = 1, kAppend = 2 };

bool EndsWith(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

leveldb::Status FsError(const KuraFsOps& ops, int code, const std::string& what) {
  char buf[512];
  size_t n = ops.last_error(ops.ctx, buf, sizeof(buf));
  std::string msg(buf, n < sizeof(buf) ? n : sizeof(buf));
  if (code == 2 /* ENOENT */) return leveldb::Status::NotFound(what, msg);
  return leveldb::Status::IOError(what, msg);
}

class AccelSequentialFile : public leveldb::SequentialFile {
 public:
  AccelSequentialFile(const KuraFsOps& ops, std::string name, uint64_t h)
      : ops_(ops), name_(std::move(name)), h_(h) {}
  ~AccelSequentialFile() override { ops_.close(ops_.ctx, h_); }
  leveldb::Status Read(size_t n, leveldb::Slice* result, char* scratch) override {
    size_t got = 0;
    int rc = ops_.read_at(ops_.ctx, h_, pos_, scratch, n, &got);
    if (rc != 0) return FsError(ops_, rc, name_);
    pos_ += got;
    *result = leveldb::Slice(scratch, got);
    return leveldb::Status::OK();
  }
  leveldb::Status Skip(uint64_t n) override {
    pos_ += n;
    return leveldb::Status::OK();
  }

 private:
  const KuraFsOps& ops_;
  std::string name_;
  uint64_t h_;
  uint64_t pos_ = 0;
};

// Bytes of table files held whole in memory, across the files of one Env, and the cap.
class ResidentBudget {
 public:
  explicit ResidentBudget(size_t limit) : limit_(limit) {}
  bool Take(size_t n) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (n > limit_ || used > limit_ - n) return false;
    } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
    return true;
  }
  void Give(size_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }

 private:
  const size_t limit_;
  std::atomic<size_t> used_{0};
};

// Reads go to the file system; a table file (immutable once LevelDB opens it for reading) that
// keeps being read is then loaded whole, while the budget allows, and later reads are slices of
// that memory with no call at all: what LevelDB's POSIX Env gets from mmap, but bounded. A
// table opened only to verify a compaction's output is read a few times and never loaded.
class AccelRandomAccessFile : public leveldb::RandomAccessFile {
 public:
  static constexpr uint32_t kLoadAfterReads = 32;

  AccelRandomAccessFile(const KuraFsOps& ops, std::string name, uint64_t h, ResidentBudget* budget)
      : ops_(ops), name_(std::move(name)), h_(h), budget_(budget) {}
  ~AccelRandomAccessFile() override {
    ops_.close(ops_.ctx, h_);
    if (resident_.load(std::memory_order_relaxed) != nullptr) budget_->Give(resident_size_);
  }
  leveldb::Status Read(uint64_t offset, size_t n, leveldb::Slice* result,
                       char* scratch) const override {
    const char* mem = resident_.load(std::memory_order_acquire);
    if (mem == nullptr && budget_ != nullptr &&
        reads_.fetch_add(1, std::memory_order_relaxed) + 1 == kLoadAfterReads) {
      Load();
      mem = resident_.load(std::memory_order_acquire);
    }
    if (mem != nullptr) {
      size_t got = offset >= resident_size_ ? 0 : std::min<uint64_t>(n, resident_size_ - offset);
      *result = leveldb::Slice(mem + (got == 0 ? 0 : offset), got);
      return leveldb::Status::OK();
    }
    size_t got = 0;
    int rc = ops_.read_at(ops_.ctx, h_, offset, scratch, n, &got);
    if (rc != 0) return FsError(ops_, rc, name_);
    *result = leveldb::Slice(scratch, got);
    return leveldb::Status::OK();
  }

 private:
  // Loads the whole file if the budget has room; on any failure reads simply stay calls.
  void Load() const {
    std::lock_guard<std::mutex> lock(load_mu_);
    if (resident_.load(std::memory_order_relaxed) != nullptr) return;
    uint64_t size = 0;
    if (ops_.size(ops_.ctx, name_.c_str(), &size) != 0 || size == 0) return;
    if (!budget_->Take(size)) return;
    std::unique_ptr<char[]> buf(new (std::nothrow) char[size]);
    uint64_t at = 0;
    while (buf && at < size) {
      size_t got = 0;
      if (ops_.read_at(ops_.ctx, h_, at, buf.get() + at, size - at, &got) != 0 || got == 0) break;
      at += got;
    }
    if (!buf || at != size) {
      budget_->Give(size);
      return;
    }
    storage_ = std::move(buf);
    resident_size_ = size;
    resident_.store(storage_.get(), std::memory_order_release);
  }

  const KuraFsOps& ops_;
  std::string name_;
  uint64_t h_;
  ResidentBudget* budget_;  // null: never load (files other than tables)
  mutable std::atomic<uint32_t> reads_{0};
  mutable std::mutex load_mu_;
  mutable std::unique_ptr<char[]> storage_;
  mutable uint64_t resident_size_ = 0;
  mutable std::atomic<const char*> resident_{nullptr};
};

// Buffers appends (LevelDB writes logs record by record) and hands the file system large
// pieces; Sync is the durability point (AccelFS fdatasync: a journal commit when it grew).
class AccelWritableFile : public leveldb::WritableFile {
 public:
  AccelWritableFile(const KuraFsOps& ops, std::string name, uint64_t h)
      : ops_(ops), name_(std::move(name)), h_(h) {}
  ~AccelWritableFile() override {
    if (open_) Close();
  }
  leveldb::Status Append(const leveldb::Slice& data) override {
    buf_.append(data.data(), data.size());
    if (buf_.size() >= kBuffer) return WriteOut();
    return leveldb::Status::OK();
  }
  leveldb::Status Close() override {
    leveldb::Status s = WriteOut();
    if (open_) {
      ops_.close(ops_.ctx, h_);
      open_ = false;
    }
    return s;
  }
  // LevelDB flushes after every log record and table block so that the bytes reach the OS and
  // survive a crash of the process alone. AccelFS's cache lives in this process, so handing it
  // the bytes early buys nothing; they are kept here until the buffer fills, Sync or Close.
  leveldb::Status Flush() override { return leveldb::Status::OK(); }
  // Hands the buffered bytes to the file system now.
  leveldb::Status WriteOut() {
    if (buf_.empty()) return leveldb::Status::OK();
    int rc = ops_.append(ops_.ctx, h_, buf_.data(), buf_.size());
    buf_.clear();
    if (rc != 0) return FsError(ops_, rc, name_);
    return leveldb::Status::OK();
  }
  leveldb::Status Sync() override {
    leveldb::Status s = WriteOut();
    if (!s.ok()) return s;
    int rc = ops_.sync(ops_.ctx, h_);
    if (rc != 0) return FsError(ops_, rc, name_);
    return leveldb::Status::OK();
  }

 private:
  // Below AccelFS's bypass threshold, so table and log writes land in its write-back cache
  // and reach the device in large batches at Sync, as they would through a page cache.
  static constexpr size_t kBuffer = 64 << 10;
  const KuraFsOps& ops_;
  std::string name_;
  uint64_t h_;
  std::string buf_;
  bool open_ = true;
};

// LevelDB's LOG: each message goes to the file system at once (not held in the file's buffer),
// so it is there to read while the database runs.
class AccelLogger : public leveldb::Logger {
 public:
  explicit AccelLogger(AccelWritableFile* file) : file_(file) {}
  ~AccelLogger() override { delete file_; }
  void Logv(const char* format, std::va_list ap) override {
    char buf[1024];
    std::va_list copy;
    va_copy(copy, ap);
    int n = std::vsnprintf(buf, sizeof(buf) - 1, format, copy);
    va_end(copy);
    if (n < 0) return;
    size_t len = static_cast<size_t>(n) < sizeof(buf) - 1 ? static_cast<size_t>(n) : sizeof(buf) - 2;
    if (len == 0 || buf[len - 1] != '\n') buf[len++] = '\n';
    std::lock_guard<std::mutex> guard(mu_);
    file_->Append(leveldb::Slice(buf, len));
    file_->WriteOut();
  }

 private:
  std::mutex mu_;
  AccelWritableFile* file_;
};

class AccelFileLock : public leveldb::FileLock {
 public:
  explicit AccelFileLock(std::string name) : name(std::move(name)) {}
  std::string name;
};

// File operations go to AccelFS; threads, the clock and scheduling are the default Env's.
class AccelEnv : public leveldb::EnvWrapper {
 public:
  AccelEnv(const KuraFsOps& ops, size_t resident_table_bytes)
      : EnvWrapper(leveldb::Env::Default()), ops_(ops), budget_(resident_table_bytes) {}

  leveldb::Status NewSequentialFile(const std::string& f, leveldb::SequentialFile** r) override {
    uint64_t h = 0;
    int rc = ops_.open(ops_.ctx, f.c_str(), kRead, &h);
    if (rc != 0) return FsError(ops_, rc, f);
    *r = new AccelSequentialFile(ops_, f, h);
    return leveldb::Status::OK();
  }
  leveldb::Status NewRandomAccessFile(const std::string& f, leveldb::RandomAccessFile** r) override {
    uint64_t h = 0;
    int rc = ops_.open(ops_.ctx, f.c_str(), kRead, &h);
    if (rc != 0) return FsError(ops_, rc, f);
    bool table = EndsWith(f, ".ldb") || EndsWith(f, ".sst");
    *r = new AccelRandomAccessFile(ops_, f, h, table ? &budget_ : nullptr);
    return leveldb::Status::OK();
  }
  leveldb::Status NewWritableFile(const std::string& f, leveldb::WritableFile** r) override {
    uint64_t h = 0;
    int rc = ops_.open(ops_.ctx, f.c_str(), kTruncate, &h);
    if (rc != 0) return FsError(ops_, rc, f);
    *r = new AccelWritableFile(ops_, f, h);
    return leveldb::Status::OK();
  }
  leveldb::Status NewAppendableFile(const std::string& f, leveldb::WritableFile** r) override {
    uint64_t h = 0;
    int rc = ops_.open(ops_.ctx, f.c_str(), kAppend, &h);
    if (rc != 0) return FsError(ops_, rc, f);
    *r = new AccelWritableFile(ops_, f, h);
    return leveldb::Status::OK();
  }
  bool FileExists(const std::string& f) override { return ops_.exists(ops_.ctx, f.c_str()) == 1; }
  leveldb::Status GetChildren(const std::string& dir, std::vector<std::string>* out) override {
    out->clear();
    int rc = ops_.list(ops_.ctx, dir.c_str(), out, [](void* v, const char* name, size_t len) {
      static_cast<std::vector<std::string>*>(v)->emplace_back(name, len);
    });
    if (rc != 0) return FsError(ops_, rc, dir);
    return leveldb::Status::OK();
  }
  leveldb::Status RemoveFile(const std::string& f) override {
    int rc = ops_.remove(ops_.ctx, f.c_str());
    return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, f);
  }
  leveldb::Status CreateDir(const std::string& d) override {
    int rc = ops_.mkdir(ops_.ctx, d.c_str());
    return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, d);
  }
  leveldb::Status RemoveDir(const std::string& d) override {
    int rc = ops_.rmdir(ops_.ctx, d.c_str());
    return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, d);
  }
  leveldb::Status GetFileSize(const std::string& f, uint64_t* size) override {
    int rc = ops_.size(ops_.ctx, f.c_str(), size);
    return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, f);
  }
  leveldb::Status RenameFile(const std::string& from, const std::string& to) override {
    int rc = ops_.rename(ops_.ctx, from.c_str(), to.c_str());
    return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, from);
  }
  leveldb::Status LockFile(const std::string& f, leveldb::FileLock** lock) override {
    {
      std::lock_guard<std::mutex> guard(mu_);
      if (!locked_.insert(f).second) {
        return leveldb::Status::IOError("lock " + f, "already held by this process");
      }
    }
    if (ops_.exists(ops_.ctx, f.c_str()) != 1) {
      uint64_t h = 0;
      int rc = ops_.open(ops_.ctx, f.c_str(), kTruncate, &h);
      if (rc != 0) {
        std::lock_guard<std::mutex> guard(mu_);
        locked_.erase(f);
        return FsError(ops_, rc, f);
      }
      ops_.close(ops_.ctx, h);
    }
    *lock = new AccelFileLock(f);
    return leveldb::Status::OK();
  }
  leveldb::Status UnlockFile(leveldb::FileLock* lock) override {
    auto* l = static_cast<AccelFileLock*>(lock);
    {
      std::lock_guard<std::mutex> guard(mu_);
      locked_.erase(l->name);
    }
    delete l;
    return leveldb::Status::OK();
  }
  leveldb::Status NewLogger(const std::string& f, leveldb::Logger** result) override {
    uint64_t h = 0;
    int rc = ops_.open(ops_.ctx, f.c_str(), kAppend, &h);
    if (rc != 0) return FsError(ops_, rc, f);
    *result = new AccelLogger(new AccelWritableFile(ops_, f, h));
    return leveldb::Status::OK();
  }

 private:
  KuraFsOps ops_;
  ResidentBudget budget_;
  std::mutex mu_;
  std::set<std::string> locked_;
};

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = 0;
  return out;
}

bool Fail(const leveldb::Status& s, char** err) {
  if (s.ok()) return false;
  if (err != nullptr) *err = CopyString(s.ToString());
  return true;
}

}  // namespace

extern "C" {

struct kura_db {
  leveldb::DB* db;
  AccelEnv* env;
  leveldb::Cache* cache;
  const leveldb::FilterPolicy* filter;
};

struct kura_iter {
  leveldb::Iterator* it;
};

void kura_free(void* p) { std::free(p); }

// Opens `name`; on AccelFS when `ops` is given, else in the host file system (LevelDB's own
// POSIX Env). Returns null and sets *err on failure.
kura_db* kura_db_open(const KuraFsOps* ops, const char* name, const KuraDbOptions* o, char** err) {
  auto* k = new kura_db{nullptr, nullptr, nullptr, nullptr};
  leveldb::Options opt;
  opt.create_if_missing = o->create_if_missing != 0;
  opt.error_if_exists = o->error_if_exists != 0;
  opt.paranoid_checks = o->paranoid_checks != 0;
  opt.compression = o->compression ? leveldb::kSnappyCompression : leveldb::kNoCompression;
  if (o->write_buffer_bytes > 0) opt.write_buffer_size = o->write_buffer_bytes;
  if (o->max_open_files > 0) opt.max_open_files = o->max_open_files;
  if (o->block_cache_bytes > 0) {
    k->cache = leveldb::NewLRUCache(o->block_cache_bytes);
    opt.block_cache = k->cache;
  }
  if (o->bloom_bits > 0) {
    k->filter = leveldb::NewBloomFilterPolicy(o->bloom_bits);
    opt.filter_policy = k->filter;
  }
  if (ops != nullptr) {
    k->env = new AccelEnv(*ops, o->resident_table_bytes);
    opt.env = k->env;
  }
  leveldb::Status s = leveldb::DB::Open(opt, name, &k->db);
  if (Fail(s, err)) {
    delete k->env;
    delete k->cache;
    delete k->filter;
    delete k;
    return nullptr;
  }
  return k;
}

void kura_db_close(kura_db* k) {
  if (k == nullptr) return;
  delete k->db;
  delete k->env;
  delete k->cache;
  delete k->filter;
  delete k;
}

int kura_db_put(kura_db* k, const char* key, size_t klen, const char* val, size_t vlen, int sync,
                char** err) {
  leveldb::WriteOptions w;
  w.sync = sync != 0;
  return Fail(k->db->Put(w, leveldb::Slice(key, klen), leveldb::Slice(val, vlen)), err) ? 1 : 0;
}

int kura_db_delete(kura_db* k, const char* key, size_t klen, int sync, char** err) {
  leveldb::WriteOptions w;
  w.sync = sync != 0;
  return Fail(k->db->Delete(w, leveldb::Slice(key, klen)), err) ? 1 : 0;
}

// Returns 1 and a malloc'd value when found, 0 when absent, -1 on error (with *err set).
int kura_db_get(kura_db* k, const leveldb::Snapshot* snap, const char* key, size_t klen,
                char** val, size_t* vlen, char** err) {
  leveldb::ReadOptions r;
  r.snapshot = snap;
  r.verify_checksums = true;
  std::string v;
  leveldb::Status s = k->db->Get(r, leveldb::Slice(key, klen), &v);
  if (s.IsNotFound()) return 0;
  if (Fail(s, err)) return -1;
  *val = static_cast<char*>(std::malloc(v.size() + 1));
  if (*val == nullptr) {
    *err = CopyString("out of memory");
    return -1;
  }
  std::memcpy(*val, v.data(), v.size());
  *vlen = v.size();
  return 1;
}

leveldb::WriteBatch* kura_batch_new() { return new leveldb::WriteBatch(); }
void kura_batch_free(leveldb::WriteBatch* b) { delete b; }
void kura_batch_put(leveldb::WriteBatch* b, const char* k, size_t kl, const char* v, size_t vl) {
  b->Put(leveldb::Slice(k, kl), leveldb::Slice(v, vl));
}
void kura_batch_delete(leveldb::WriteBatch* b, const char* k, size_t kl) {
  b->Delete(leveldb::Slice(k, kl));
}
int kura_db_write(kura_db* k, leveldb::WriteBatch* b, int sync, char** err) {
  leveldb::WriteOptions w;
  w.sync = sync != 0;
  return Fail(k->db->Write(w, b), err) ? 1 : 0;
}

const leveldb::Snapshot* kura_db_snapshot(kura_db* k) { return k->db->GetSnapshot(); }
void kura_db_release_snapshot(kura_db* k, const leveldb::Snapshot* s) { k->db->ReleaseSnapshot(s); }

kura_iter* kura_db_iter(kura_db* k, const leveldb::Snapshot* snap) {
  leveldb::ReadOptions r;
  r.snapshot = snap;
  r.verify_checksums = true;
  return new kura_iter{k->db->NewIterator(r)};
}
void kura_iter_free(kura_iter* i) {
  delete i->it;
  delete i;
}
void kura_iter_seek(kura_iter* i, const char* k, size_t kl) { i->it->Seek(leveldb::Slice(k, kl)); }
void kura_iter_seek_first(kura_iter* i) { i->it->SeekToFirst(); }
int kura_iter_valid(kura_iter* i) { return i->it->Valid() ? 1 : 0; }
void kura_iter_next(kura_iter* i) { i->it->Next(); }
const char* kura_iter_key(kura_iter* i, size_t* len) {
  leveldb::Slice s = i->it->key();
  *len = s.size();
  return s.data();
}
const char* kura_iter_value(kura_iter* i, size_t* len) {
  leveldb::Slice s = i->it->value();
  *len = s.size();
  return s.data();
}
int kura_iter_status(kura_iter* i, char** err) { return Fail(i->it->status(), err) ? 1 : 0; }

void kura_db_compact(kura_db* k) { k->db->CompactRange(nullptr, nullptr); }

// A LevelDB property ("leveldb.stats", "leveldb.approximate-memory-usage", ...), malloc'd.
char* kura_db_property(kura_db* k, const char* name) {
  std::string v;
  if (!k->db->GetProperty(name, &v)) return nullptr;
  return CopyString(v);
}

}  // extern "C"
