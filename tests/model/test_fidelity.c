/* Fidelity against Hugging Face transformers (DESIGN §4, invariants 1 and 5).
 *
 * tests/fidelity/models/<name>/ holds a tiny model written by transformers and
 * <name>/ref/ what transformers computed with it (tools/ref/make_tiny_models.py;
 * ATLAS_FIDELITY_MODELS names another folder of the same layout). For every
 * model that has a ref/ref.json, on the cpu backend:
 *
 *  - logits of every position of every reference sequence, run as one step:
 *    float32 models: max |atlas - transformers| <= 1e-3 over all logits;
 *    bf16/f16 models: atlas computes in float32 from the same weights, so it
 *    is held to 1e-3 against transformers' run of the float32-upcast model,
 *    and against transformers' own bf16/f16 run to TOL_LOWP = 1e-3 + the
 *    largest difference between that run and the upcast run (how far
 *    transformers itself moves when it rounds activations), with the same
 *    argmax wherever transformers' top-2 gap exceeds TOL_LOWP;
 *  - the same sequences split into chunks of other sizes, interleaved
 *    token by token with a second sequence in the same steps, and run with
 *    their out rows gathered (a model_step without out_all), give logits
 *    bitwise identical to the one-step run;
 *  - a greedy loop over model_forward gives transformers' generate() tokens,
 *    allowing a different choice only where transformers' two best logits
 *    were closer than twice the tolerance (a tie within the error);
 *  - the model directory with config.json rewritten in the transformers 4.x
 *    spelling loads to the same configuration and the same logits.
 * The measured errors are printed.
 *
 * With ATLAS_TEST_CPU_PRECISION=bf16 (meson test model_fidelity_bf16) the
 * backend runs the fast path (cpu_precision bf16: bf16 KV caches for every
 * model; for bf16 models bf16 weight matrices too, with activations rounded
 * to bf16 in their products where the CPU has AMX or AVX512-BF16). Every
 * model is then held to the argmax of transformers' float32 run (the upcast
 * one for bf16 and f16 models) wherever its top two are more than TOL_FAST
 * apart, in one step, on a second turn and in greedy loops; chunks, batches
 * and the 4.x spelling stay bitwise.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/err.h"
#include "engine/model/model.h"
#include "fake_model.h"
#include "fidelity.h"

#define TOL_F32 1e-3
/* The top-2 gap above which the fast path must keep transformers' argmax:
 * its logits carry bf16 activations (8-bit significands) through every
 * product and bf16 keys and values, max |atlas - float32| 0.005 to
 * 0.17 on the test models (2026-11-26, AMX), every argmax past this gap equal. */
#define TOL_FAST 0.1

static bool fast; /* cpu_precision bf16 */

static struct ref_model refs[FID_MAX_MODELS];
static int n_refs;
static struct kt_backend *be;

static int setup(void **state)
{
	const char *precision = getenv("ATLAS_TEST_CPU_PRECISION");
	struct kt_config c = { .backend = "cpu", .threads = 2, .max_tokens = FID_MAX_TOKENS,
			       .max_seqs = FID_MAX_SEQS, .max_context = FID_MAX_CONTEXT,
			       .max_heads = 64, .max_head_dim = 256, .cpu_precision = precision };
	char err[ATLAS_ERRLEN];

	fast = precision && !strcmp(precision, "bf16");

	if (kt_backend_open(&c, &be, err, sizeof err)) {
		fprintf(stderr, "%s\n", err);
		return -1;
	}
	for (int i = 0; i < n_refs; i++)
		if (fid_open(&refs[i], be, err, sizeof err)) {
			fprintf(stderr, "%s: %s\n", refs[i].dir, err);
			return -1;
		}
	return 0;
}

static int teardown(void **state)
{
	for (int i = 0; i < n_refs; i++)
		fid_close(&refs[i], be);
	kt_backend_close(be);
	return 0;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
	double worst = 0;
	for (size_t i = 0; i < n; i++)
		worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
	return worst;
}

/* Lowest id of the largest logit, and the gap to the runner-up. */
static int argmax(const float *v, int n, double *gap)
{
	int best = 0;
	double second = -INFINITY;
	for (int i = 1; i < n; i++) {
		if (v[i] > v[best]) {
			second = v[best];
			best = i;
		} else if (v[i] > second) {
			second = v[i];
		}
	}
	if (gap)
		*gap = v[best] - second;
	return best;
}

/* The fast path's logits: the argmax of transformers' float32 run (the
 * upcast one for bf16 and f16 models) wherever its top two are more than
 * TOL_FAST apart. */
