// The out-of-process peers of `kura bench kv`, in C++ so each engine is driven the way kura
// drives LevelDB and its own store: natively, no interpreter between the timer and the call. One
// source, built by the bench with g++ once per engine: -DKV_ROCKSDB against librocksdb
// (Debian librocksdb-dev), -DKV_LMDB against liblmdb (liblmdb-dev). It replays a kura workload
// trace (crates/workload/src/trace.rs, version 1), the same operations the in-process stores
// run, and prints one JSON object on stdout.
//
//   kv_replay --trace FILE --db DIR --cache-bytes N --write-buffer-bytes N --bloom-bits N
//             [--subcompactions N]                                                     (RocksDB)
//   kv_replay --trace FILE --db DIR --map-bytes N                                          (LMDB)
//
// The trace is read whole and parsed before anything is timed; the value pool is rebuilt from
// its seed (little-endian SplitMix64) and checked against the header's check word. The load
// phase is untimed; the run phase is timed as a whole (wall clock) and per operation, exactly as
// the in-process side is in crates/bench/src/kv.rs. Scans count the entries they return, reads
// the keys they found.
//
// Exit status: 0 on success, 2 for bad usage or a malformed trace, 1 for an engine error.

#if defined(KV_ROCKSDB) == defined(KV_LMDB)
#error "build with exactly one of -DKV_ROCKSDB and -DKV_LMDB"
#endif

#ifdef KV_ROCKSDB
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/version.h>
#endif
#ifdef KV_LMDB
#include <lmdb.h>
#include <sys/stat.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

[[noreturn]] void die(int code, const std::string& msg) {
  std::fprintf(stderr, "kv_replay: %s\n", msg.c_str());
  std::exit(code);
}

enum Code : uint8_t {
  kInsert = 0x01,
  kRead = 0x02,
  kUpdate = 0x03,
  kScan = 0x04,
  kRmw = 0x05,
  kDelete = 0x06,
  kPhase = 0x50,
  kEnd = 0x45,
};

struct Op {
  uint8_t code;
  std::string key;
  uint32_t vlen = 0;
  uint32_t voff = 0;
  uint64_t count = 0;
};

struct Trace {
  bool sync = false;
  uint64_t seed = 0;
  uint32_t pool_len = 0;
  uint64_t pool_check = 0;
  std::string name;
  std::vector<Op> load;
  std::vector<Op> run;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : buf_(b) {}
  size_t pos() const { return pos_; }
  bool done() const { return pos_ >= buf_.size(); }
  const uint8_t* take(size_t n) {
    if (buf_.size() - pos_ < n) die(2, "trace truncated at byte " + std::to_string(pos_));
    const uint8_t* p = buf_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint64_t uint(size_t n) {
    const uint8_t* p = take(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= uint64_t(p[i]) << (8 * i);
    return v;
  }
  std::string bytes(size_t n) {
    const uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }

 private:
  const std::vector<uint8_t>& buf_;
  size_t pos_ = 0;
};

Trace parse(const std::vector<uint8_t>& buf) {
  Reader r(buf);
  Trace t;
  if (r.bytes(8) != "KURAWKLD") die(2, "not a kura workload trace (bad magic)");
  uint64_t version = r.uint(2);
  if (version != 1) die(2, "unsupported trace version " + std::to_string(version));
  uint64_t flags = r.uint(2);
  if (flags & ~uint64_t(1)) die(2, "unknown trace flags");
  t.sync = flags & 1;
  t.seed = r.uint(8);
  t.pool_len = uint32_t(r.uint(4));
  if (t.pool_len > (128u << 20)) die(2, "value pool over the limit");
  t.pool_check = r.uint(8);
  t.name = r.bytes(r.uint(1));
  std::vector<Op>* phase = &t.run;
  uint64_t ops = 0;
  for (;;) {
    size_t at = r.pos();
    uint8_t code = uint8_t(r.uint(1));
    if (code == kEnd) {
      if (r.uint(8) != ops) die(2, "end record does not match the operations");
      if (!r.done()) die(2, "bytes after the end record");
      return t;
    }
    if (code == kPhase) {
      std::string name = r.bytes(r.uint(1));
      phase = name == "load" ? &t.load : &t.run;
      continue;
    }
    if (code < kInsert || code > kDelete)
      die(2, "unknown record code at byte " + std::to_string(at));
    Op op;
    op.code = code;
    size_t klen = r.uint(1);
    if (klen < 1 || klen > 31) die(2, "bad key length at byte " + std::to_string(at));
    op.key = r.bytes(klen);
    if (code == kInsert || code == kUpdate || code == kRmw) {
      op.vlen = uint32_t(r.uint(4));
      op.voff = uint32_t(r.uint(4));
      if (uint64_t(op.voff) + op.vlen > t.pool_len)
        die(2, "value outside the pool at byte " + std::to_string(at));
    } else if (code == kScan) {
      op.count = r.uint(8);
    }
    phase->push_back(std::move(op));
    ops++;
  }
}

std::string pool_of(uint64_t seed, uint32_t len) {
  std::string out;
  out.reserve(len + 8);
  uint64_t s = seed;
  while (out.size() < len) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int i = 0; i < 8; i++) out.push_back(char((z >> (8 * i)) & 0xff));
  }
  out.resize(len);
  return out;
}

