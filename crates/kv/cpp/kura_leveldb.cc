// kura-kv's bridge to Google LevelDB: an Env whose files live on AccelFS (every call goes to
// Rust through the KuraFsOps table), and a small C ABI over leveldb::DB for the safe Rust API.
// Compiled with -fno-rtti to match Debian's libleveldb. Errors cross the boundary as strings
// the caller frees with kura_free.
//
// No C++ exception may leave this file: one unwinding into Rust frames (the caller of an
// extern "C" entry point, or the Rust callback that called `push`) is undefined behaviour, and
// one escaping an Env method unwinds through LevelDB, which is not written to survive it. So
// every extern "C" entry point runs its body under ApiGuard (the exception becomes *err, or is
// recorded on the batch / iterator and reported by the next call that can), except those that
// only free memory and run destructors, which are noexcept; every Env and file method runs
// under EnvGuard (the exception becomes Status::IOError); and the C++ callback Rust calls
// (GetChildren's push) catches and reports failure by its return value. The messages begin with
// kOutOfMemory or kCppException, which src/db.rs maps to KvError::OutOfMemory / CppException.
// All of these are noexcept: should building the error itself throw (memory exhausted while
// reporting memory exhausted), the result is std::terminate, a defined end, never an unwind.

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
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
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
  // `push` returns 0, or nonzero when it failed (then `list` stops and returns nonzero).
  int (*list)(void* ctx, const char* dir, void* out, int (*push)(void* out, const char* name, size_t len));
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

// Prefixes of messages about caught exceptions; src/db.rs matches them (keep the two in step).
constexpr const char kOutOfMemory[] = "kura-bridge: out of memory";
constexpr const char kCppException[] = "kura-bridge: C++ exception";

// Describes the exception being handled into buf, allocating nothing (memory may be what ran
// out). Call only from inside a catch block.
void DescribeCaught(const char* where, char* buf, size_t n) noexcept {
  try {
    throw;
  } catch (const std::bad_alloc& e) {
    std::snprintf(buf, n, "%s in %s (%s)", kOutOfMemory, where, e.what());
  } catch (const std::exception& e) {
    std::snprintf(buf, n, "%s in %s: %s", kCppException, where, e.what());
  } catch (...) {
    std::snprintf(buf, n, "%s in %s: not a std::exception", kCppException, where);
  }
}

// A malloc'd copy for the Rust side (freed with kura_free); null when malloc fails.
char* CopyBytes(const char* s, size_t n) noexcept {
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, s, n);
  out[n] = 0;
  return out;
}

char* CopyString(const std::string& s) noexcept { return CopyBytes(s.data(), s.size()); }

char* CopyCaught(const char* where) noexcept {
  char buf[512];
  DescribeCaught(where, buf, sizeof(buf));
  return CopyBytes(buf, std::strlen(buf));
}

// Fault injection for the tests (cargo feature `test-hooks`, which only this crate's tests turn
// on): kura_test_throw arms one throw on the calling thread at the next point of a kind.
enum ThrowSite { kNoSite = 0, kSiteApi = 1, kSiteEnv = 2, kSiteListName = 3 };
#ifdef KURA_TEST_HOOKS
thread_local int t_throw_site = kNoSite;
thread_local int t_throw_kind = 0;
void MaybeThrow(ThrowSite site) {
  if (t_throw_site != site) return;
  int kind = t_throw_kind;
  t_throw_site = kNoSite;
  t_throw_kind = 0;
  if (kind == 1) throw std::bad_alloc();
  if (kind == 2) throw std::runtime_error("injected by kura_test_throw");
  throw 42;  // not a std::exception: only catch (...) sees it
}
#else
inline void MaybeThrow(ThrowSite) {}
#endif

// Runs the body of an extern "C" entry point: an exception becomes *err (when the entry point
// has one) and the return value `failed`.
template <typename R, typename F>
R ApiGuard(const char* where, char** err, R failed, F&& body) noexcept {
  try {
    MaybeThrow(kSiteApi);
    return body();
  } catch (...) {
    if (err != nullptr) *err = CopyCaught(where);
    return failed;
  }
}

