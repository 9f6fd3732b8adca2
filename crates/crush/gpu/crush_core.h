// CRUSH mapping for straw2-only hierarchies, written once for both the CUDA kernel and the
// plain C++ reference on the host: rjenkins1 hashes, crush_ln, straw2 choose, choose and
// chooseleaf firstn with the tunables and set_* steps, as kura's mapper.rs (and Ceph's
// mapper.c) run them. Compiled by nvcc (host and device) and by g++ (host only), so the
// CPU check proves the very code the GPU runs.
//
// Not covered (the loader in flat_map.h refuses such maps): bucket algorithms other than
// straw2, hash types other than rjenkins1, indep steps, the permutation fallback
// (choose_local_fallback_tries > 0, the legacy/argonaut profiles), choose_args weight sets,
// results larger than CRUSH_RMAX.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define CRUSH_HD __host__ __device__ inline
#else
#define CRUSH_HD inline
#endif

#define CRUSH_RMAX 16
#define CRUSH_MAX_STEPS 16
#define CRUSH_ITEM_NONE 0x7fffffff

enum {
    OP_NOOP = 0,
    OP_TAKE = 1,
    OP_CHOOSE_FIRSTN = 2,
    OP_CHOOSE_INDEP = 3,
    OP_EMIT = 4,
    OP_CHOOSELEAF_FIRSTN = 6,
    OP_CHOOSELEAF_INDEP = 7,
    OP_SET_CHOOSE_TRIES = 8,
    OP_SET_CHOOSELEAF_TRIES = 9,
    OP_SET_CHOOSE_LOCAL_TRIES = 10,
    OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES = 11,
    OP_SET_CHOOSELEAF_VARY_R = 12,
    OP_SET_CHOOSELEAF_STABLE = 13,
};

// The map as flat arrays. Bucket index idx holds id -1-idx; b_size[idx] < 0 marks an unused
// id. Bucket idx's items are items[b_start[idx] .. b_start[idx] + b_size[idx]], with their
// straw2 weights in item_w and the exact-division reciprocals of those weights in rc_m and
// rc_shift (unused where the weight is 0).
struct CrushView {
    int max_devices;
    int max_buckets;
    const int *b_start;
    const int *b_size;
    const int *b_type;
    const int *items;
    const uint32_t *item_w;
    const uint64_t *rc_m;
    const uint32_t *rc_shift;
    const uint32_t *dev_w;  // device weights (16.16), index = device id
    int n_dev_w;
    const uint64_t *rh_lh;  // crush_ln tables, 258 and 256 entries
    const uint64_t *ll;
    int use_recip;          // straw2 divides through rc_m/rc_shift instead of '/'
};

struct CrushTunables {
    uint32_t choose_local_tries;
    uint32_t choose_local_fallback_tries;
    uint32_t choose_total_tries;
    uint32_t chooseleaf_descend_once;
    uint32_t chooseleaf_vary_r;
    uint32_t chooseleaf_stable;
};

struct CrushRule {
    int nsteps;
    int op[CRUSH_MAX_STEPS];
    int arg1[CRUSH_MAX_STEPS];
    int arg2[CRUSH_MAX_STEPS];
};

// ---- rjenkins1 -------------------------------------------------------------------------

#define CRUSH_HASH_SEED 1315423911u

#define CRUSH_MIX(a, b, c)          \
    do {                            \
        a = a - b; a = a - c; a = a ^ (c >> 13); \
        b = b - c; b = b - a; b = b ^ (a << 8);  \
        c = c - a; c = c - b; c = c ^ (b >> 13); \
        a = a - b; a = a - c; a = a ^ (c >> 12); \
        b = b - c; b = b - a; b = b ^ (a << 16); \
        c = c - a; c = c - b; c = c ^ (b >> 5);  \
        a = a - b; a = a - c; a = a ^ (c >> 3);  \
        b = b - c; b = b - a; b = b ^ (a << 10); \
        c = c - a; c = c - b; c = c ^ (b >> 15); \
    } while (0)

