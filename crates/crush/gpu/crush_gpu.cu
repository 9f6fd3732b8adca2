// CRUSH straw2 mapping on an NVIDIA GPU, one thread per input x, checked against kura's
// mappings and timed against the same code on one CPU core.
//
//   ./crush_gpu NAME.flat NAME.expect [--reps R] [--time-inputs M] [--block B]
//               [--cpu-inputs K]
//
// It maps x_first .. x_first+M-1 (M = max(--time-inputs, the expected count); default
// 16777216) with two kernels, straw2 dividing with '/' ("div") and through exact reciprocals
// ("recip"), compares the first n mappings of each with kura's, and the two kernels with each
// other over all M; times R launches of each (CUDA events: kernel only, and map upload +
// kernel + result download into pinned memory) and the single-threaded CPU reference
// (crush_core.h compiled for the host) over the first K (default: all n) expected inputs. Prints one JSON line;
// exit status 1 if any mapping differs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flat_map.h"

// Names the build in the JSON (the Makefile's register-capped build sets it).
#ifndef CRUSH_BUILD_LABEL
#define CRUSH_BUILD_LABEL "default"
#endif

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t err_ = (call);                                                    \
        if (err_ != cudaSuccess) {                                                    \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_),   \
                    __FILE__, __LINE__, cudaGetErrorString(err_));                    \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

__global__ void crush_map_kernel(CrushView m, CrushTunables t, CrushRule rule, int x_first,
                                 int n, int result_max, int32_t *out) {
    // The logarithm tables are read at data-dependent indices: shared memory, not constant
    // memory (which serialises differing addresses within a warp).
    __shared__ uint64_t s_rh_lh[258];
    __shared__ uint64_t s_ll[256];
    for (int i = threadIdx.x; i < 258; i += blockDim.x) {
        s_rh_lh[i] = m.rh_lh[i];
    }
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        s_ll[i] = m.ll[i];
    }
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    m.rh_lh = s_rh_lh;
    m.ll = s_ll;
    int res[CRUSH_RMAX];
    int len = crush_do_rule(m, t, rule, x_first + i, res, result_max);
    for (int k = 0; k < result_max; k++) {
        out[(size_t)i * result_max + k] = k < len ? res[k] : CRUSH_ITEM_NONE;
    }
}