// The same for entry points with no error out-parameter: the message goes to *slot (a batch's
// or iterator's pending error, reported by its next call that can), the first one kept.
template <typename F>
void ApiGuardInto(const char* where, char** slot, F&& body) noexcept {
  try {
    MaybeThrow(kSiteApi);
    body();
  } catch (...) {
    if (*slot == nullptr) *slot = CopyCaught(where);
  }
}

// Runs the body of an Env or file method LevelDB calls: an exception becomes an IOError, which
// LevelDB handles like any failed file operation.
template <typename F>
leveldb::Status EnvGuard(const char* where, F&& body) noexcept {
  try {
    MaybeThrow(kSiteEnv);
    return body();
  } catch (...) {
    char buf[512];
    DescribeCaught(where, buf, sizeof(buf));
    return leveldb::Status::IOError(buf);
  }
}

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
    return EnvGuard("SequentialFile::Read", [&] {
      size_t got = 0;
      int rc = ops_.read_at(ops_.ctx, h_, pos_, scratch, n, &got);
      if (rc != 0) return FsError(ops_, rc, name_);
      pos_ += got;
      *result = leveldb::Slice(scratch, got);
      return leveldb::Status::OK();
    });
  }
  leveldb::Status Skip(uint64_t n) override {
    return EnvGuard("SequentialFile::Skip", [&] {
      pos_ += n;
      return leveldb::Status::OK();
    });
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
// The load runs on a thread of its own, started by the read that reaches the threshold, and
// reads stay calls until it is done: loading a 4 MiB table took 4-12 ms on a loaded 2-core
// host, which the Get that happened to trigger it used to wait for (YCSB p99.9).
class AccelRandomAccessFile : public leveldb::RandomAccessFile {
 public:
  static constexpr uint32_t kLoadAfterReads = 32;

  AccelRandomAccessFile(const KuraFsOps& ops, std::string name, uint64_t h, ResidentBudget* budget)
      : ops_(ops), name_(std::move(name)), h_(h), budget_(budget) {}
  ~AccelRandomAccessFile() override {
    {
      std::lock_guard<std::mutex> lock(loader_mu_);
      if (loader_.joinable()) loader_.join();
    }
    ops_.close(ops_.ctx, h_);
    if (resident_.load(std::memory_order_relaxed) != nullptr) budget_->Give(resident_size_);
  }
  leveldb::Status Read(uint64_t offset, size_t n, leveldb::Slice* result,
                       char* scratch) const override {
    return EnvGuard("RandomAccessFile::Read", [&] { return ReadUnguarded(offset, n, result, scratch); });
  }

 private:
  leveldb::Status ReadUnguarded(uint64_t offset, size_t n, leveldb::Slice* result,
                                char* scratch) const {
    const char* mem = resident_.load(std::memory_order_acquire);
    if (mem == nullptr && budget_ != nullptr &&
        reads_.fetch_add(1, std::memory_order_relaxed) + 1 == kLoadAfterReads) {
      // Exactly one read gets here, so `loader_` is started once; the destructor joins it.
      std::lock_guard<std::mutex> lock(loader_mu_);
      try {
        loader_ = std::thread([this] { Load(); });
      } catch (const std::system_error&) {
        // No thread to be had: reads simply stay calls.
      }
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
  mutable std::mutex loader_mu_;
  mutable std::thread loader_;
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
    return EnvGuard("WritableFile::Append", [&] {
      buf_.append(data.data(), data.size());
      if (buf_.size() >= kBuffer) return WriteOut();
      return leveldb::Status::OK();
    });
  }
  leveldb::Status Close() override {
    leveldb::Status s = EnvGuard("WritableFile::Close", [&] { return WriteOut(); });
    // The handle is given back even when writing out failed (ops_.close is a Rust callback
    // and cannot throw), so a failed Close never leaks the file.
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
    return EnvGuard("WritableFile::Sync", [&] {
      leveldb::Status s = WriteOut();
      if (!s.ok()) return s;
      int rc = ops_.sync(ops_.ctx, h_);
      if (rc != 0) return FsError(ops_, rc, name_);
      return leveldb::Status::OK();
    });
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
  // Logging has no way to report failure; a message that cannot be written is dropped.
  void Logv(const char* format, std::va_list ap) override {
    try {
      LogvUnguarded(format, ap);
    } catch (...) {
    }
  }

 private:
  void LogvUnguarded(const char* format, std::va_list ap) {
    MaybeThrow(kSiteEnv);
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
    return EnvGuard("Env::NewSequentialFile", [&] {
      uint64_t h = 0;
      int rc = ops_.open(ops_.ctx, f.c_str(), kRead, &h);
      if (rc != 0) return FsError(ops_, rc, f);
      *r = Adopt<AccelSequentialFile>(h, f, h);
      return leveldb::Status::OK();
    });
  }
  leveldb::Status NewRandomAccessFile(const std::string& f, leveldb::RandomAccessFile** r) override {
    return EnvGuard("Env::NewRandomAccessFile", [&] {
      uint64_t h = 0;
      int rc = ops_.open(ops_.ctx, f.c_str(), kRead, &h);
      if (rc != 0) return FsError(ops_, rc, f);
      bool table = EndsWith(f, ".ldb") || EndsWith(f, ".sst");
      *r = Adopt<AccelRandomAccessFile>(h, f, h, table ? &budget_ : nullptr);
      return leveldb::Status::OK();
    });
  }
  leveldb::Status NewWritableFile(const std::string& f, leveldb::WritableFile** r) override {
    return EnvGuard("Env::NewWritableFile", [&] {
      uint64_t h = 0;
      int rc = ops_.open(ops_.ctx, f.c_str(), kTruncate, &h);
      if (rc != 0) return FsError(ops_, rc, f);
      *r = Adopt<AccelWritableFile>(h, f, h);
      return leveldb::Status::OK();
    });
  }
  leveldb::Status NewAppendableFile(const std::string& f, leveldb::WritableFile** r) override {
    return EnvGuard("Env::NewAppendableFile", [&] {
      uint64_t h = 0;
      int rc = ops_.open(ops_.ctx, f.c_str(), kAppend, &h);
      if (rc != 0) return FsError(ops_, rc, f);
      *r = Adopt<AccelWritableFile>(h, f, h);
      return leveldb::Status::OK();
    });
  }
  // LevelDB reads "cannot tell" as "absent", which is what a failed check means here too.
  bool FileExists(const std::string& f) override {
    try {
      MaybeThrow(kSiteEnv);
      return ops_.exists(ops_.ctx, f.c_str()) == 1;
    } catch (...) {
      return false;
    }
  }
  leveldb::Status GetChildren(const std::string& dir, std::vector<std::string>* out) override {
    return EnvGuard("Env::GetChildren", [&] {
      out->clear();
      // Called from Rust for each name: nothing may unwind out of it, so a failure is kept
      // here and reported by the return value, which makes the Rust side stop listing.
      struct Sink {
        std::vector<std::string>* names;
        char error[512];
        bool failed;
      } sink{out, {}, false};
      int rc = ops_.list(ops_.ctx, dir.c_str(), &sink, [](void* v, const char* name, size_t len) noexcept {
        auto* s = static_cast<Sink*>(v);
        try {
          MaybeThrow(kSiteListName);
          s->names->emplace_back(name, len);
          return 0;
        } catch (...) {
          DescribeCaught("Env::GetChildren", s->error, sizeof(s->error));
          s->failed = true;
          return 1;
        }
      });
      if (sink.failed) {
        out->clear();
        return leveldb::Status::IOError(dir, sink.error);
      }
      if (rc != 0) return FsError(ops_, rc, dir);
      return leveldb::Status::OK();
    });
  }
  leveldb::Status RemoveFile(const std::string& f) override {
    return EnvGuard("Env::RemoveFile", [&] {
      int rc = ops_.remove(ops_.ctx, f.c_str());
      return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, f);
    });
  }
  leveldb::Status CreateDir(const std::string& d) override {
    return EnvGuard("Env::CreateDir", [&] {
      int rc = ops_.mkdir(ops_.ctx, d.c_str());
      return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, d);
    });
  }
  leveldb::Status RemoveDir(const std::string& d) override {
    return EnvGuard("Env::RemoveDir", [&] {
      int rc = ops_.rmdir(ops_.ctx, d.c_str());
      return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, d);
    });
  }
  leveldb::Status GetFileSize(const std::string& f, uint64_t* size) override {
    return EnvGuard("Env::GetFileSize", [&] {
      int rc = ops_.size(ops_.ctx, f.c_str(), size);
      return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, f);
    });
  }
  leveldb::Status RenameFile(const std::string& from, const std::string& to) override {
    return EnvGuard("Env::RenameFile", [&] {
      int rc = ops_.rename(ops_.ctx, from.c_str(), to.c_str());
      return rc == 0 ? leveldb::Status::OK() : FsError(ops_, rc, from);
    });
  }
  leveldb::Status LockFile(const std::string& f, leveldb::FileLock** lock) override {
    return EnvGuard("Env::LockFile", [&] {
      {
        std::lock_guard<std::mutex> guard(mu_);
        if (!locked_.insert(f).second) {
          return leveldb::Status::IOError("lock " + f, "already held by this process");
        }
      }
      // From here the name is in locked_: take it out again on any failure, thrown or not.
      try {
        if (ops_.exists(ops_.ctx, f.c_str()) != 1) {
          uint64_t h = 0;
          int rc = ops_.open(ops_.ctx, f.c_str(), kTruncate, &h);
          if (rc != 0) {
            Unlock(f);
            return FsError(ops_, rc, f);
          }
          ops_.close(ops_.ctx, h);
        }
        *lock = new AccelFileLock(f);
      } catch (...) {
        Unlock(f);
        throw;
      }
      return leveldb::Status::OK();
    });
  }
  leveldb::Status UnlockFile(leveldb::FileLock* lock) override {
    return EnvGuard("Env::UnlockFile", [&] {
      auto* l = static_cast<AccelFileLock*>(lock);
      Unlock(l->name);
      delete l;
      return leveldb::Status::OK();
    });
  }
  leveldb::Status NewLogger(const std::string& f, leveldb::Logger** result) override {
    return EnvGuard("Env::NewLogger", [&] {
      uint64_t h = 0;
      int rc = ops_.open(ops_.ctx, f.c_str(), kAppend, &h);
      if (rc != 0) return FsError(ops_, rc, f);
      auto* file = Adopt<AccelWritableFile>(h, f, h);
      try {
        *result = new AccelLogger(file);
      } catch (...) {
        delete file;
        throw;
      }
      return leveldb::Status::OK();
    });
  }

 private:
  // A file object for handle h, which is closed again when making the object throws.
  template <typename T, typename... Args>
  T* Adopt(uint64_t h, Args&&... args) {
    try {
      return new T(ops_, std::forward<Args>(args)...);
    } catch (...) {
      ops_.close(ops_.ctx, h);
      throw;
    }
  }
  void Unlock(const std::string& f) {
    std::lock_guard<std::mutex> guard(mu_);
    locked_.erase(f);
  }

  KuraFsOps ops_;
  ResidentBudget budget_;
  std::mutex mu_;
  std::set<std::string> locked_;
};

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

