/* MKL's vector-math square roots, as IEEE square roots (core/ieee_sqrt.py).
 *
 * ATen computes every float and double sqrt (and pow(x, 0.5)) on the CPU by calling these
 * two MKL functions, which torch carries inside libtorch_cpu. In MKL's COMPATIBLE branch,
 * the only one it grants on both Intel and AMD CPUs, they are not correctly rounded (about
 * one result in five is off by one unit in the last place), and which results are off
 * differs between an Intel Xeon and an AMD EPYC: the optimizer step and the gradient norm
 * then differ in the last bits. Loaded ahead of libtorch_cpu (LD_PRELOAD for a new process,
 * a global dlopen before torch for the current one), these definitions are the ones
 * libtorch_cpu's calls reach. sqrt is an IEEE operation, correctly rounded by the same
 * instruction on every x86-64 CPU.
 *
 * The signatures are MKL's (LP64: MKL_INT is int, the mode an MKL_INT64); the mode's
 * accuracy and error flags do not apply to an exact operation.
 */
#include <math.h>

void vmsSqrt(const int n, const float *a, float *r, long long mode) {
    (void)mode;
    for (int i = 0; i < n; i++) r[i] = sqrtf(a[i]);
}

void vmdSqrt(const int n, const double *a, double *r, long long mode) {
    (void)mode;
    for (int i = 0; i < n; i++) r[i] = sqrt(a[i]);
}
