// Throwaway probe: what acquiring pinned host memory costs, serially and in parallel.
#include <cuda.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#define CK(x)                         \
  do {                                \
    CUresult r_ = (x);                \
    if (r_ != CUDA_SUCCESS) {         \
      const char* s;                  \
      cuGetErrorString(r_, &s);       \
      std::printf("%s: %s\n", #x, s); \
      std::exit(1);                   \
    }                                 \
  } while (0)
using clk = std::chrono::steady_clock;
static double ms(clk::time_point a) {
  return std::chrono::duration<double, std::milli>(clk::now() - a).count();
}
static const size_t total = size_t{2} << 30;
CUcontext ctx;

static double host_vmm(size_t chunk, int threads, CUdeviceptr dev, double* copy_ms, double* release_ms) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  CUdeviceptr base;
  CK(cuMemAddressReserve(&base, total, chunk, 0, 0));
  size_t n = total / chunk;
  std::vector<CUmemGenericAllocationHandle> h(n);
  auto t0 = clk::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      cuCtxSetCurrent(ctx);
      for (size_t i = t; i < n; i += threads) {
        CK(cuMemCreate(&h[i], chunk, &prop, 0));
        CK(cuMemMap(base + i * chunk, chunk, 0, h[i], 0));
        CUmemAccessDesc d{};
        d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = 0;
        d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CK(cuMemSetAccess(base + i * chunk, chunk, &d, 1));
      }
    });
  for (auto& t : ts) t.join();
  double acquire = ms(t0);
  t0 = clk::now();
  CK(cuMemcpyDtoH(reinterpret_cast<void*>(base), dev, total));
  *copy_ms = ms(t0);
  t0 = clk::now();
  ts.clear();
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      cuCtxSetCurrent(ctx);
      for (size_t i = t; i < n; i += threads) {
        CK(cuMemUnmap(base + i * chunk, chunk));
        CK(cuMemRelease(h[i]));
      }
    });
  for (auto& t : ts) t.join();
  *release_ms = ms(t0);
  CK(cuMemAddressFree(base, total));
  return acquire;
}

int main() {
  CK(cuInit(0));
  CUdevice d;
  CK(cuDeviceGet(&d, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, d));
  CK(cuCtxSetCurrent(ctx));
  CUdeviceptr dev;
  CK(cuMemAlloc(&dev, total));
  CK(cuMemsetD8(dev, 7, total));
  CK(cuCtxSynchronize());
  double c, r;
  for (int rep = 0; rep < 2; ++rep)
    for (size_t chunk : {size_t{2} << 20, size_t{32} << 20, size_t{256} << 20})
      for (int threads : {1, 4, 8, 16}) {
        double a = host_vmm(chunk, threads, dev, &c, &r);
        std::printf("vmm host chunk %4zu MiB threads %2d: acquire %7.1f ms, D2H %6.1f ms, release %6.1f ms\n",
                    chunk >> 20, threads, a, c, r);
      }
  {
    void* p;
    auto t0 = clk::now();
    CK(cuMemHostAlloc(&p, total, 0));
    double a = ms(t0);
    t0 = clk::now();
    CK(cuMemcpyDtoH(p, dev, total));
    double cc = ms(t0);
    t0 = clk::now();
    CK(cuMemFreeHost(p));
    std::printf("cuMemHostAlloc: %.1f ms, D2H %.1f ms, free %.1f ms\n", a, cc, ms(t0));
  }
  for (int threads : {1, 8, 16})
    for (int huge : {0, 1}) {
      auto t0 = clk::now();
      char* p = static_cast<char*>(
          mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (huge) madvise(p, total, MADV_HUGEPAGE);
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          size_t per = total / threads;
          for (size_t o = t * per; o < (t + 1) * per; o += 4096) p[o] = 1;
        });
      for (auto& t : ts) t.join();
      double touch = ms(t0);
      t0 = clk::now();
      CK(cuMemHostRegister(p, total, 0));
      double reg = ms(t0);
      t0 = clk::now();
      CK(cuMemcpyDtoH(p, dev, total));
      double cc = ms(t0);
      t0 = clk::now();
      CK(cuMemHostUnregister(p));
      munmap(p, total);
      std::printf(
          "mmap+touch threads %2d huge %d: touch %.1f ms, register %.1f ms, D2H %.1f ms, release %.1f ms\n",
          threads, huge, touch, reg, cc, ms(t0));
    }
  return 0;
}