// A write batch, and the first failure of a call that had no way to report it (put, delete),
// which kura_db_write reports instead of applying a batch that lacks a change.
struct kura_batch {
  leveldb::WriteBatch batch;
  char* error = nullptr;
};

// An iterator, and the first failure of a call with no error out-parameter (seek, next, ...);
// the iterator is then not valid and kura_iter_status reports it.
struct kura_iter {
  leveldb::Iterator* it;
  char* error;
};

void kura_free(void* p) { std::free(p); }

#ifdef KURA_TEST_HOOKS
// Test-only: the next point of kind `site` on this thread throws `kind` (1 std::bad_alloc,
// 2 std::runtime_error, 3 an int). Sites: 1 any bridge entry point, 2 any Env or file method,
// 3 each name GetChildren receives from Rust.
void kura_test_throw(int site, int kind) {
  t_throw_site = site;
  t_throw_kind = kind;
}
#endif

// Destructors are noexcept: should one throw, this ends in std::terminate, never an unwind.
static void DeleteParts(kura_db* k) noexcept {
  delete k->db;
  delete k->env;
  delete k->cache;
  delete k->filter;
  delete k;
}

// Opens `name`; on AccelFS when `ops` is given, else in the host file system (LevelDB's own
// POSIX Env). Returns null and sets *err on failure.
kura_db* kura_db_open(const KuraFsOps* ops, const char* name, const KuraDbOptions* o, char** err) {
  kura_db* k = nullptr;
  kura_db* out = ApiGuard("kura_db_open", err, static_cast<kura_db*>(nullptr), [&]() -> kura_db* {
    k = new kura_db{nullptr, nullptr, nullptr, nullptr};
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
    if (Fail(s, err)) return nullptr;
    return k;
  });
  // On any failure, thrown or reported, nothing of this open survives (k->db is set only by a
  // DB::Open that succeeded).
  if (out == nullptr && k != nullptr) DeleteParts(k);
  return out;
}

