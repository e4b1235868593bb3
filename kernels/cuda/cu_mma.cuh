/* The PTX the tensor-core kernels share (k_hgemm, the FlashAttention-2
 * prompt attention, the 22-bit tiles and expert products): 16-byte
 * cp.async with a zero fill, ldmatrix of four 8 x 8 matrices (plain and
 * transposed), the m16n8k16 float16 MMA with float32 accumulation
 * (fragment layouts: cu_fattn.cu), float16 pairs packed as its operands,
 * movmatrix (a packed 8 x 8 fragment transposed in registers) and the int8
 * MMAs. */
#ifndef MR_CU_MMA_CUH
#define MR_CU_MMA_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

/* 16 bytes from src to shared address dst; ok false: 16 zero bytes (src is
 * not read but must be a valid address). */
__device__ __forceinline__ void mr_cp16(uint32_t dst, const void *src, bool ok)
{
    const int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

__device__ __forceinline__ void mr_ldsm4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void mr_ldsm4t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* lo, hi rounded to float16 as one register (lo in the low half: the
 * lower column of a fragment), and back. */
__device__ __forceinline__ uint32_t mr_h2_pack(float lo, float hi)
{
    const __half2 v = __floats2half2_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

__device__ __forceinline__ float2 mr_h2_unpack(uint32_t u)
{
    __half2 v;
    memcpy(&v, &u, 4);
    return __half22float2(v);
}

/* The 8 x 8 matrix of 16-bit values whose row g, columns 2c and 2c + 1 lane
 * 4g + c holds (a C fragment's layout, packed) transposed in the same
 * layout: lane 4g + c gets the old rows 2c and 2c + 1 of column g. */
__device__ __forceinline__ uint32_t mr_movt(uint32_t x)
{
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

/* Integer MMAs, d += a b exactly in int32 (A row-major, B column-major;
 * fragment layouts: cu_mvx24mma.cu for k16, cu_moemma.cu for k32).
 * m16n8k16: a0, a1 and one b word; s8 x s8 and s8 x u8. */
__device__ __forceinline__ void mr_imma16_ss(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ void mr_imma16_su(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
}
/* m16n8k32: four a words, two b words; u8 x s8 and s8 x s8. */
__device__ __forceinline__ void mr_imma32_us(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mr_imma32_ss(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d += a b (A 16 x 16 row-major, B 16 x 8 column-major, float32 d). */
__device__ __forceinline__ void mr_mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
