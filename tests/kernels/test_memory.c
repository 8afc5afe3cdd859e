/* cpu backend memory: open and info, alloc/upload/download, ownership of
 * aliased weights, and the f16/bf16 -> f32 weight conversion over every bit
 * pattern against an independent decoding of the IEEE fields. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/cpu/cpu.h"
#include "kt_testutil.h"

static void test_info(void **state)
{
	struct kt_backend *be = tu_open(1);
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	char want[64];

	assert_string_equal(be->info.backend, "cpu");
	assert_non_null(strstr(be->info.name, "cpu (1 thread, "));
	assert_true(be->info.memory_total > 0);
	assert_true(be->info.memory_free <= be->info.memory_total);
	assert_int_equal(be->info.kv_dtype, KT_F32);
	kt_backend_close(be);

	be = tu_open(0);
	snprintf(want, sizeof want, "cpu (%ld thread", online);
	assert_non_null(strstr(be->info.name, want));
	kt_backend_close(be);
}

static void test_open_rejects_bad_limits(void **state)
{
	struct kt_config c = { .backend = "cpu", .max_context = 0, .max_head_dim = 128 };
	struct kt_backend *be = NULL;
	char err[256] = "";

	assert_int_equal(kt_cpu_open(&c, &be, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "max_context"));
	c.max_context = 16;
	c.max_head_dim = 63;
	assert_int_equal(kt_cpu_open(&c, &be, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "max_head_dim"));
	assert_null(be);
}

static void test_upload_download(void **state)
{
	struct kt_backend *be = tu_open(0);
	float host[6 * 5], back[6 * 5], part[3] = { 1.5f, -2.5f, 3.25f };
	struct kt_tensor t, copy;

	tu_fill(host, 30, 2.0f);
	t = tu_tensor(be, KT_F32, 6, 5, host);
	assert_true((uintptr_t)t.data % 64 == 0);
	tu_get(be, &t, back);
	assert_memory_equal(host, back, sizeof host);

	/* A partial upload lands at its byte offset and nowhere else. */
	assert_int_equal(kt_upload(be, &t, 7 * sizeof(float), part, sizeof part), 0);
	memcpy(&host[7], part, sizeof part);
	tu_get(be, &t, back);
	assert_memory_equal(host, back, sizeof host);
	assert_int_equal(kt_download(be, back, &t, 29 * sizeof(float), sizeof(float)), 0);
	assert_true(back[0] == host[29]);

	/* Out of range both ways, and a view of rows sees the same memory. */
	assert_int_equal(kt_upload(be, &t, 29 * sizeof(float), part, 2 * sizeof(float)), -EINVAL);
	assert_int_equal(kt_download(be, back, &t, SIZE_MAX, 4), -EINVAL);
	struct kt_tensor view = kt_rows(t, 2, 3);
	assert_int_equal(kt_download(be, back, &view, 0, kt_nbytes(&view)), 0);
	assert_memory_equal(back, &host[10], 15 * sizeof(float));

	/* Bad shapes and dtypes are refused; frees of copies and views are harmless. */
	assert_int_equal(kt_alloc(be, KT_F32, -1, 4, &copy), -EINVAL);
	assert_int_equal(kt_alloc(be, (enum kt_dtype)99, 1, 4, &copy), -EINVAL);
	assert_int_equal(kt_alloc(be, KT_F32, INT64_MAX / 2, INT64_MAX / 2, &copy), -ENOMEM);
	copy = t;
	kt_free(be, &view);
	kt_free(be, &t);
	assert_null(t.data);
	kt_free(be, &copy);
	kt_free(be, &t);
	kt_backend_close(be);
}

/* Hundreds of allocations freed in random order, some left for close. */
static void test_many_allocations(void **state)
{
	enum { N = 700 };
	struct kt_backend *be = tu_open(1);
	struct kt_tensor t[N];
	int32_t order[N];

	tu_seed(11);
	for (int i = 0; i < N; i++) {
		float v = (float)i;

		assert_int_equal(kt_alloc(be, KT_F32, 1 + i % 3, 1, &t[i]), 0);
		assert_int_equal(kt_upload(be, &t[i], 0, &v, sizeof v), 0);
		order[i] = i;
	}
	tu_shuffle(order, N);
	for (int k = 0; k < N / 2; k++)
		kt_free(be, &t[order[k]]);
	for (int k = N / 2; k < N; k++) {
		float v;

		assert_int_equal(kt_download(be, &v, &t[order[k]], 0, sizeof v), 0);
		assert_true(v == (float)order[k]);
	}
	kt_backend_close(be);
}

/* binary16 from its fields, in double. */
static double f16_value(uint16_t h)
{
	int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v;

	if (e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -24);
	else
		v = ldexp(1024 + m, e - 25);
	return s ? -v : v;
}