// Not under ApiGuard: nothing can be reported, and a close that did not happen (an injected
// throw) would leave LevelDB's threads running on a context Rust is about to free.
void kura_db_close(kura_db* k) {
  if (k == nullptr) return;
  DeleteParts(k);
}

int kura_db_put(kura_db* k, const char* key, size_t klen, const char* val, size_t vlen, int sync,
                char** err) {
  return ApiGuard("kura_db_put", err, 1, [&] {
    leveldb::WriteOptions w;
    w.sync = sync != 0;
    return Fail(k->db->Put(w, leveldb::Slice(key, klen), leveldb::Slice(val, vlen)), err) ? 1 : 0;
  });
}

int kura_db_delete(kura_db* k, const char* key, size_t klen, int sync, char** err) {
  return ApiGuard("kura_db_delete", err, 1, [&] {
    leveldb::WriteOptions w;
    w.sync = sync != 0;
    return Fail(k->db->Delete(w, leveldb::Slice(key, klen)), err) ? 1 : 0;
  });
}

// Returns 1 and a malloc'd value when found, 0 when absent, -1 on error (with *err set).
int kura_db_get(kura_db* k, const leveldb::Snapshot* snap, const char* key, size_t klen,
                char** val, size_t* vlen, char** err) {
  return ApiGuard("kura_db_get", err, -1, [&] {
    leveldb::ReadOptions r;
    r.snapshot = snap;
    r.verify_checksums = true;
    std::string v;
    leveldb::Status s = k->db->Get(r, leveldb::Slice(key, klen), &v);
    if (s.IsNotFound()) return 0;
    if (Fail(s, err)) return -1;
    char* copy = CopyString(v);
    if (copy == nullptr) throw std::bad_alloc();
    *val = copy;
    *vlen = v.size();
    return 1;
  });
}

