/* Preloaded into a process, this makes the MKL inside libtorch_cpu take the other CPU
 * vendor's code paths: MKL asks these functions whether it runs on an Intel CPU (it
 * grants its CNR branches and its Intel kernels only there). Built with -DINTEL=1 on an
 * AMD machine, -DINTEL=0 on an Intel one (tests.integration.repro.machines). */
int mkl_serv_intel_cpu_true(void) { return INTEL; }
int mkl_serv_intel_cpu(void) { return INTEL; }
