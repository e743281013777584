// BN254 base field q = 0x30644e72e131a029b85045b68181585d97816a916871ca8d3c208c16d87cfd47,
// the coordinates of bn254_g1 points.
#ifndef GPU_OPS_BN254_FQ_CUH
#define GPU_OPS_BN254_FQ_CUH
#include "fp.cuh"

FIELD_CONST fp_params<8> BN254_FQ = {
    {0xd87cfd47u, 0x3c208c16u, 0x6871ca8du, 0x97816a91u, 0x8181585du, 0xb85045b6u, 0xe131a029u,
     0x30644e72u},
    {0x538afa89u, 0xf32cfc5bu, 0xd44501fbu, 0xb5e71911u, 0x0a417ff6u, 0x47ab1effu, 0xcab8351fu,
     0x06d89f71u},
    {0xd87cfd45u, 0x3c208c16u, 0x6871ca8du, 0x97816a91u, 0x8181585du, 0xb85045b6u, 0xe131a029u,
     0x30644e72u},
    0xe4866389u,
};

#endif