// Null (and *err set) when the batch cannot be made.
kura_batch* kura_batch_new(char** err) {
  return ApiGuard("kura_batch_new", err, static_cast<kura_batch*>(nullptr),
                  [] { return new kura_batch(); });
}
void kura_batch_free(kura_batch* b) {
  if (b == nullptr) return;
  std::free(b->error);
  delete b;
}
void kura_batch_put(kura_batch* b, const char* k, size_t kl, const char* v, size_t vl) {
  ApiGuardInto("kura_batch_put", &b->error,
               [&] { b->batch.Put(leveldb::Slice(k, kl), leveldb::Slice(v, vl)); });
}
void kura_batch_delete(kura_batch* b, const char* k, size_t kl) {
  ApiGuardInto("kura_batch_delete", &b->error, [&] { b->batch.Delete(leveldb::Slice(k, kl)); });
}
// Applies the batch, or reports the failure of one of its puts/deletes and applies nothing.
int kura_db_write(kura_db* k, kura_batch* b, int sync, char** err) {
  if (b->error != nullptr) {
    *err = b->error;
    b->error = nullptr;
    return 1;
  }
  return ApiGuard("kura_db_write", err, 1, [&] {
    leveldb::WriteOptions w;
    w.sync = sync != 0;
    return Fail(k->db->Write(w, &b->batch), err) ? 1 : 0;
  });
}

