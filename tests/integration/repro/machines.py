"""Other machines, simulated on this one by capping what its kernel libraries may use.

- SSE_MACHINE: a CPU without AVX2. Whatever this machine has (AVX2 or AVX512), native
  kernels here differ from those, so it tells portable from native everywhere.
- AVX2_MACHINE: a CPU with AVX2 but no AVX512. On an AVX512 machine it differs from
  native; on an AVX2 machine (such as a 2-core AMD EPYC CI box) it is this machine.
"""

SSE_MACHINE = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
               "ONEDNN_MAX_CPU_ISA": "SSE41"}
AVX2_MACHINE = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                "ONEDNN_MAX_CPU_ISA": "AVX2"}
