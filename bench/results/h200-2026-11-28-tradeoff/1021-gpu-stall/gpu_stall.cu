// What the driver's page calls cost the GPU while it runs queued kernels: 300 kernels that
// each read and write 128 MiB (cudaMalloc'd) are queued, then the host makes 100 calls of
// one kind on unrelated memory while they run; the kernels' span (events around them) is
// compared with the span when the host makes none. Modes interleaved, 7 repetitions,
// medians. nvcc -O2 -std=c++17 gpu_stall.cu -lcuda -o gpu_stall
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(x)                                                          \
  do {                                                                    \
    CUresult r_ = (x);                                                    \
    if (r_ != CUDA_SUCCESS) {                                             \
      const char* s_ = nullptr;                                           \
      cuGetErrorString(r_, &s_);                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); \
      std::exit(1);                                                       \
    }                                                                     \
  } while (0)
#define CHECK_RT(x)                                                                           \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

__global__ void touch(float4* data, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float4 v = data[i];
    v.x += 1.0f;
    data[i] = v;
  }
}

constexpr int kernels = 300;
constexpr int calls = 100;
constexpr std::size_t kernel_bytes = std::size_t{128} << 20;

struct pages {
  std::size_t page = 0;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  CUdeviceptr base_a = 0, base_b = 0;  // two ranges of `calls` pages
  std::vector<CUmemGenericAllocationHandle> handles;

  explicit pages(std::size_t page_size) : page(page_size) {
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemAddressReserve(&base_a, page * calls, 0, 0, 0));
    CHECK(cuMemAddressReserve(&base_b, page * calls, 0, 0, 0));
  }
  void create_all() {
    handles.resize(calls);
    for (auto& h : handles) CHECK(cuMemCreate(&h, page, &prop, 0));
  }
  void release_all() {
    for (auto& h : handles) CHECK(cuMemRelease(h));
    handles.clear();
  }
  void map_all(CUdeviceptr base, bool grant) {
    for (int i = 0; i < calls; ++i) CHECK(cuMemMap(base + i * page, page, 0, handles[i], 0));
    if (grant) CHECK(cuMemSetAccess(base, page * calls, &access, 1));
  }
  void unmap_all(CUdeviceptr base) {
    for (int i = 0; i < calls; ++i) CHECK(cuMemUnmap(base + i * page, page));
  }
};

int main(int argc, char** argv) {
  const std::size_t page = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2) << 20;
  CHECK(cuInit(0));
  CHECK_RT(cudaSetDevice(0));
  CHECK_RT(cudaFree(nullptr));
  float4* data = nullptr;
  CHECK_RT(cudaMalloc(&data, kernel_bytes));
  CHECK_RT(cudaMemset(data, 0, kernel_bytes));
  cudaStream_t stream;
  CHECK_RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, end;
  CHECK_RT(cudaEventCreate(&start));
  CHECK_RT(cudaEventCreate(&end));
  pages p(page);

  // Each mode: what to do before the kernels are queued, the calls made while they run,
  // and the cleanup after.
  struct mode {
    const char* name;
    void (*before)(pages&);
    void (*during)(pages&);
    void (*after)(pages&);
  };
  const mode modes[] = {
      {"none", [](pages&) {}, [](pages&) {}, [](pages&) {}},
      {"create", [](pages&) {}, [](pages& q) { q.create_all(); }, [](pages& q) { q.release_all(); }},
      {"release", [](pages& q) { q.create_all(); }, [](pages& q) { q.release_all(); }, [](pages&) {}},
      {"map", [](pages& q) { q.create_all(); }, [](pages& q) { q.map_all(q.base_a, false); },
       [](pages& q) {
         q.unmap_all(q.base_a);
         q.release_all();
       }},
      {"grant_each",
       [](pages& q) {
         q.create_all();
         q.map_all(q.base_a, false);
       },
       [](pages& q) {
         for (int i = 0; i < calls; ++i) CHECK(cuMemSetAccess(q.base_a + i * q.page, q.page, &q.access, 1));
       },
       [](pages& q) {
         q.unmap_all(q.base_a);
         q.release_all();
       }},
      {"grant_run",
       [](pages& q) {
         q.create_all();
         q.map_all(q.base_a, false);
       },
       [](pages& q) { CHECK(cuMemSetAccess(q.base_a, q.page * calls, &q.access, 1)); },
       [](pages& q) {
         q.unmap_all(q.base_a);
         q.release_all();
       }},
      {"unmap_each",
       [](pages& q) {
         q.create_all();
         q.map_all(q.base_a, true);
       },
       [](pages& q) { q.unmap_all(q.base_a); }, [](pages& q) { q.release_all(); }},
      {"stitch",  // unmap from one range, map at the other, grant: what the resource does
       [](pages& q) {
         q.create_all();
         q.map_all(q.base_a, true);
       },
       [](pages& q) {
         for (int i = 0; i < calls; ++i) {
           CHECK(cuMemUnmap(q.base_a + i * q.page, q.page));
           CHECK(cuMemMap(q.base_b + i * q.page, q.page, 0, q.handles[i], 0));
           CHECK(cuMemSetAccess(q.base_b + i * q.page, q.page, &q.access, 1));
         }
       },
       [](pages& q) {
         q.unmap_all(q.base_b);
         q.release_all();
       }},
  };
  constexpr int repetitions = 7;
  std::vector<std::vector<double>> gpu(std::size(modes)), host(std::size(modes));
  const int blocks = 132 * 4;
  for (int r = 0; r < repetitions; ++r)
    for (std::size_t m = 0; m < std::size(modes); ++m) {
      modes[m].before(p);
      CHECK_RT(cudaDeviceSynchronize());
      CHECK_RT(cudaEventRecord(start, stream));
      for (int k = 0; k < kernels; ++k)
        touch<<<blocks, 256, 0, stream>>>(data, kernel_bytes / sizeof(float4));
      CHECK_RT(cudaEventRecord(end, stream));
      const auto t0 = std::chrono::steady_clock::now();
      modes[m].during(p);
      const auto t1 = std::chrono::steady_clock::now();
      if (cudaEventQuery(end) == cudaSuccess)
        std::fprintf(stderr, "warning: %s ended before the calls did\n", modes[m].name);
      CHECK_RT(cudaEventSynchronize(end));
      float ms = 0;
      CHECK_RT(cudaEventElapsedTime(&ms, start, end));
      modes[m].after(p);
      gpu[m].push_back(ms);
      host[m].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double base = median(gpu[0]);
  std::printf("page %zu MiB, %d kernels of %zu MiB each, %d calls while they run, medians of %d\n",
              page >> 20, kernels, kernel_bytes >> 20, calls, repetitions);
  std::printf("%-12s %10s %12s %14s %14s\n", "mode", "gpu ms", "gpu +ms", "gpu us/call", "host us/call");
  for (std::size_t m = 0; m < std::size(modes); ++m) {
    const double g = median(gpu[m]);
    std::printf("%-12s %10.3f %12.3f %14.2f %14.2f\n", modes[m].name, g, g - base, 1000 * (g - base) / calls,
                1000 * median(host[m]) / calls);
  }
  return 0;
}
