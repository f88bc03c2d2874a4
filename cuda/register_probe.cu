/* register_probe.cu: a kernel for the test of make cuda's register check (cuda/check_registers.awk)
 *
 * 96 sums stay live through a loop, so ptxas gives a thread about 120
 * registers: a block of 1024 threads would need 122,880, more than the 65,536
 * a block may have, and its launch would fail on a GPU ("too many resources
 * requested for launch"). Built as it is, the check must refuse it; built with
 * -DPROBE_THREADS=256 (__launch_bounds__(256): the largest block it is
 * launched with) it fits, and the check must pass it. cuda/test_cuda.c
 * compiles it both ways when nvcc is on the PATH. Never linked into anything.
 */
#ifdef PROBE_THREADS
#define PROBE_BOUNDS __launch_bounds__(PROBE_THREADS)
#else
#define PROBE_BOUNDS
#endif

__global__ void PROBE_BOUNDS many_registers_kernel(float *out, const float *in, int n) {
    float sum[96];
#pragma unroll
    for (int k = 0; k < 96; k++) sum[k] = in[k * blockDim.x + threadIdx.x];
    for (int r = 0; r < n; r++) {
        float x = in[r];
#pragma unroll
        for (int k = 0; k < 96; k++) sum[k] = sum[k] * x + (float)k;
    }
    float total = 0;
#pragma unroll
    for (int k = 0; k < 96; k++) total += sum[k] * sum[(k + 1) % 96];
    out[threadIdx.x] = total;
}
