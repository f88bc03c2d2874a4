// The machine's FMA peak in GFLOP/s, for dev/BENCH.md: every thread (one per
// core: OMP_NUM_THREADS) runs independent chains of vector FMAs on registers,
// enough of them to cover the FMA latency on both FMA units.
//   gcc -O3 -march=native -funroll-loops -fopenmp -o /tmp/fma_peak dev/fma_peak.c &&
//      OMP_NUM_THREADS=2 /tmp/fma_peak
// An argument sets the steps of each chain (default 10^9, about 5 s on 2
// cores; make bench, dev/bench_compare.py, runs 2 x 10^8 in each round).
// 12 chains fit the 16 registers of AVX2 with the two operands (16 chains did
// not: gcc kept some in memory); AVX-512 has 32.
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>

#ifdef __AVX512F__
#define WIDTH 16
#else
#define WIDTH 8
#endif
#define CHAINS 12
typedef float vec __attribute__((vector_size(WIDTH * sizeof(float))));

int main(int argc, char **argv) {
    const long iterations = argc > 1 ? atol(argv[1]) : 1000000000L;
    if (iterations < 1) {
        fprintf(stderr, "usage: fma_peak [steps per chain, at least 1]\n");
        return 1;
    }
    double total = 0, start = omp_get_wtime();
    float checksum = 0;
#pragma omp parallel reduction(+ : checksum)
    {
        vec acc[CHAINS], a, b;
        for (int k = 0; k < WIDTH; k++) {
            a[k] = 0.999999f;
            b[k] = 1e-7f;
        }
        for (int i = 0; i < CHAINS; i++)
            for (int k = 0; k < WIDTH; k++) acc[i][k] = (float)(i + k);
        for (long n = 0; n < iterations; n++)
            for (int i = 0; i < CHAINS; i++) acc[i] = acc[i] * a + b;
        for (int i = 0; i < CHAINS; i++)
            for (int k = 0; k < WIDTH; k++) checksum += acc[i][k];   // keeps the chains alive
    }
    double seconds = omp_get_wtime() - start;
    int threads = omp_get_max_threads();
    total = 2.0 * WIDTH * CHAINS * iterations * threads;
    printf("%d threads, %d-wide: %.1f GFLOP/s in all, %.1f per thread (%.2f s; checksum %g)\n",
           threads, WIDTH, total / seconds * 1e-9, total / seconds * 1e-9 / threads,
           seconds, checksum);
    return 0;
}
