// Scratch: driver costs of page work, exportable (POSIX fd) handles against plain ones.
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#define CK(x)                                      \
  do {                                             \
    CUresult r = (x);                              \
    if (r != CUDA_SUCCESS) {                       \
      const char* s;                               \
      cuGetErrorString(r, &s);                     \
      printf("%s: %s line %d\n", #x, s, __LINE__); \
      exit(1);                                     \
    }                                              \
  } while (0)
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}
int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  const size_t page = 2u << 20;
  const int n = 512;
  for (int big = 0; big < 2; ++big)
    for (int round = 0; round < 2; ++round)
      for (int exp = 0; exp < 2; ++exp) {
        size_t psize = big ? (32u << 20) : page;
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        prop.requestedHandleTypes = exp ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
        CUdeviceptr base;
        CK(cuMemAddressReserve(&base, psize * n * 2, 0, 0, 0));
        std::vector<CUmemGenericAllocationHandle> h(n);
        CUmemAccessDesc acc{};
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        auto t0 = clk::now();
        for (int i = 0; i < n; ++i) CK(cuMemCreate(&h[i], psize, &prop, 0));
        auto t1 = clk::now();
        for (int i = 0; i < n; ++i) CK(cuMemMap(base + i * psize, psize, 0, h[i], 0));
        auto t2 = clk::now();
        for (int i = 0; i < n; ++i) CK(cuMemSetAccess(base + i * psize, psize, &acc, 1));
        auto t3 = clk::now();
        // stitch: move each page to the upper half, one at a time
        for (int i = 0; i < n; ++i) {
          CK(cuMemUnmap(base + i * psize, psize));
          CK(cuMemMap(base + (n + i) * psize, psize, 0, h[i], 0));
          CK(cuMemSetAccess(base + (n + i) * psize, psize, &acc, 1));
        }
        auto t4 = clk::now();
        // move back in runs of 8 (one grant per run)
        for (int i = 0; i < n; i += 8) {
          for (int j = i; j < i + 8; ++j) CK(cuMemUnmap(base + (n + j) * psize, psize));
          for (int j = i; j < i + 8; ++j) CK(cuMemMap(base + j * psize, psize, 0, h[j], 0));
          CK(cuMemSetAccess(base + i * psize, 8 * psize, &acc, 1));
        }
        auto t5 = clk::now();
        // unmap one at a time
        for (int i = 0; i < n; ++i) CK(cuMemUnmap(base + i * psize, psize));
        auto t6 = clk::now();
        for (int i = 0; i < n; ++i) CK(cuMemRelease(h[i]));
        auto t7 = clk::now();
        CK(cuMemAddressFree(base, psize * n * 2));
        printf(
            "page %2zu MiB round %d %-10s per page us: create %.1f map %.1f access %.1f | stitch(1) %.1f "
            "stitch(run8) %.1f | unmap %.1f release %.1f\n",
            psize >> 20, round, exp ? "posix_fd" : "none", us(t0, t1) / n, us(t1, t2) / n, us(t2, t3) / n,
            us(t3, t4) / n, us(t4, t5) / n, us(t5, t6) / n, us(t6, t7) / n);
      }
  return 0;
}
