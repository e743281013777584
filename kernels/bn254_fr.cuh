// BN254 scalar field r = 0x30644e72e131a029b85045b68181585d2833e84879b97091 43e1f593f0000001.
#ifndef GPU_OPS_BN254_FR_CUH
#define GPU_OPS_BN254_FR_CUH
#include "fp.cuh"

FIELD_CONST fp_params<8> BN254_FR = {
    {0xf0000001u, 0x43e1f593u, 0x79b97091u, 0x2833e848u, 0x8181585du, 0xb85045b6u, 0xe131a029u,
     0x30644e72u},
    {0xae216da7u, 0x1bb8e645u, 0xe35c59e3u, 0x53fe3ab1u, 0x53bb8085u, 0x8c49833du, 0x7f4e44a5u,
     0x0216d0b1u},
    {0xefffffffu, 0x43e1f593u, 0x79b97091u, 0x2833e848u, 0x8181585du, 0xb85045b6u, 0xe131a029u,
     0x30644e72u},
    0xefffffffu,
};

#endif
