// The CPU half of crush_gpu.cu on its own, for machines without CUDA: maps every input of a
// vector set with crush_core.h (plain '/' and reciprocal division), compares each mapping
// with kura's, prints one JSON line. Exit status 1 if any mapping differs.
//
//   ./cpu_check NAME.flat NAME.expect
#include <algorithm>
#include <cstdio>

#include "flat_map.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s NAME.flat NAME.expect\n", argv[0]);
        return 2;
    }
    try {
        FlatMap fm = load_flat(argv[1]);
        Expected e = load_expected(argv[2]);
        std::vector<int32_t> got(e.items.size());
        uint64_t bad[2];
        double rate[2];
        for (int recip = 0; recip < 2; recip++) {
            double t0 = now_s();
            cpu_map_range(fm, recip != 0, e.x_first, e.n, (int)e.result_max, got.data());
            double t = now_s() - t0;
            rate[recip] = e.n / t;
            bad[recip] = count_mismatches(recip ? "cpu recip" : "cpu div", e, got.data(), e.n);
        }
        printf("{\"map\":\"%s\",\"inputs_checked\":%u,\"result_max\":%u,"
               "\"cpu_div_mismatches\":%llu,\"cpu_recip_mismatches\":%llu,"
               "\"cpu_div_1t_mappings_per_s\":%.0f,\"cpu_recip_1t_mappings_per_s\":%.0f}\n",
               argv[1], e.n, e.result_max, (unsigned long long)bad[0],
               (unsigned long long)bad[1], rate[0], rate[1]);
        return bad[0] || bad[1] ? 1 : 0;
    } catch (const std::exception &ex) {
        fprintf(stderr, "error: %s\n", ex.what());
        return 2;
    }
}