static void test_logits_fast(struct ref_model *r)
{
	const int V = r->vocab;
	double err = 0;
	int checked = 0;

	for (int s = 0; s < r->n_seqs; s++) {
		struct ref_seq *q = &r->seqs[s];
		const float *ref = r->lowp ? q->logits_upcast : q->logits;

		err = fmax(err, max_abs_diff(q->ours, ref, (size_t)q->len * (size_t)V));
		for (int t = 0; t < q->len; t++) {
			double gap;
			int want = argmax(ref + (size_t)t * V, V, &gap);

			if (gap <= TOL_FAST)
				continue;
			checked++;
			if (argmax(q->ours + (size_t)t * V, V, NULL) != want)
				fail_msg("%s: sequence %d position %d: argmax differs (gap %.4f)",
					 r->name, s, t, gap);
		}
	}
	printf("  %s (%s, cpu_precision bf16): max |atlas - transformers float32%s| = %.3g; "
	       "argmax equal at %d positions\n", r->name, r->dtype, r->lowp ? " upcast" : "",
	       err, checked);
	assert_true(checked > 0);
}

static void test_logits(void **state)
{
	for (int i = 0; i < n_refs; i++) {
		struct ref_model *r = &refs[i];
		const int V = r->vocab;
		double err_ref = 0, err_upcast = 0;
		int argmax_checked = 0;

		if (fast) {
			test_logits_fast(r);
			continue;
		}
		for (int s = 0; s < r->n_seqs; s++) {
			struct ref_seq *q = &r->seqs[s];
			size_t n = (size_t)q->len * (size_t)V;
			err_ref = fmax(err_ref, max_abs_diff(q->ours, q->logits, n));
			if (!r->lowp)
				continue;
			err_upcast = fmax(err_upcast, max_abs_diff(q->ours, q->logits_upcast, n));
			for (int t = 0; t < q->len; t++) {
				double gap;
				int want = argmax(q->logits + (size_t)t * V, V, &gap);
				if (gap <= r->tol_lowp)
					continue;
				argmax_checked++;
				if (argmax(q->ours + (size_t)t * V, V, NULL) != want)
					fail_msg("%s: sequence %d position %d: argmax "
						 "differs (gap %.4f)",
						 r->name, s, t, gap);
			}
		}
		if (!r->lowp) {
			printf("  %s (%s): max |atlas - transformers| = %.3g (limit %.0e)\n",
			       r->name, r->dtype, err_ref, TOL_F32);
			assert_true(err_ref <= TOL_F32);
			continue;
		}
		printf("  %s (%s): max |atlas - transformers float32 upcast| = %.3g (limit %.0e); "
		       "max |atlas - transformers %s| = %.3g (limit %.3g; transformers' own %s vs "
		       "float32 %.3g); argmax equal at %d positions\n",
		       r->name, r->dtype, err_upcast, TOL_F32, r->dtype, err_ref, r->tol_lowp,
		       r->dtype, r->lowp_vs_upcast, argmax_checked);
		assert_true(err_upcast <= TOL_F32);
		assert_true(err_ref <= r->tol_lowp);
	}
}

/* A second turn on the cache the first left (ref.json multi_turn, the
 * hybrid models: their recurrent state carries it): the first turn's
 * tokens in one step, the second's in another, against transformers'
 * forward of the second on its cache: logits within TOL_F32 (f32), argmax
 * of the float32 upcast where its top two are apart (bf16). */
