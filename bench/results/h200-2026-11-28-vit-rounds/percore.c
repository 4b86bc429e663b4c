// How fast is each CPU of the lent machine? One fixed piece of work (a dependent chain of
// multiply-adds and 4 KiB malloc/free pairs), timed on the CPU it is pinned to (taskset).
// Prints the nanoseconds one round takes (the fastest of 5 rounds, and the slowest).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void) {
  double best = 1e30, worst = 0;
  volatile unsigned long sink = 0;
  for (int round = 0; round < 5; ++round) {
    double start = now_ns();
    unsigned long x = 88172645463325252ul;
    for (long i = 0; i < 20000000; ++i) x = x * 6364136223846793005ul + 1442695040888963407ul;
    for (long i = 0; i < 2000000; ++i) {
      char* p = malloc(4096);
      p[x & 4095] = (char)i;
      sink += (unsigned char)p[0];
      free(p);
    }
    sink += x;
    double took = now_ns() - start;
    if (took < best) best = took;
    if (took > worst) worst = took;
  }
  printf("%.1f %.1f\n", best / 1e6, worst / 1e6);
  return (int)(sink & 0);
}
