// Host side: reads the flattened map (NAME.flat) and kura's expected mappings (NAME.expect)
// that `cargo run -p kura-crush --example gpu_vectors` writes, refuses what crush_core.h does
// not cover, and holds the arrays a CrushView points into. Also the single-threaded CPU
// reference run and the comparison with the expected mappings.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "crush_core.h"

struct FlatMap {
    CrushTunables tun;
    CrushRule rule;
    int max_devices = 0;
    int max_buckets = 0;
    std::vector<int> b_start, b_size, b_type, items;
    std::vector<uint32_t> item_w, rc_shift, dev_w;
    std::vector<uint64_t> rc_m, rh_lh, ll;

    CrushView view(bool use_recip) const {
        CrushView v;
        v.max_devices = max_devices;
        v.max_buckets = max_buckets;
        v.b_start = b_start.data();
        v.b_size = b_size.data();
        v.b_type = b_type.data();
        v.items = items.data();
        v.item_w = item_w.data();
        v.rc_m = rc_m.data();
        v.rc_shift = rc_shift.data();
        v.dev_w = dev_w.data();
        v.n_dev_w = (int)dev_w.size();
        v.rh_lh = rh_lh.data();
        v.ll = ll.data();
        v.use_recip = use_recip ? 1 : 0;
        return v;
    }
};

struct Expected {
    uint32_t n = 0;
    int32_t x_first = 0;
    uint32_t result_max = 0;
    std::vector<int32_t> items;  // n * result_max, unused slots CRUSH_ITEM_NONE
};

[[noreturn]] inline void flat_fail(const std::string &path, const std::string &why) {
    throw std::runtime_error(path + ": " + why);
}

// kura's Recip: m = ceil(2^(49+l) / w), 2^(l-1) < w <= 2^l, so (a * m) >> (49+l) == a / w
// for every a < 2^50.
inline void make_recip(uint32_t w, uint64_t *m, uint32_t *shift) {
    uint32_t l = 0;
    if (w > 1) {
        l = 32 - (uint32_t)__builtin_clz(w - 1);
    }
    uint32_t s = 49 + l;
    unsigned __int128 one = (unsigned __int128)1 << s;
    unsigned __int128 d = w == 0 ? 1 : w;
    *m = (uint64_t)((one + d - 1) / d);
    *shift = s;
}

inline FlatMap load_flat(const std::string &path) {
    std::ifstream f(path);
    if (!f) flat_fail(path, "cannot open");
    FlatMap fm;
    std::string tok;
    int version = 0;
    if (!(f >> tok >> version) || tok != "kura-crush-flat" || version != 1) {
        flat_fail(path, "not a kura-crush-flat 1 file");
    }
    auto expect = [&](const char *word) {
        if (!(f >> tok) || tok != word) flat_fail(path, std::string("expected '") + word + "'");
    };
    expect("tunables");
    if (!(f >> fm.tun.choose_local_tries >> fm.tun.choose_local_fallback_tries >>
          fm.tun.choose_total_tries >> fm.tun.chooseleaf_descend_once >>
          fm.tun.chooseleaf_vary_r >> fm.tun.chooseleaf_stable)) {
        flat_fail(path, "bad tunables");
    }
    if (fm.tun.choose_local_fallback_tries != 0) {
        flat_fail(path, "choose_local_fallback_tries > 0 (permutation fallback) is not covered");
    }
    expect("max_devices");
    if (!(f >> fm.max_devices) || fm.max_devices < 0) flat_fail(path, "bad max_devices");
    expect("max_buckets");
    if (!(f >> fm.max_buckets) || fm.max_buckets < 0 || fm.max_buckets > (1 << 20)) {
        flat_fail(path, "bad max_buckets");
    }
    fm.b_start.assign(fm.max_buckets, 0);
    fm.b_size.assign(fm.max_buckets, -1);
    fm.b_type.assign(fm.max_buckets, -1);
    while (f >> tok && tok == "bucket") {
        int id, type, alg, hash, size;
        if (!(f >> id >> type >> alg >> hash >> size)) flat_fail(path, "bad bucket header");
        long idx = -1L - id;
        if (id >= 0 || idx >= fm.max_buckets || fm.b_size[idx] >= 0) {
            flat_fail(path, "bad or repeated bucket id " + std::to_string(id));
        }
        if (alg != 5) flat_fail(path, "bucket " + std::to_string(id) + " is not straw2");
        if (hash != 0) flat_fail(path, "bucket " + std::to_string(id) + " is not rjenkins1");
        if (size < 0 || size > (1 << 20)) flat_fail(path, "bad bucket size");
        fm.b_start[idx] = (int)fm.items.size();
        fm.b_size[idx] = size;
        fm.b_type[idx] = type;
        for (int i = 0; i < size; i++) {
            int item;
            uint32_t w;
            if (!(f >> item >> w)) flat_fail(path, "bad bucket item");
            uint64_t m = 0;
            uint32_t sh = 0;
            if (w != 0) make_recip(w, &m, &sh);
            fm.items.push_back(item);
            fm.item_w.push_back(w);
            fm.rc_m.push_back(m);
            fm.rc_shift.push_back(sh);
        }
    }
    // Items that name buckets must exist: the mapper looks their type up.
    for (size_t i = 0; i < fm.items.size(); i++) {
        int it = fm.items[i];
        if (it < 0) {
            long idx = -1L - it;
            if (idx >= fm.max_buckets || fm.b_size[idx] < 0) {
                flat_fail(path, "dangling bucket item " + std::to_string(it));
            }
        }
    }
    if (tok != "rule") flat_fail(path, "expected 'rule'");
    if (!(f >> fm.rule.nsteps) || fm.rule.nsteps < 0 || fm.rule.nsteps > CRUSH_MAX_STEPS) {
        flat_fail(path, "bad step count");
    }
    for (int s = 0; s < fm.rule.nsteps; s++) {
        expect("step");
        int op, a1, a2;
        if (!(f >> op >> a1 >> a2)) flat_fail(path, "bad step");
        if (op == OP_CHOOSE_INDEP || op == OP_CHOOSELEAF_INDEP) {
            flat_fail(path, "indep steps are not covered");
        }
        if (op == OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES && a1 > 0) {
            flat_fail(path, "set_choose_local_fallback_tries > 0 is not covered");
        }
        fm.rule.op[s] = op;
        fm.rule.arg1[s] = a1;
        fm.rule.arg2[s] = a2;
    }
    auto read_u32s = [&](const char *word, std::vector<uint32_t> &v) {
        expect(word);
        size_t n;
        if (!(f >> n) || n > (1u << 24)) flat_fail(path, std::string("bad ") + word);
        v.resize(n);
        for (size_t i = 0; i < n; i++) {
            if (!(f >> v[i])) flat_fail(path, std::string("bad ") + word);
        }
    };
    auto read_hex64 = [&](const char *word, std::vector<uint64_t> &v, size_t want) {
        expect(word);
        size_t n;
        if (!(f >> n) || n != want) flat_fail(path, std::string("bad ") + word);
        v.resize(n);
        for (size_t i = 0; i < n; i++) {
            if (!(f >> std::hex >> v[i] >> std::dec)) flat_fail(path, std::string("bad ") + word);
        }
    };
    read_u32s("device_weights", fm.dev_w);
    read_hex64("ln_rh_lh", fm.rh_lh, 258);
    read_hex64("ln_ll", fm.ll, 256);
    expect("end");
    return fm;
}

