/* What portable mode puts ahead of the MKL inside libtorch_cpu (core/mkl_preload.py).
 *
 * libtorch_cpu carries MKL statically but calls these MKL functions through its symbol
 * table, so the first definition loaded wins: LD_PRELOAD for a new process, a global
 * dlopen before torch for the current one.
 *
 * 1. The vendor check. MKL's conditional numerical reproducibility (MKL_CBWR) grants its
 *    AVX2 branch only when it runs on an Intel CPU; on an AMD CPU it falls back to its own
 *    dispatch, whose matmuls differ from the AVX2 branch in the last bits, and the one
 *    branch it grants everywhere (COMPATIBLE, SSE2) costs about twice native step time.
 *    Answering "Intel" makes every x86 CPU with AVX2 run the same AVX2 branch: the same
 *    instructions in the same order. MKL reports the branch it really runs, and every
 *    pinned process checks it (core/mkl_branch.py), so a change in MKL that bypassed this
 *    is refused, not silently run.
 *
 * 2. The square roots. ATen computes every float and double sqrt (and pow(x, 0.5)) by
 *    calling MKL's vector math; in the COMPATIBLE branch about one result in five is off
 *    by one unit in the last place, differently on Intel and AMD CPUs. sqrt is an IEEE
 *    operation that every x86-64 CPU rounds the same, so it is computed here as that, in
 *    every branch. The signatures are MKL's (LP64: MKL_INT is int, the mode an MKL_INT64);
 *    the mode's accuracy and error flags do not apply to an exact operation.
 */
#include <math.h>

int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }

void vmsSqrt(const int n, const float *a, float *r, long long mode) {
    (void)mode;
    for (int i = 0; i < n; i++) r[i] = sqrtf(a[i]);
}

void vmdSqrt(const int n, const double *a, double *r, long long mode) {
    (void)mode;
    for (int i = 0; i < n; i++) r[i] = sqrt(a[i]);
}