CRUSH_HD uint32_t crush_hash32_2(uint32_t a, uint32_t b) {
    uint32_t hash = CRUSH_HASH_SEED ^ a ^ b;
    uint32_t x = 231232u;
    uint32_t y = 1232u;
    CRUSH_MIX(a, b, hash);
    CRUSH_MIX(x, a, hash);
    CRUSH_MIX(b, y, hash);
    return hash;
}

CRUSH_HD uint32_t crush_hash32_3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t hash = CRUSH_HASH_SEED ^ a ^ b ^ c;
    uint32_t x = 231232u;
    uint32_t y = 1232u;
    CRUSH_MIX(a, b, hash);
    CRUSH_MIX(c, x, hash);
    CRUSH_MIX(y, a, hash);
    CRUSH_MIX(b, x, hash);
    CRUSH_MIX(y, c, hash);
    return hash;
}

// ---- crush_ln ---------------------------------------------------------------------------

CRUSH_HD int crush_clz32(uint32_t v) {
#ifdef __CUDA_ARCH__
    return __clz((int)v);
#else
    return v == 0 ? 32 : __builtin_clz(v);
#endif
}

CRUSH_HD uint64_t crush_mulhi64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
    return __umul64hi(a, b);
#else
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#endif
}

// 2^44 * log2(xin + 1) in Ceph's fixed point, xin in 0..=0xffff.
CRUSH_HD uint64_t crush_ln(const uint64_t *rh_lh, const uint64_t *ll, uint32_t xin) {
    uint32_t x = xin + 1;
    int iexpon = 15;
    if ((x & 0x18000u) == 0) {
        int bits = crush_clz32(x & 0x1ffffu) - 16;
        x <<= bits;
        iexpon = 15 - bits;
    }
    uint32_t index1 = (x >> 8) << 1;
    uint64_t rh = rh_lh[index1 - 256];
    uint64_t lh = rh_lh[index1 + 1 - 256];
    uint64_t xl64 = ((uint64_t)x * rh) >> 48;
    uint64_t result = (uint64_t)iexpon << (12 + 32);
    result += (lh + ll[xl64 & 0xff]) >> (48 - 12 - 32);
    return result;
}

// ---- straw2 -----------------------------------------------------------------------------

// a / w for a < 2^50 through the reciprocal (m, shift) of w: (a * m) >> shift, shift in
// 49..=81 (kura's Recip).
CRUSH_HD uint64_t crush_recip_div(uint64_t a, uint64_t m, uint32_t shift) {
    uint64_t hi = crush_mulhi64(a, m);
    if (shift >= 64) {
        return hi >> (shift - 64);
    }
    uint64_t lo = a * m;
    return (hi << (64 - shift)) | (lo >> shift);
}

// The item of bucket index bidx with the highest draw ln(u)/w; the first such item on ties;
// weight-0 items draw INT64_MIN.
CRUSH_HD int crush_straw2(const CrushView &m, int bidx, uint32_t x, uint32_t r) {
    int start = m.b_start[bidx];
    int size = m.b_size[bidx];
    int high = 0;
    int64_t high_draw = 0;
    for (int i = 0; i < size; i++) {
        uint32_t w = m.item_w[start + i];
        int64_t draw;
        if (w != 0) {
            uint32_t u = crush_hash32_3(x, (uint32_t)m.items[start + i], r) & 0xffffu;
            int64_t ln = (int64_t)(crush_ln(m.rh_lh, m.ll, u) - 0x1000000000000ull);
            if (m.use_recip) {
                uint64_t mm = m.rc_m[start + i];
                uint32_t sh = m.rc_shift[start + i];
                if (ln < 0) {
                    draw = -(int64_t)crush_recip_div((uint64_t)(-ln), mm, sh);
                } else {
                    draw = (int64_t)crush_recip_div((uint64_t)ln, mm, sh);
                }
            } else {
                draw = ln / (int64_t)w;
            }
        } else {
            draw = INT64_MIN;
        }
        if (i == 0 || draw > high_draw) {
            high = i;
            high_draw = draw;
        }
    }
    return m.items[start + high];
}