uint64_t check_word(const std::string& pool) {
  uint64_t v = 0;
  size_t n = std::min<size_t>(8, pool.size());
  for (size_t i = 0; i < n; i++) v |= uint64_t(uint8_t(pool[pool.size() - n + i])) << (8 * i);
  return v;
}

struct Phase {
  std::vector<double> lat_us;
  uint64_t entries = 0;
  // Reads (and read-modify-writes) that found their key.
  uint64_t found = 0;
  double seconds = 0;
};

// What the command line says; each engine reads the settings it has.
struct Args {
  std::string trace, db;
  uint64_t cache = 8u << 20, write_buffer = 4u << 20, map = 1ull << 30;
  double bloom = 10;
  uint32_t subcompactions = 1;
};

#ifdef KV_ROCKSDB
void check(const rocksdb::Status& s, const char* what) {
  if (!s.ok() && !s.IsNotFound()) die(1, std::string(what) + ": " + s.ToString());
}

// RocksDB with the in-process stores' settings: the same block cache, memtable (write buffer)
// and bloom filter, no compression.
class Engine {
 public:
  Engine(const Args& a, bool sync) {
    rocksdb::Options opts;
    opts.create_if_missing = true;
    opts.error_if_exists = true;
    opts.compression = rocksdb::kNoCompression;
    opts.bottommost_compression = rocksdb::kNoCompression;
    opts.write_buffer_size = a.write_buffer;
    // As many threads per compaction as kura-store's merges get.
    opts.max_subcompactions = a.subcompactions;
    rocksdb::BlockBasedTableOptions table;
    if (a.cache > 0) {
      table.block_cache = rocksdb::NewLRUCache(a.cache);
    } else {
      table.no_block_cache = true;
    }
    if (a.bloom > 0) table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(a.bloom, false));
    opts.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(opts, a.db, &raw);
    if (!s.ok()) die(1, "cannot open RocksDB at " + a.db + ": " + s.ToString());
    db_.reset(raw);
    wo_.sync = sync;
    config_ = "RocksDB " + std::to_string(ROCKSDB_MAJOR) + "." + std::to_string(ROCKSDB_MINOR) +
              "." + std::to_string(ROCKSDB_PATCH) + ": block cache " + std::to_string(a.cache) +
              " B (LRU), write buffer " + std::to_string(a.write_buffer) + " B, bloom " +
              std::to_string(int(a.bloom)) + " bits/key, no compression, " +
              std::to_string(a.subcompactions) + " subcompaction(s), WAL on, sync " +
              (sync ? "every write" : "off");
  }
  const std::string& config() const { return config_; }
  void put(const std::string& k, const rocksdb::Slice& v) { check(db_->Put(wo_, k, v), "put"); }
  bool get(const std::string& k) {
    rocksdb::Status s = db_->Get(ro_, k, &got_);
    check(s, "get");
    return s.ok();
  }
  void del(const std::string& k) { check(db_->Delete(wo_, k), "delete"); }
  bool rmw(const std::string& k, const rocksdb::Slice& v) {
    bool found = get(k);
    put(k, v);
    return found;
  }
  uint64_t scan(const std::string& k, uint64_t count) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro_));
    uint64_t n = 0;
    for (it->Seek(k); it->Valid() && n < count; it->Next()) n++;
    check(it->status(), "scan");
    return n;
  }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteOptions wo_;
  rocksdb::ReadOptions ro_;
  std::string got_, config_;
};
using Value = rocksdb::Slice;
#endif