// Null (and *err set) when the snapshot cannot be taken.
const leveldb::Snapshot* kura_db_snapshot(kura_db* k, char** err) {
  return ApiGuard("kura_db_snapshot", err, static_cast<const leveldb::Snapshot*>(nullptr),
                  [&] { return k->db->GetSnapshot(); });
}
// Nothing to report to (called from a Drop); should it fail, the snapshot stays held.
void kura_db_release_snapshot(kura_db* k, const leveldb::Snapshot* s) {
  ApiGuard("kura_db_release_snapshot", nullptr, 0, [&] {
    k->db->ReleaseSnapshot(s);
    return 0;
  });
}

// Null (and *err set) when the iterator cannot be made.
kura_iter* kura_db_iter(kura_db* k, const leveldb::Snapshot* snap, char** err) {
  return ApiGuard("kura_db_iter", err, static_cast<kura_iter*>(nullptr), [&] {
    leveldb::ReadOptions r;
    r.snapshot = snap;
    r.verify_checksums = true;
    std::unique_ptr<leveldb::Iterator> it(k->db->NewIterator(r));
    auto* i = new kura_iter{it.get(), nullptr};
    it.release();
    return i;
  });
}
// Destructors only (noexcept), like kura_db_close.
void kura_iter_free(kura_iter* i) {
  if (i == nullptr) return;
  delete i->it;
  std::free(i->error);
  delete i;
}
void kura_iter_seek(kura_iter* i, const char* k, size_t kl) {
  ApiGuardInto("kura_iter_seek", &i->error, [&] { i->it->Seek(leveldb::Slice(k, kl)); });
}
void kura_iter_seek_first(kura_iter* i) {
  ApiGuardInto("kura_iter_seek_first", &i->error, [&] { i->it->SeekToFirst(); });
}
// 0 once any call on the iterator failed, so a scan stops and asks kura_iter_status.
int kura_iter_valid(kura_iter* i) {
  int valid = 0;
  ApiGuardInto("kura_iter_valid", &i->error, [&] { valid = i->it->Valid() ? 1 : 0; });
  return i->error == nullptr ? valid : 0;
}
void kura_iter_next(kura_iter* i) {
  ApiGuardInto("kura_iter_next", &i->error, [&] { i->it->Next(); });
}
// Null (length 0) when the call failed; the failure is then reported by kura_iter_status.
const char* kura_iter_key(kura_iter* i, size_t* len) {
  leveldb::Slice s;
  ApiGuardInto("kura_iter_key", &i->error, [&] { s = i->it->key(); });
  *len = s.size();
  return i->error == nullptr ? s.data() : nullptr;
}
const char* kura_iter_value(kura_iter* i, size_t* len) {
  leveldb::Slice s;
  ApiGuardInto("kura_iter_value", &i->error, [&] { s = i->it->value(); });
  *len = s.size();
  return i->error == nullptr ? s.data() : nullptr;
}
int kura_iter_status(kura_iter* i, char** err) {
  if (i->error != nullptr) {
    *err = i->error;
    i->error = nullptr;
    return 1;
  }
  return ApiGuard("kura_iter_status", err, 1,
                  [&] { return Fail(i->it->status(), err) ? 1 : 0; });
}

int kura_db_compact(kura_db* k, char** err) {
  return ApiGuard("kura_db_compact", err, 1, [&] {
    k->db->CompactRange(nullptr, nullptr);
    return 0;
  });
}

// A LevelDB property ("leveldb.stats", "leveldb.approximate-memory-usage", ...), malloc'd;
// null with *err null when LevelDB does not know the name, null with *err set on failure.
char* kura_db_property(kura_db* k, const char* name, char** err) {
  return ApiGuard("kura_db_property", err, static_cast<char*>(nullptr), [&]() -> char* {
    std::string v;
    if (!k->db->GetProperty(name, &v)) return nullptr;
    char* out = CopyString(v);
    if (out == nullptr) throw std::bad_alloc();
    return out;
  });
}

}  // extern "C"