// ---- rule steps -------------------------------------------------------------------------

CRUSH_HD bool crush_bucket_ok(const CrushView &m, int id) {
    if (id >= 0) {
        return false;
    }
    int64_t idx = -1 - (int64_t)id;
    return idx < m.max_buckets && m.b_size[idx] >= 0;
}

// Device `item` is out for input x: weight 0 (or none) always, 0x10000 and up never, in
// between for a hash-chosen share of the inputs.
CRUSH_HD bool crush_is_out(const CrushView &m, int item, int x) {
    if (item >= m.n_dev_w) {
        return true;
    }
    uint32_t w = m.dev_w[item];
    if (w >= 0x10000u) {
        return false;
    }
    if (w == 0) {
        return true;
    }
    return (crush_hash32_2((uint32_t)x, (uint32_t)item) & 0xffffu) >= w;
}

// crush_choose_firstn. LEAF: chooseleaf (each chosen bucket recursed to one device into
// out2); the recursion is the LEAF=false instantiation, so there is no real recursion.
template <bool LEAF>
CRUSH_HD int crush_choose_firstn(const CrushView &m, int x, int bidx, int numrep, int type,
                                 int *out, int outpos, int out_size, uint32_t tries,
                                 uint32_t recurse_tries, uint32_t local_retries,
                                 uint32_t local_fallback_retries, uint32_t vary_r,
                                 uint32_t stable, int *out2, int parent_r) {
    int count = out_size;
    int rep = stable ? 0 : outpos;
    while (rep < numrep && count > 0) {
        uint32_t ftotal = 0;
        bool skip_rep = false;
        int item = 0;
        for (;;) {  // one descent from bidx
            bool retry_descent = false;
            int in = bidx;
            uint32_t flocal = 0;
            for (;;) {  // one choice in bucket `in`
                bool collide = false;
                bool retry_bucket = false;
                bool reject;
                int r = rep + parent_r + (int)ftotal;
                uint32_t size = (uint32_t)m.b_size[in];
                if (size == 0) {
                    reject = true;
                } else {
                    item = crush_straw2(m, in, (uint32_t)x, (uint32_t)r);
                    if (item >= m.max_devices) {
                        skip_rep = true;
                        break;
                    }
                    int itemtype;
                    if (item >= 0) {
                        itemtype = 0;
                    } else if (crush_bucket_ok(m, item)) {
                        itemtype = m.b_type[-1 - item];
                    } else {
                        skip_rep = true;
                        break;
                    }
                    if (itemtype != type) {
                        if (item < 0) {
                            in = -1 - item;
                            continue;
                        }
                        skip_rep = true;
                        break;
                    }
                    for (int i = 0; i < outpos; i++) {
                        if (out[i] == item) {
                            collide = true;
                            break;
                        }
                    }
                    bool rej = false;
                    if constexpr (LEAF) {
                        if (!collide) {
                            if (item < 0) {
                                int sub_r = vary_r ? (r >> (vary_r - 1)) : 0;
                                int got = crush_choose_firstn<false>(
                                    m, x, -1 - item, stable ? 1 : outpos + 1, 0, out2, outpos,
                                    count, recurse_tries, 0, local_retries,
                                    local_fallback_retries, vary_r, stable, 0, sub_r);
                                if (got <= outpos) {
                                    rej = true;
                                }
                            } else {
                                out2[outpos] = item;
                            }
                        }
                    }
                    if (!rej && itemtype == 0) {
                        rej = crush_is_out(m, item, x);
                    }
                    reject = rej;
                }
                if (reject || collide) {
                    ftotal++;
                    flocal++;
                    if ((collide && flocal <= local_retries) ||
                        (local_fallback_retries > 0 && flocal <= size + local_fallback_retries)) {
                        retry_bucket = true;
                    } else if (ftotal < tries) {
                        retry_descent = true;
                    } else {
                        skip_rep = true;
                    }
                }
                if (!retry_bucket) {
                    break;
                }
            }
            if (!retry_descent) {
                break;
            }
        }
        if (!skip_rep) {
            out[outpos] = item;
            outpos++;
            count--;
        }
        rep++;
    }
    return outpos;
}