#ifdef KV_LMDB
void check(int rc, const char* what) {
  if (rc != 0 && rc != MDB_NOTFOUND) die(1, std::string(what) + ": " + mdb_strerror(rc));
}

// LMDB as it is usually run for reads: no read-ahead (random reads of a data set larger than
// memory), one write transaction per write (as every other engine here commits each put), and
// MDB_NOSYNC only where the workload does not sync.
using Value = std::string_view;

class Engine {
 public:
  Engine(const Args& a, bool sync) {
    if (mkdir(a.db.c_str(), 0755) != 0) die(1, "cannot create " + a.db);
    check(mdb_env_create(&env_), "mdb_env_create");
    check(mdb_env_set_mapsize(env_, a.map), "mdb_env_set_mapsize");
    unsigned flags = MDB_NORDAHEAD | (sync ? 0 : MDB_NOSYNC);
    check(mdb_env_open(env_, a.db.c_str(), flags, 0644), "mdb_env_open");
    MDB_txn* txn = nullptr;
    check(mdb_txn_begin(env_, nullptr, 0, &txn), "mdb_txn_begin");
    check(mdb_dbi_open(txn, nullptr, 0, &dbi_), "mdb_dbi_open");
    check(mdb_txn_commit(txn), "mdb_txn_commit");
    check(mdb_txn_begin(env_, nullptr, MDB_RDONLY, &reader_), "mdb_txn_begin");
    mdb_txn_reset(reader_);
    config_ = std::string(mdb_version(nullptr, nullptr, nullptr)) + ": map " +
              std::to_string(a.map) + " B, MDB_NORDAHEAD" + (sync ? "" : " | MDB_NOSYNC") +
              ", one write transaction per write, reads in a renewed read-only transaction, no " +
              "cache of its own (the page cache), sync " + (sync ? "every write" : "off");
  }
  ~Engine() {
    mdb_txn_abort(reader_);
    mdb_env_close(env_);
  }
  const std::string& config() const { return config_; }
  void put(const std::string& k, const Value& v) {
    MDB_txn* txn = begin();
    put_in(txn, k, v);
    check(mdb_txn_commit(txn), "mdb_txn_commit");
  }
  bool get(const std::string& k) {
    check(mdb_txn_renew(reader_), "mdb_txn_renew");
    MDB_val key = val(k), out;
    int rc = mdb_get(reader_, dbi_, &key, &out);
    check(rc, "mdb_get");
    mdb_txn_reset(reader_);
    return rc == 0;
  }
  void del(const std::string& k) {
    MDB_txn* txn = begin();
    MDB_val key = val(k);
    check(mdb_del(txn, dbi_, &key, nullptr), "mdb_del");
    check(mdb_txn_commit(txn), "mdb_txn_commit");
  }
  bool rmw(const std::string& k, const Value& v) {
    MDB_txn* txn = begin();
    MDB_val key = val(k), out;
    int rc = mdb_get(txn, dbi_, &key, &out);
    check(rc, "mdb_get");
    put_in(txn, k, v);
    check(mdb_txn_commit(txn), "mdb_txn_commit");
    return rc == 0;
  }
  uint64_t scan(const std::string& k, uint64_t count) {
    check(mdb_txn_renew(reader_), "mdb_txn_renew");
    MDB_cursor* cur = nullptr;
    check(mdb_cursor_open(reader_, dbi_, &cur), "mdb_cursor_open");
    MDB_val key = val(k), out;
    uint64_t n = 0;
    int rc = mdb_cursor_get(cur, &key, &out, MDB_SET_RANGE);
    while (rc == 0 && n < count) {
      n++;
      rc = mdb_cursor_get(cur, &key, &out, MDB_NEXT);
    }
    check(rc, "mdb_cursor_get");
    mdb_cursor_close(cur);
    mdb_txn_reset(reader_);
    return n;
  }

