/* fp16 / bf16 conversions against exhaustive round trips. */
#include <math.h>

#include "common/half.h"
#include "tests/unit/testutil.h"

START_TEST(f16_roundtrip_all)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mr_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        ck_assert_uint_eq(mr_f32_to_f16(f), h);
    }
}
END_TEST

START_TEST(f16_known_values)
{
    ck_assert_float_eq(mr_f16_to_f32(0x3c00), 1.0f);
    ck_assert_float_eq(mr_f16_to_f32(0xc000), -2.0f);
    ck_assert_float_eq(mr_f16_to_f32(0x7bff), 65504.0f);
    ck_assert_float_eq(mr_f16_to_f32(0x0001), 5.9604644775390625e-8f);
    ck_assert_uint_eq(mr_f32_to_f16(1e6f), 0x7c00);
    /* halfway between 1 and the next half rounds to even (1.0) */
    ck_assert_uint_eq(mr_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);
}
END_TEST

START_TEST(bf16_roundtrip_all)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mr_bf16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        ck_assert_uint_eq(mr_f32_to_bf16(f), h);
    }
    ck_assert_uint_eq(mr_f32_to_bf16(1.00390625f), 0x3f80); /* tie -> even */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("half");
    TCase *tc = tcase_create("conv");
    tcase_add_test(tc, f16_roundtrip_all);
    tcase_add_test(tc, f16_known_values);
    tcase_add_test(tc, bf16_roundtrip_all);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
