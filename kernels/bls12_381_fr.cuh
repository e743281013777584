// BLS12-381 scalar field r = 0x73eda753299d7d483339d80809a1d80553bda402fffe5bfeffffffff00000001.
#ifndef GPU_OPS_BLS12_381_FR_CUH
#define GPU_OPS_BLS12_381_FR_CUH
#include "fp.cuh"

FIELD_CONST fp_params<8> BLS12_381_FR = {
    {0x00000001u, 0xffffffffu, 0xfffe5bfeu, 0x53bda402u, 0x09a1d805u, 0x3339d808u, 0x299d7d48u,
     0x73eda753u},
    {0xf3f29c6du, 0xc999e990u, 0x87925c23u, 0x2b6cedcbu, 0x7254398fu, 0x05d31496u, 0x9f59ff11u,
     0x0748d9d9u},
    {0xffffffffu, 0xfffffffeu, 0xfffe5bfeu, 0x53bda402u, 0x09a1d805u, 0x3339d808u, 0x299d7d48u,
     0x73eda753u},
    0xffffffffu,
};

#endif