static void check_multi_turn(struct ref_model *r, json_t *mt)
{
	json_t *first = json_object_get(mt, "first"), *second = json_object_get(mt, "second");
	const int n1 = (int)json_array_size(first), n2 = (int)json_array_size(second), V = r->vocab;
	int32_t ids[FID_MAX_TOKENS];
	float *out = malloc(sizeof(float) * FID_MAX_TOKENS * (size_t)V);
	assert_true(n1 > 0 && n2 > 0 && n1 <= FID_MAX_TOKENS && n2 <= FID_MAX_TOKENS && out);
	for (int i = 0; i < n1; i++)
		ids[i] = (int32_t)json_integer_value(json_array_get(first, (size_t)i));
	fid_step(r, be, ids, 0, 0, n1, out);
	for (int i = 0; i < n2; i++)
		ids[i] = (int32_t)json_integer_value(json_array_get(second, (size_t)i));
	fid_step(r, be, ids, 0, n1, n2, out);
	if (!r->lowp) {
		char path[4200];
		snprintf(path, sizeof path, "%s/ref/%s", r->dir,
			 json_string_value(json_object_get(mt, "logits")));
		float *want = malloc(sizeof(float) * (size_t)n2 * (size_t)V);
		FILE *f = fopen(path, "rb");
		assert_non_null(f);
		assert_int_equal(fread(want, sizeof(float), (size_t)n2 * (size_t)V, f),
				 (size_t)n2 * (size_t)V);
		fclose(f);
		const double err = max_abs_diff(out, want, (size_t)n2 * (size_t)V);
		printf("  %s: second turn on the first's cache: max |atlas - transformers| = %.3g\n",
		       r->name, err);
		for (int t = 0; fast && t < n2; t++) {
			double gap;
			int best = argmax(want + (size_t)t * V, V, &gap);

			if (gap > TOL_FAST)
				assert_int_equal(argmax(out + (size_t)t * V, V, NULL), best);
		}
		assert_true(fast || err <= TOL_F32);
		free(want);
	} else {
		json_t *am = json_object_get(mt, "argmax_upcast"), *gaps = json_object_get(mt,
											"gaps_upcast");
		int checked = 0;
		for (int t = 0; t < n2; t++) {
			if (json_number_value(json_array_get(gaps, (size_t)t)) <=
			    (fast ? TOL_FAST : TOL_F32))
				continue;
			checked++;
			assert_int_equal(argmax(out + (size_t)t * V, V, NULL),
					 json_integer_value(json_array_get(am, (size_t)t)));
		}
		printf("  %s: second turn on the first's cache: argmax equal at %d of %d "
		       "positions\n", r->name, checked, n2);
		assert_true(checked > n2 / 2);
	}
	free(out);
}

static void test_multi_turn(void **state)
{
	for (int i = 0; i < n_refs; i++) {
		char path[4200];
		snprintf(path, sizeof path, "%s/ref/ref.json", refs[i].dir);
		json_t *j = json_load_file(path, 0, NULL);
		assert_non_null(j);
		json_t *mt = json_object_get(j, "multi_turn");
		if (mt)
			check_multi_turn(&refs[i], mt);
		json_decref(j);
	}
}

/* The longest sequence in chunks of several sizes in slot 1, then
 * interleaved token by token with the second longest in the same steps. */
static void test_chunks_and_batches(void **state)
{
	static const int chunks[] = { 1, 7, 32, 60, 3, 97, 1000 };
	static const int chunks_a[] = { 13, 50, 1, 100, 1000 };
	static const int chunks_b[] = { 20, 1, 30, 2, 1000 };

	for (int i = 0; i < n_refs; i++) {
		struct ref_model *r = &refs[i];
		struct ref_seq *a = &r->seqs[r->n_seqs - 1], *b = &r->seqs[r->n_seqs - 2];
		const size_t V = (size_t)r->vocab;
		float *la = malloc((size_t)a->len * V * sizeof(float));
		float *lb = malloc((size_t)b->len * V * sizeof(float));
		const struct ref_seq *seqs[2] = { a, b };
		const int *plans[2] = { chunks, NULL };
		float *outs[2] = { la, NULL };

		fid_run_chunked(r, be, seqs, plans, outs, 1);
		printf("  %s: %d tokens in chunks: max diff to one step %.3g\n", r->name, a->len,
		       max_abs_diff(la, a->ours, (size_t)a->len * V));
		assert_memory_equal(la, a->ours, (size_t)a->len * V * sizeof(float));

		plans[0] = chunks_a;
		plans[1] = chunks_b;
		outs[1] = lb;
		fid_run_chunked(r, be, seqs, plans, outs, 2);
		printf("  %s: %d + %d tokens interleaved: max diff to alone %.3g, %.3g\n", r->name,
		       a->len, b->len, max_abs_diff(la, a->ours, (size_t)a->len * V),
		       max_abs_diff(lb, b->ours, (size_t)b->len * V));
		assert_memory_equal(la, a->ours, (size_t)a->len * V * sizeof(float));
		assert_memory_equal(lb, b->ours, (size_t)b->len * V * sizeof(float));
		free(la);
		free(lb);
	}
}

/* Every sequence in one step again, its out rows through the gather (the
 * model not told that they are every row in order): the same bits as with
 * out_all, where the model skips the gather (and, on a backend that takes
 * the norm into the product, norms into it). */