 private:
  static MDB_val val(const std::string& s) {
    return MDB_val{s.size(), const_cast<char*>(s.data())};
  }
  MDB_txn* begin() {
    MDB_txn* txn = nullptr;
    check(mdb_txn_begin(env_, nullptr, 0, &txn), "mdb_txn_begin");
    return txn;
  }
  void put_in(MDB_txn* txn, const std::string& k, const Value& v) {
    MDB_val key = val(k);
    MDB_val data{v.size(), const_cast<char*>(v.data())};
    check(mdb_put(txn, dbi_, &key, &data, 0), "mdb_put");
  }
  MDB_env* env_ = nullptr;
  MDB_dbi dbi_ = 0;
  MDB_txn* reader_ = nullptr;
  std::string config_;
};
#endif

Phase replay(Engine& db, const std::vector<Op>& ops, const std::string& pool, bool timed) {
  Phase p;
  if (timed) p.lat_us.reserve(ops.size());
  auto begin = std::chrono::steady_clock::now();
  for (const Op& op : ops) {
    auto t0 = std::chrono::steady_clock::now();
    Value value(pool.data() + op.voff, op.vlen);
    switch (op.code) {
      case kInsert:
      case kUpdate:
        db.put(op.key, value);
        break;
      case kRead:
        p.found += db.get(op.key);
        break;
      case kRmw:
        p.found += db.rmw(op.key, value);
        break;
      case kDelete:
        db.del(op.key);
        break;
      case kScan:
        p.entries += db.scan(op.key, op.count);
        break;
    }
    if (timed) {
      auto t1 = std::chrono::steady_clock::now();
      p.lat_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  }
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return p;
}

double pick(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t i = size_t(double(sorted.size() - 1) * q + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

// The configuration line as a JSON string (it holds no quotes or backslashes of its own, but a
// path could).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (uint8_t(c) >= 0x20) out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i++) {
    std::string flag = argv[i];
    if (i + 1 >= argc) die(2, "missing value after " + flag);
    std::string v = argv[++i];
    char* end = nullptr;
    if (flag == "--trace") {
      a.trace = v;
    } else if (flag == "--db") {
      a.db = v;
    } else if (flag == "--cache-bytes") {
      a.cache = std::strtoull(v.c_str(), &end, 10);
    } else if (flag == "--write-buffer-bytes") {
      a.write_buffer = std::strtoull(v.c_str(), &end, 10);
    } else if (flag == "--bloom-bits") {
      a.bloom = std::strtod(v.c_str(), &end);
    } else if (flag == "--subcompactions") {
      unsigned long n = std::strtoul(v.c_str(), &end, 10);
      if (n < 1 || n > 64) die(2, "--subcompactions takes 1 to 64: " + v);
      a.subcompactions = uint32_t(n);
    } else if (flag == "--map-bytes") {
      a.map = std::strtoull(v.c_str(), &end, 10);
    } else {
      die(2, "unknown argument " + flag);
    }
    if (end != nullptr && *end != '\0') die(2, "bad number for " + flag + ": " + v);
  }
  if (a.trace.empty() || a.db.empty()) die(2, "--trace and --db are required");
  std::ifstream f(a.trace, std::ios::binary);
  if (!f) die(2, "cannot read trace " + a.trace);
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Trace t = parse(buf);
  std::string pool = pool_of(t.seed, t.pool_len);
  if (t.pool_len > 0 && check_word(pool) != t.pool_check)
    die(2, "rebuilt value pool does not match the trace's check word");

  std::string config;
  Phase run;
  {
    Engine db(a, t.sync);
    config = db.config();
    replay(db, t.load, pool, false);
    run = replay(db, t.run, pool, true);
  }
  std::sort(run.lat_us.begin(), run.lat_us.end());

  double ops = double(run.lat_us.size());
  double counted = run.entries > 0 ? double(run.entries) : ops;
  std::printf(
      "{\"config\":%s,\"workload\":%s,\"sync\":%s,"
      "\"ops\":%zu,\"entries\":%llu,\"found\":%llu,\"seconds\":%.9f,\"ops_per_s\":%.3f,"
      "\"p50_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f}\n",
      json_string(config).c_str(), json_string(t.name).c_str(), t.sync ? "true" : "false",
      run.lat_us.size(), static_cast<unsigned long long>(run.entries),
      static_cast<unsigned long long>(run.found), run.seconds,
      counted / std::max(run.seconds, 1e-9), pick(run.lat_us, 0.5), pick(run.lat_us, 0.99),
      pick(run.lat_us, 0.999));
  return 0;
}
