// The RocksDB peer of `kura bench kv`, in C++ against librocksdb (Debian librocksdb-dev), so
// RocksDB is driven the way kura drives LevelDB: in process, no interpreter between the timer and
// the call. It replays a kura workload trace (crates/workload/src/trace.rs, version 1) and prints
// one JSON object on stdout.
//
//   rocksdb_peer --trace FILE --db DIR --cache-bytes N --write-buffer-bytes N --bloom-bits N
//
// The trace is read whole and parsed before anything is timed; the value pool is rebuilt from
// its seed (little-endian SplitMix64) and checked against the header's check word. The load
// phase is untimed; the run phase is timed as a whole (wall clock) and per operation, exactly as
// the LevelDB side is in crates/bench/src/kv.rs. Scans count the entries they return.
//
// Exit status: 0 on success, 2 for bad usage or a malformed trace, 1 for a RocksDB error.

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/version.h>

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
#include <vector>

namespace {

[[noreturn]] void die(int code, const std::string& msg) {
  std::fprintf(stderr, "rocksdb_peer: %s\n", msg.c_str());
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
  double seconds = 0;
};

void check(const rocksdb::Status& s, const char* what) {
  if (!s.ok() && !s.IsNotFound()) die(1, std::string(what) + ": " + s.ToString());
}

Phase replay(rocksdb::DB* db, const std::vector<Op>& ops, const std::string& pool, bool sync,
             bool timed) {
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  rocksdb::ReadOptions ro;
  Phase p;
  if (timed) p.lat_us.reserve(ops.size());
  std::string got;
  auto begin = std::chrono::steady_clock::now();
  for (const Op& op : ops) {
    auto t0 = std::chrono::steady_clock::now();
    rocksdb::Slice value(pool.data() + op.voff, op.vlen);
    switch (op.code) {
      case kInsert:
      case kUpdate:
        check(db->Put(wo, op.key, value), "put");
        break;
      case kRead:
        check(db->Get(ro, op.key, &got), "get");
        break;
      case kRmw:
        check(db->Get(ro, op.key, &got), "get");
        check(db->Put(wo, op.key, value), "put");
        break;
      case kDelete:
        check(db->Delete(wo, op.key), "delete");
        break;
      case kScan: {
        std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
        uint64_t n = 0;
        for (it->Seek(op.key); it->Valid() && n < op.count; it->Next()) n++;
        check(it->status(), "scan");
        p.entries += n;
        break;
      }
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

}  // namespace

int main(int argc, char** argv) {
  std::string trace_path, db_path;
  uint64_t cache = 8u << 20, write_buffer = 4u << 20;
  double bloom = 10;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (i + 1 >= argc) die(2, "missing value after " + a);
    std::string v = argv[++i];
    char* end = nullptr;
    if (a == "--trace") {
      trace_path = v;
    } else if (a == "--db") {
      db_path = v;
    } else if (a == "--cache-bytes") {
      cache = std::strtoull(v.c_str(), &end, 10);
    } else if (a == "--write-buffer-bytes") {
      write_buffer = std::strtoull(v.c_str(), &end, 10);
    } else if (a == "--bloom-bits") {
      bloom = std::strtod(v.c_str(), &end);
    } else {
      die(2, "unknown argument " + a);
    }
    if (end != nullptr && *end != '\0') die(2, "bad number for " + a + ": " + v);
  }
  if (trace_path.empty() || db_path.empty()) die(2, "--trace and --db are required");
  std::ifstream f(trace_path, std::ios::binary);
  if (!f) die(2, "cannot read trace " + trace_path);
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Trace t = parse(buf);
  std::string pool = pool_of(t.seed, t.pool_len);
  if (t.pool_len > 0 && check_word(pool) != t.pool_check)
    die(2, "rebuilt value pool does not match the trace's check word");

  rocksdb::Options opts;
  opts.create_if_missing = true;
  opts.error_if_exists = true;
  opts.compression = rocksdb::kNoCompression;
  opts.bottommost_compression = rocksdb::kNoCompression;
  opts.write_buffer_size = write_buffer;
  rocksdb::BlockBasedTableOptions table;
  if (cache > 0) {
    table.block_cache = rocksdb::NewLRUCache(cache);
  } else {
    table.no_block_cache = true;
  }
  if (bloom > 0) table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(bloom, false));
  opts.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(opts, db_path, &raw);
  if (!s.ok()) die(1, "cannot open RocksDB at " + db_path + ": " + s.ToString());
  std::unique_ptr<rocksdb::DB> db(raw);

  replay(db.get(), t.load, pool, t.sync, false);
  Phase run = replay(db.get(), t.run, pool, t.sync, true);
  std::sort(run.lat_us.begin(), run.lat_us.end());
  db.reset();

  double ops = double(run.lat_us.size());
  double counted = run.entries > 0 ? double(run.entries) : ops;
  std::printf(
      "{\"engine\":\"rocksdb\",\"rocksdb\":\"%d.%d.%d\",\"workload\":\"%s\",\"sync\":%s,"
      "\"ops\":%zu,\"entries\":%llu,\"seconds\":%.9f,\"ops_per_s\":%.3f,"
      "\"p50_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f}\n",
      ROCKSDB_MAJOR, ROCKSDB_MINOR, ROCKSDB_PATCH, t.name.c_str(), t.sync ? "true" : "false",
      run.lat_us.size(), static_cast<unsigned long long>(run.entries), run.seconds,
      counted / std::max(run.seconds, 1e-9), pick(run.lat_us, 0.5), pick(run.lat_us, 0.99),
      pick(run.lat_us, 0.999));
  return 0;
}