static void test_out_rows_gathered(void **state)
{
	for (int i = 0; i < n_refs; i++) {
		struct ref_model *r = &refs[i];
		const size_t V = (size_t)r->vocab;

		for (int s = 0; s < r->n_seqs; s++) {
			const struct ref_seq *q = &r->seqs[s];
			float *g = malloc((size_t)q->len * V * sizeof(float));

			assert_non_null(g);
			fid_gather_rows = true;
			fid_step(r, be, q->ids, 0, 0, q->len, g);
			fid_gather_rows = false;
			if (memcmp(g, q->ours, (size_t)q->len * V * sizeof(float)))
				fail_msg("%s: sequence %d: logits through the gather differ (max %.3g)",
					 r->name, s, max_abs_diff(g, q->ours, (size_t)q->len * V));
			free(g);
		}
	}
}

/* ours against one transformers run, as the comment at the top says. */
static void compare_greedy(const struct ref_model *r, const char *what, const int32_t *ours,
			   int n_ours, const struct ref_greedy *g, double tol)
{
	int n = n_ours < g->n_tokens ? n_ours : g->n_tokens;
	for (int t = 0; t < n; t++) {
		if (ours[t] == g->tokens[t])
			continue;
		printf("  %s: greedy vs %s: %d of %d tokens equal, then %d vs %d where "
		       "transformers' top-2 gap is %.4g\n", r->name, what, t, g->n_tokens, ours[t],
		       g->tokens[t], g->gaps[t]);
		if (g->gaps[t] > 2 * tol)
			fail_msg("%s: greedy vs %s differs at step %d, gap %.4g > %.4g", r->name,
				 what, t, g->gaps[t], 2 * tol);
		return;
	}
	printf("  %s: greedy vs %s: all %d tokens equal\n", r->name, what, g->n_tokens);
	assert_int_equal(n_ours, g->n_tokens);
}

static void test_greedy(void **state)
{
	int32_t tokens[FID_NEW_TOKENS];

	for (int i = 0; i < n_refs; i++) {
		struct ref_model *r = &refs[i];
		for (int p = 0; p < r->n_greedy; p++) {
			int n = fid_greedy(r, be, r->greedy[p].prompt, r->greedy[p].n_prompt,
					   r->max_new_tokens, tokens);
			if (!r->lowp) {
				compare_greedy(r, r->dtype, tokens, n, &r->greedy[p],
					       fast ? TOL_FAST : TOL_F32);
				continue;
			}
			if (fast) {
				compare_greedy(r, "float32 upcast", tokens, n,
					       &r->greedy_upcast[p], TOL_FAST);
				continue;
			}
			compare_greedy(r, "float32 upcast", tokens, n, &r->greedy_upcast[p],
				       TOL_F32);
			compare_greedy(r, r->dtype, tokens, n, &r->greedy[p], r->tol_lowp);
		}
	}
}

static void test_v4_config(void **state)
{
	char err[ATLAS_ERRLEN];

	for (int i = 0; i < n_refs; i++) {
		struct ref_model *r = &refs[i];
		struct model_config c5, c4;
		char *dir = fake_tmpdir();

		assert_non_null(dir);
		assert_int_equal(fid_copy_as_v4(r->dir, dir, err, sizeof err), 0);
		assert_int_equal(model_config_load(r->dir, &c5, err, sizeof err), 0);
		if (model_config_load(dir, &c4, err, sizeof err))
			fail_msg("%s", err);
		assert_memory_equal(&c5, &c4, sizeof c5);

		struct ref_seq *q = &r->seqs[r->n_seqs > 2 ? 2 : 0];
		size_t n = (size_t)q->len * (size_t)r->vocab;
		float *logits = malloc(n * sizeof(float));
		assert_int_equal(fid_logits_of_dir(r, be, dir, q, logits, err, sizeof err), 0);
		assert_memory_equal(logits, q->ours, n * sizeof(float));
		printf("  %s: 4.x spelling: same config, same logits\n", r->name);
		free(logits);
		fake_rmtree(dir);
		free(dir);
	}
}

int main(void)
{
	char err[ATLAS_ERRLEN];
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_logits),
		cmocka_unit_test(test_chunks_and_batches),
		cmocka_unit_test(test_out_rows_gathered),
		cmocka_unit_test(test_greedy),
		cmocka_unit_test(test_multi_turn),
		cmocka_unit_test(test_v4_config),
	};

	n_refs = fid_find_models(refs, FID_MAX_MODELS, err, sizeof err);
	if (n_refs < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	if (n_refs == 0) {
		printf("no reference models (tools/ref/make_tiny_models.py): skipped\n");
		return 77;
	}
	return cmocka_run_group_tests_name("model_fidelity", tests, setup, teardown);
}