inline Expected load_expected(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) flat_fail(path, "cannot open");
    char magic[4];
    Expected e;
    if (!f.read(magic, 4) || std::memcmp(magic, "KCX1", 4) != 0) flat_fail(path, "bad magic");
    uint32_t hdr[3];
    if (!f.read((char *)hdr, sizeof hdr)) flat_fail(path, "short header");
    e.n = hdr[0];
    e.x_first = (int32_t)hdr[1];
    e.result_max = hdr[2];
    if (e.result_max == 0 || e.result_max > CRUSH_RMAX) flat_fail(path, "result size out of range");
    if (e.n > (1u << 28)) flat_fail(path, "too many inputs");
    e.items.resize((size_t)e.n * e.result_max);
    if (!f.read((char *)e.items.data(), e.items.size() * 4)) flat_fail(path, "short body");
    return e;
}

// Maps x_first .. x_first+n-1 into out (n * result_max slots, padded with ITEM_NONE).
inline void cpu_map_range(const FlatMap &fm, bool use_recip, int x_first, uint32_t n,
                          int result_max, int32_t *out) {
    CrushView v = fm.view(use_recip);
    int res[CRUSH_RMAX];
    for (uint32_t i = 0; i < n; i++) {
        int len = crush_do_rule(v, fm.tun, fm.rule, x_first + (int)i, res, result_max);
        for (int k = 0; k < result_max; k++) {
            out[(size_t)i * result_max + k] = k < len ? res[k] : CRUSH_ITEM_NONE;
        }
    }
}

// Number of inputs among the first n whose mapping differs from the expected one; prints
// the first few differences to stderr.
inline uint64_t count_mismatches(const char *what, const Expected &e, const int32_t *got,
                                 uint32_t n) {
    uint64_t bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        const int32_t *a = &e.items[(size_t)i * e.result_max];
        const int32_t *b = &got[(size_t)i * e.result_max];
        if (std::memcmp(a, b, e.result_max * 4) != 0) {
            if (bad < 5) {
                std::string sa, sb;
                for (uint32_t k = 0; k < e.result_max; k++) {
                    sa += (k ? "," : "") + std::to_string(a[k]);
                    sb += (k ? "," : "") + std::to_string(b[k]);
                }
                fprintf(stderr, "%s: x=%d expected [%s] got [%s]\n", what, e.x_first + (int)i,
                        sa.c_str(), sb.c_str());
            }
            bad++;
        }
    }
    return bad;
}

inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