template <typename T>
static T *upload(const std::vector<T> &v) {
    T *d = nullptr;
    size_t bytes = std::max<size_t>(1, v.size()) * sizeof(T);
    CUDA_CHECK(cudaMalloc(&d, bytes));
    if (!v.empty()) {
        CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    return d;
}

template <typename T>
static void reupload(T *d, const std::vector<T> &v, cudaStream_t s) {
    if (!v.empty()) {
        CUDA_CHECK(cudaMemcpyAsync(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
    }
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr,
                "usage: %s NAME.flat NAME.expect [--reps R] [--time-inputs M] [--block B] "
                "[--cpu-inputs K]\n",
                argv[0]);
        return 2;
    }
    int reps = 10;
    long time_inputs = 1L << 24;
    int block = 256;
    long cpu_inputs = -1;
    for (int a = 3; a + 1 < argc; a += 2) {
        std::string k = argv[a];
        long v = atol(argv[a + 1]);
        if (k == "--reps" && v > 0 && v <= 1000) {
            reps = (int)v;
        } else if (k == "--time-inputs" && v > 0 && v <= (1L << 28)) {
            time_inputs = v;
        } else if (k == "--block" && v >= 32 && v <= 1024 && v % 32 == 0) {
            block = (int)v;
        } else if (k == "--cpu-inputs" && v > 0) {
            cpu_inputs = v;
        } else {
            fprintf(stderr, "bad option %s %s\n", argv[a], argv[a + 1]);
            return 2;
        }
    }
    FlatMap fm;
    Expected e;
    try {
        fm = load_flat(argv[1]);
        e = load_expected(argv[2]);
    } catch (const std::exception &ex) {
        fprintf(stderr, "error: %s\n", ex.what());
        return 2;
    }
    const int rmax = (int)e.result_max;
    const uint32_t n = e.n;
    const int m_inputs = (int)std::max<long>(time_inputs, (long)n);
    const size_t out_slots = (size_t)m_inputs * rmax;

    // CPU reference, one thread, over the first n_cpu expected inputs.
    const uint32_t n_cpu = cpu_inputs > 0 && cpu_inputs < (long)n ? (uint32_t)cpu_inputs : n;
    std::vector<int32_t> cpu((size_t)n_cpu * rmax);
    uint64_t cpu_bad[2];
    double cpu_rate[2];
    for (int recip = 0; recip < 2; recip++) {
        double t0 = now_s();
        cpu_map_range(fm, recip != 0, e.x_first, n_cpu, rmax, cpu.data());
        cpu_rate[recip] = n_cpu / (now_s() - t0);
        cpu_bad[recip] =
            count_mismatches(recip ? "cpu recip" : "cpu div", e, cpu.data(), n_cpu);
    }

    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    CUDA_CHECK(cudaSetDevice(0));

    CrushView dv = fm.view(false);
    int *d_b_start = upload(fm.b_start), *d_b_size = upload(fm.b_size);
    int *d_b_type = upload(fm.b_type), *d_items = upload(fm.items);
    uint32_t *d_item_w = upload(fm.item_w), *d_rc_shift = upload(fm.rc_shift);
    uint32_t *d_dev_w = upload(fm.dev_w);
    uint64_t *d_rc_m = upload(fm.rc_m), *d_rh_lh = upload(fm.rh_lh), *d_ll = upload(fm.ll);
    dv.b_start = d_b_start;
    dv.b_size = d_b_size;
    dv.b_type = d_b_type;
    dv.items = d_items;
    dv.item_w = d_item_w;
    dv.rc_m = d_rc_m;
    dv.rc_shift = d_rc_shift;
    dv.dev_w = d_dev_w;
    dv.rh_lh = d_rh_lh;
    dv.ll = d_ll;

    int32_t *d_out = nullptr;
    CUDA_CHECK(cudaMalloc(&d_out, out_slots * sizeof(int32_t)));
    int32_t *h_out[2] = {nullptr, nullptr};
    CUDA_CHECK(cudaMallocHost(&h_out[0], out_slots * sizeof(int32_t)));
    CUDA_CHECK(cudaMallocHost(&h_out[1], out_slots * sizeof(int32_t)));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cudaEvent_t ev0, ev1;
    CUDA_CHECK(cudaEventCreate(&ev0));
    CUDA_CHECK(cudaEventCreate(&ev1));
    const int grid = (m_inputs + block - 1) / block;

    uint64_t gpu_bad[2];
    double kern_med[2], kern_min[2], kern_max[2], e2e_med[2];
    for (int recip = 0; recip < 2; recip++) {
        dv.use_recip = recip;
        // Correctness run.
        CUDA_CHECK(cudaMemsetAsync(d_out, 0xff, out_slots * sizeof(int32_t), stream));
        crush_map_kernel<<<grid, block, 0, stream>>>(dv, fm.tun, fm.rule, e.x_first, m_inputs,
                                                     rmax, d_out);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaMemcpy(h_out[recip], d_out, out_slots * sizeof(int32_t),
                              cudaMemcpyDeviceToHost));
        gpu_bad[recip] = count_mismatches(recip ? "gpu recip" : "gpu div", e, h_out[recip], n);
        // Kernel only.
        std::vector<double> ks, es;
        for (int r = 0; r < reps; r++) {
            CUDA_CHECK(cudaEventRecord(ev0, stream));
            crush_map_kernel<<<grid, block, 0, stream>>>(dv, fm.tun, fm.rule, e.x_first,
                                                         m_inputs, rmax, d_out);
            CUDA_CHECK(cudaEventRecord(ev1, stream));
            CUDA_CHECK(cudaEventSynchronize(ev1));
            CUDA_CHECK(cudaGetLastError());
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
            ks.push_back(ms);
        }
        // Map upload + kernel + result download.
        for (int r = 0; r < reps; r++) {
            CUDA_CHECK(cudaEventRecord(ev0, stream));
            reupload(d_b_start, fm.b_start, stream);
            reupload(d_b_size, fm.b_size, stream);
            reupload(d_b_type, fm.b_type, stream);
            reupload(d_items, fm.items, stream);
            reupload(d_item_w, fm.item_w, stream);
            reupload(d_rc_m, fm.rc_m, stream);
            reupload(d_rc_shift, fm.rc_shift, stream);
            reupload(d_dev_w, fm.dev_w, stream);
            reupload(d_rh_lh, fm.rh_lh, stream);
            reupload(d_ll, fm.ll, stream);
            crush_map_kernel<<<grid, block, 0, stream>>>(dv, fm.tun, fm.rule, e.x_first,
                                                         m_inputs, rmax, d_out);
            CUDA_CHECK(cudaMemcpyAsync(h_out[recip], d_out, out_slots * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, stream));
            CUDA_CHECK(cudaEventRecord(ev1, stream));
            CUDA_CHECK(cudaEventSynchronize(ev1));
            CUDA_CHECK(cudaGetLastError());
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
            es.push_back(ms);
        }
        kern_med[recip] = median(ks);
        kern_min[recip] = *std::min_element(ks.begin(), ks.end());
        kern_max[recip] = *std::max_element(ks.begin(), ks.end());
        e2e_med[recip] = median(es);
    }
    // The two kernels agree on every timed input (the expected ones are checked above).
    uint64_t div_vs_recip = 0;
    for (size_t i = 0; i < (size_t)m_inputs; i++) {
        if (std::memcmp(&h_out[0][i * rmax], &h_out[1][i * rmax], rmax * 4) != 0) {
            div_vs_recip++;
        }
    }

    std::string name = argv[1];
    size_t slash = name.rfind('/');
    if (slash != std::string::npos) name = name.substr(slash + 1);
    auto rate = [&](double ms) { return m_inputs / (ms / 1000.0); };
    printf("{\"map\":\"%s\",\"build\":\"%s\",\"device\":\"%s\",\"sm\":\"%d.%d\","
           "\"inputs_checked\":%u,\"cpu_inputs\":%u,"
           "\"timed_inputs\":%d,\"result_max\":%d,\"block\":%d,\"reps\":%d,"
           "\"cpu_div_mismatches\":%llu,\"cpu_recip_mismatches\":%llu,"
           "\"gpu_div_mismatches\":%llu,\"gpu_recip_mismatches\":%llu,"
           "\"gpu_div_vs_recip_differing\":%llu,"
           "\"cpu_div_1t_mappings_per_s\":%.0f,\"cpu_recip_1t_mappings_per_s\":%.0f,"
           "\"gpu_div_kernel_ms_median\":%.3f,\"gpu_div_kernel_ms_min\":%.3f,"
           "\"gpu_div_kernel_ms_max\":%.3f,\"gpu_div_kernel_mappings_per_s\":%.0f,"
           "\"gpu_div_with_transfers_mappings_per_s\":%.0f,"
           "\"gpu_recip_kernel_ms_median\":%.3f,\"gpu_recip_kernel_ms_min\":%.3f,"
           "\"gpu_recip_kernel_ms_max\":%.3f,\"gpu_recip_kernel_mappings_per_s\":%.0f,"
           "\"gpu_recip_with_transfers_mappings_per_s\":%.0f,"
           "\"gpu_div_kernel_vs_cpu_div_1t\":%.1f,"
           "\"gpu_recip_kernel_vs_cpu_recip_1t\":%.1f}\n",
           name.c_str(), CRUSH_BUILD_LABEL, prop.name, prop.major, prop.minor, n, n_cpu, m_inputs, rmax, block, reps,
           (unsigned long long)cpu_bad[0], (unsigned long long)cpu_bad[1],
           (unsigned long long)gpu_bad[0], (unsigned long long)gpu_bad[1],
           (unsigned long long)div_vs_recip, cpu_rate[0], cpu_rate[1], kern_med[0],
           kern_min[0], kern_max[0], rate(kern_med[0]), rate(e2e_med[0]), kern_med[1],
           kern_min[1], kern_max[1], rate(kern_med[1]), rate(e2e_med[1]),
           rate(kern_med[0]) / cpu_rate[0], rate(kern_med[1]) / cpu_rate[1]);
    bool bad = cpu_bad[0] || cpu_bad[1] || gpu_bad[0] || gpu_bad[1] || div_vs_recip;
    return bad ? 1 : 0;
}