/* bfloat16 from its fields, in double. */
static double bf16_value(uint16_t h)
{
	int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
	double v;

	if (e == 255)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -133);
	else
		v = ldexp(128 + m, e - 134);
	return s ? -v : v;
}

/* Every 16-bit pattern of dtype, from a source at byte offset `skew`. */
static void check_all_patterns(enum kt_dtype dtype, double (*value)(uint16_t), size_t skew)
{
	struct kt_backend *be = tu_open(0);
	unsigned char *src = malloc(65536 * 2 + skew);
	float *got = malloc(65536 * sizeof(float));
	struct kt_tensor t;
	int bad = 0;

	for (uint32_t i = 0; i < 65536; i++) {
		uint16_t h = (uint16_t)i;
		memcpy(src + skew + 2 * i, &h, 2);
	}
	assert_int_equal(kt_weight(be, dtype, src + skew, 256, 256, true, &t), 0);
	assert_int_equal(t.dtype, KT_F32);
	assert_int_equal(t.rows, 256);
	assert_int_equal(t.cols, 256);
	tu_get(be, &t, got);
	for (uint32_t i = 0; i < 65536; i++) {
		double want = value((uint16_t)i);
		bool ok = isnan(want) ? isnan(got[i]) : (double)got[i] == want;

		ok = ok && !signbit(got[i]) == !(i & 0x8000);
		if (!ok && bad++ < 5)
			print_message("  %s 0x%04x: got %a want %a\n", kt_dtype_name(dtype), i,
				      (double)got[i], want);
	}
	print_message("  %s -> f32: 65536 patterns (source offset %zu), %d wrong\n",
		      kt_dtype_name(dtype), skew, bad);
	assert_int_equal(bad, 0);
	kt_free(be, &t);
	kt_backend_close(be);
	free(src);
	free(got);
}

static void test_f16_all_patterns(void **state)
{
	check_all_patterns(KT_F16, f16_value, 0);
	check_all_patterns(KT_F16, f16_value, 1);
}

static void test_bf16_all_patterns(void **state)
{
	check_all_patterns(KT_BF16, bf16_value, 0);
	check_all_patterns(KT_BF16, bf16_value, 3);
}

static float static_weight[4][8];

static void test_f32_alias_and_copy(void **state)
{
	struct kt_backend *be = tu_open(0);
	float stack_weight[3][5], got[40], before[15];
	unsigned char *odd = malloc(15 * sizeof(float) + 1);
	struct kt_tensor a, b, c, copy, refused;

	tu_seed(5);
	tu_fill(&static_weight[0][0], 32, 1.0f);
	tu_fill(&stack_weight[0][0], 15, 1.0f);

	/* Outliving aligned f32: aliased. Freeing it must not free() the static
	 * array (glibc would abort). */
	assert_int_equal(kt_weight(be, KT_F32, static_weight, 4, 8, true, &a), 0);
	assert_ptr_equal(a.data, static_weight);
	tu_get(be, &a, got);
	assert_memory_equal(got, static_weight, sizeof static_weight);
	copy = a;
	kt_free(be, &a);
	kt_free(be, &copy);

	/* Not outliving: copied, later changes to the source do not show. */
	assert_int_equal(kt_weight(be, KT_F32, stack_weight, 3, 5, false, &b), 0);
	assert_ptr_not_equal(b.data, stack_weight);
	memcpy(before, stack_weight, sizeof before);
	stack_weight[1][1] += 1.0f;
	tu_get(be, &b, got);
	assert_memory_equal(got, before, sizeof before);

	/* Outliving but misaligned: copied, values intact. */
	memcpy(odd + 1, before, sizeof before);
	assert_int_equal(kt_weight(be, KT_F32, odd + 1, 3, 5, true, &c), 0);
	assert_ptr_not_equal(c.data, odd + 1);
	assert_true((uintptr_t)c.data % 64 == 0);
	tu_get(be, &c, got);
	assert_memory_equal(got, before, sizeof before);

	assert_int_equal(kt_weight(be, KT_I32, before, 3, 5, false, &refused), -EINVAL);
	assert_int_equal(kt_weight(be, KT_F32, NULL, 3, 5, false, &refused), -EINVAL);
	kt_free(be, &b);
	kt_free(be, &c);
	kt_backend_close(be);
	free(odd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_info),
		cmocka_unit_test(test_open_rejects_bad_limits),
		cmocka_unit_test(test_upload_download),
		cmocka_unit_test(test_many_allocations),
		cmocka_unit_test(test_f16_all_patterns),
		cmocka_unit_test(test_bf16_all_patterns),
		cmocka_unit_test(test_f32_alias_and_copy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