// crush_do_rule for input x: up to result_max (<= CRUSH_RMAX) items into result; returns
// how many.
CRUSH_HD int crush_do_rule(const CrushView &m, const CrushTunables &t, const CrushRule &rule,
                           int x, int *result, int result_max) {
    int a[CRUSH_RMAX];
    int b[CRUSH_RMAX];
    int c[CRUSH_RMAX];
    int *w = a;
    int *o = b;
    int wsize = 0;
    int outlen = 0;
    uint32_t choose_tries = t.choose_total_tries + 1;
    uint32_t choose_leaf_tries = 0;
    uint32_t local_retries = t.choose_local_tries;
    uint32_t local_fallback_retries = t.choose_local_fallback_tries;
    uint32_t vary_r = t.chooseleaf_vary_r;
    uint32_t stable = t.chooseleaf_stable;
    for (int s = 0; s < rule.nsteps; s++) {
        int op = rule.op[s];
        int arg1 = rule.arg1[s];
        int arg2 = rule.arg2[s];
        if (op == OP_TAKE) {
            if ((arg1 >= 0 && arg1 < m.max_devices) || crush_bucket_ok(m, arg1)) {
                w[0] = arg1;
                wsize = 1;
            }
        } else if (op == OP_SET_CHOOSE_TRIES) {
            if (arg1 > 0) choose_tries = (uint32_t)arg1;
        } else if (op == OP_SET_CHOOSELEAF_TRIES) {
            if (arg1 > 0) choose_leaf_tries = (uint32_t)arg1;
        } else if (op == OP_SET_CHOOSE_LOCAL_TRIES) {
            if (arg1 >= 0) local_retries = (uint32_t)arg1;
        } else if (op == OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES) {
            if (arg1 >= 0) local_fallback_retries = (uint32_t)arg1;
        } else if (op == OP_SET_CHOOSELEAF_VARY_R) {
            if (arg1 >= 0) vary_r = (uint32_t)arg1;
        } else if (op == OP_SET_CHOOSELEAF_STABLE) {
            if (arg1 >= 0) stable = (uint32_t)arg1;
        } else if (op == OP_CHOOSE_FIRSTN || op == OP_CHOOSELEAF_FIRSTN) {
            if (wsize == 0) {
                continue;
            }
            bool leaf = op == OP_CHOOSELEAF_FIRSTN;
            int osize = 0;
            for (int i = 0; i < wsize; i++) {
                int numrep = arg1;
                if (numrep <= 0) {
                    numrep += result_max;
                    if (numrep <= 0) {
                        continue;
                    }
                }
                if (!crush_bucket_ok(m, w[i])) {
                    continue;
                }
                int bidx = -1 - w[i];
                int room = result_max - osize;
                uint32_t recurse_tries = choose_leaf_tries     ? choose_leaf_tries
                                         : t.chooseleaf_descend_once ? 1u
                                                                     : choose_tries;
                int got;
                if (leaf) {
                    got = crush_choose_firstn<true>(m, x, bidx, numrep, arg2, o + osize, 0, room,
                                                    choose_tries, recurse_tries, local_retries,
                                                    local_fallback_retries, vary_r, stable,
                                                    c + osize, 0);
                } else {
                    got = crush_choose_firstn<false>(m, x, bidx, numrep, arg2, o + osize, 0,
                                                     room, choose_tries, recurse_tries,
                                                     local_retries, local_fallback_retries,
                                                     vary_r, stable, 0, 0);
                }
                osize += got;
            }
            if (leaf) {
                for (int i = 0; i < osize; i++) {
                    o[i] = c[i];
                }
            }
            int *tmp = w;
            w = o;
            o = tmp;
            wsize = osize;
        } else if (op == OP_EMIT) {
            for (int i = 0; i < wsize && outlen < result_max; i++) {
                result[outlen++] = w[i];
            }
            wsize = 0;
        }
    }
    return outlen;
}
