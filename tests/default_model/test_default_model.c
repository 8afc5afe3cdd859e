/* The shipped default model (models/atlas-next) against Hugging Face
 * transformers, through the atlas command-line tool on the cpu backend.
 *
 * tests/default_model/golden/ holds what transformers computed with the
 * same files (tools/train/check_hf.py): for each prompt, its token ids
 * (AutoTokenizer), the logits of its last positions and the greedy
 * continuation of the float32-upcast model (float32 arithmetic on the bf16
 * weights, which is what atlas computes), with the top-2 logit gap of every
 * step. Checked:
 *
 *  - `atlas tokenize` gives the ids of AutoTokenizer;
 *  - `atlas logits`: max |atlas - transformers| <= TOL over the stored
 *    positions, and the same argmax wherever transformers' top-2 gap > TOL;
 *  - `atlas generate --temperature 0` gives transformers' greedy tokens, up
 *    to the first step whose top-2 gap was under 2 TOL (a tie within the
 *    error, after which either choice is right).
 *
 * usage: test_default_model ATLAS   (77 = skipped when the model is missing)
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#define TOL 1e-3
#define MAX_PROMPTS 8
#define MAX_IDS 4096

struct golden {
	const char *text;
	int32_t ids[MAX_IDS];
	int n_ids;
	int32_t greedy[MAX_IDS];
	double gaps[MAX_IDS];
	int n_greedy;
	char logits_path[4096];
};

static const char *atlas;
static char model[4096];
static char tmpdir[64];
static json_t *root;
static struct golden goldens[MAX_PROMPTS];
static int n_goldens, vocab, last_positions, new_tokens;

static int read_ints(json_t *a, int32_t *out, int max)
{
	size_t i;
	json_t *v;
	if (!json_is_array(a) || (int)json_array_size(a) > max)
		return -EINVAL;
	json_array_foreach(a, i, v)
		out[i] = (int32_t)json_integer_value(v);
	return (int)json_array_size(a);
}

static int load_goldens(const char *dir)
{
	char path[4200];
	json_error_t jerr;
	size_t i;
	json_t *p;

	snprintf(path, sizeof path, "%s/golden.json", dir);
	root = json_load_file(path, 0, &jerr);
	if (!root) {
		fprintf(stderr, "%s:%d: %s\n", path, jerr.line, jerr.text);
		return -EINVAL;
	}
	vocab = (int)json_integer_value(json_object_get(root, "vocab_size"));
	last_positions = (int)json_integer_value(json_object_get(root, "last_positions"));
	new_tokens = (int)json_integer_value(json_object_get(root, "new_tokens"));
	json_t *prompts = json_object_get(root, "prompts");
	if (vocab <= 0 || last_positions <= 0 || new_tokens <= 0 || !json_is_array(prompts) ||
	    json_array_size(prompts) > MAX_PROMPTS) {
		fprintf(stderr, "%s: want vocab_size, last_positions, new_tokens, prompts\n", path);
		return -EINVAL;
	}
	json_array_foreach(prompts, i, p) {
		struct golden *g = &goldens[i];
		json_t *gaps = json_object_get(p, "gaps");
		g->text = json_string_value(json_object_get(p, "text"));
		g->n_ids = read_ints(json_object_get(p, "ids"), g->ids, MAX_IDS);
		g->n_greedy = read_ints(json_object_get(p, "greedy"), g->greedy, MAX_IDS);
		if (!g->text || g->n_ids <= 0 || g->n_greedy <= 0 || !json_is_array(gaps) ||
		    (int)json_array_size(gaps) != g->n_greedy) {
			fprintf(stderr, "%s: prompt %zu: want text, ids, greedy, gaps\n", path, i);
			return -EINVAL;
		}
		for (int k = 0; k < g->n_greedy; k++)
			g->gaps[k] = json_real_value(json_array_get(gaps, (size_t)k));
		const char *logits = json_string_value(json_object_get(p, "logits"));
		if (!logits || snprintf(g->logits_path, sizeof g->logits_path, "%s/%s", dir,
					logits) >= (int)sizeof g->logits_path) {
			fprintf(stderr, "%s: prompt %zu: no usable logits file name\n", path, i);
			return -EINVAL;
		}
	}
	n_goldens = (int)json_array_size(prompts);
	return 0;
}

/* Run a shell command and return its stdout (malloc'd), NULL on failure. */
static char *run(const char *fmt, ...)
{
	char cmd[16384];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);

	FILE *f = popen(cmd, "r");
	if (!f)
		return NULL;
	size_t cap = 4096, len = 0, got;
	char *out = malloc(cap);
	while ((got = fread(out + len, 1, cap - len - 1, f)) > 0) {
		len += got;
		if (cap - len < 2)
			out = realloc(out, cap *= 2);
	}
	out[len] = 0;
	if (pclose(f) != 0) {
		fprintf(stderr, "command failed: %s\n", cmd);
		free(out);
		return NULL;
	}
	return out;
}

static int parse_ids(const char *s, int32_t *out, int max)
{
	int n = 0;
	char *end;
	while (*s && n < max) {
		long v = strtol(s, &end, 10);
		if (end == s) {
			s++;
			continue;
		}
		out[n++] = (int32_t)v;
		s = end;
	}
	return n;
}

static void ids_csv(const struct golden *g, char *buf, size_t len)
{
	size_t off = 0;
	for (int i = 0; i < g->n_ids && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, i ? ",%d" : "%d", g->ids[i]);
}

/* The cpu backend whatever the machine, in f32 (the reference arithmetic):
 * the tolerances are those of f32 compute. */
static const char *options =
	"-o backend=cpu -o cpu_precision=f32 -o log_level=warn -o threads=2 -o kv_memory=64M";

static void test_tokenize(void **state)
{
	for (int i = 0; i < n_goldens; i++) {
		const struct golden *g = &goldens[i];
		char path[128];
		int32_t ids[MAX_IDS];
		snprintf(path, sizeof path, "%s/text", tmpdir);
		FILE *f = fopen(path, "w");
		assert_non_null(f);
		fputs(g->text, f);
		fclose(f);
		char *out = run("'%s' tokenize --model '%s' < '%s'", atlas, model, path);
		assert_non_null(out);
		int n = parse_ids(out, ids, MAX_IDS);
		free(out);
		assert_int_equal(n, g->n_ids);
		for (int k = 0; k < n; k++)
			if (ids[k] != g->ids[k])
				fail_msg("prompt %d: token %d is %d, transformers %d", i, k, ids[k],
					 g->ids[k]);
	}
}

static float *read_f32(const char *path, size_t n)
{
	float *v = malloc(n * sizeof *v);
	FILE *f = fopen(path, "rb");
	if (!f || fread(v, sizeof *v, n, f) != n || fgetc(f) != EOF) {
		if (f)
			fclose(f);
		free(v);
		return NULL;
	}
	fclose(f);
	return v;
}

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
	*gap = v[best] - second;
	return best;
}

static void test_logits(void **state)
{
	char csv[MAX_IDS * 8], out_path[128];
	double worst = 0;
	int checked = 0;

	snprintf(out_path, sizeof out_path, "%s/logits.f32", tmpdir);
	for (int i = 0; i < n_goldens; i++) {
		const struct golden *g = &goldens[i];
		int rows = g->n_ids < last_positions ? g->n_ids : last_positions;
		ids_csv(g, csv, sizeof csv);
		char *out = run("'%s' logits --model '%s' %s --tokens %s --out '%s'", atlas, model,
				options, csv, out_path);
		assert_non_null(out);
		free(out);
		float *ours = read_f32(out_path, (size_t)g->n_ids * (size_t)vocab);
		float *ref = read_f32(g->logits_path, (size_t)rows * (size_t)vocab);
		assert_non_null(ours);
		assert_non_null(ref);
		const float *tail = ours + (size_t)(g->n_ids - rows) * (size_t)vocab;
		for (int r = 0; r < rows; r++) {
			const float *a = tail + (size_t)r * vocab, *b = ref + (size_t)r * vocab;
			double gap, unused;
			for (int k = 0; k < vocab; k++)
				worst = fmax(worst, fabs((double)a[k] - (double)b[k]));
			int want = argmax(b, vocab, &gap);
			if (gap > TOL) {
				checked++;
				if (argmax(a, vocab, &unused) != want)
					fail_msg("prompt %d row %d: argmax differs (gap %.4f)", i, r, gap);
			}
		}
		free(ours);
		free(ref);
	}
	printf("  max |atlas - transformers float32 upcast| = %.3g (limit %.0e); argmax equal "
	       "at %d positions\n", worst, TOL, checked);
	assert_true(worst <= TOL);
}

static void test_greedy(void **state)
{
	char csv[MAX_IDS * 8];
	int compared = 0;

	for (int i = 0; i < n_goldens; i++) {
		const struct golden *g = &goldens[i];
		int32_t ids[MAX_IDS];
		ids_csv(g, csv, sizeof csv);
		char *out = run("'%s' generate --model '%s' %s --tokens %s --ids --temperature 0 "
				"--mode raw --max-tokens %d", atlas, model, options, csv, new_tokens);
		assert_non_null(out);
		int n = parse_ids(out, ids, MAX_IDS);
		free(out);
		int k = 0;
		for (; k < g->n_greedy; k++) {
			if (k >= n)
				fail_msg("prompt %d: atlas stopped after %d tokens, transformers "
					 "made %d", i, n, g->n_greedy);
			if (ids[k] != g->greedy[k])
				fail_msg("prompt %d: token %d is %d, transformers %d (gap %.4f)", i,
					 k, ids[k], g->greedy[k], g->gaps[k]);
			compared++;
			if (g->gaps[k] < 2 * TOL)
				break;
		}
		if (k == g->n_greedy)
			assert_int_equal(n, g->n_greedy);
	}
	printf("  greedy tokens equal to transformers': %d compared\n", compared);
}

static int setup(void **state)
{
	strcpy(tmpdir, "/tmp/atlas-default-model-XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	char path[128];
	const char *files[] = { "text", "logits.f32" };
	for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
		snprintf(path, sizeof path, "%s/%s", tmpdir, files[i]);
		unlink(path);
	}
	rmdir(tmpdir);
	json_decref(root);
	return 0;
}

int main(int argc, char **argv)
{
	const char *src = getenv("ATLAS_SOURCE_ROOT");
	char dir[4096], cfg[4200];
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tokenize),
		cmocka_unit_test(test_logits),
		cmocka_unit_test(test_greedy),
	};

	if (argc != 2 || !src) {
		fprintf(stderr, "usage: ATLAS_SOURCE_ROOT=DIR test_default_model ATLAS\n");
		return 1;
	}
	atlas = argv[1];
	snprintf(model, sizeof model, "%s/models/atlas-next", src);
	snprintf(cfg, sizeof cfg, "%s/config.json", model);
	if (access(cfg, R_OK) != 0) {
		printf("%s: no model: skipped\n", model);
		return 77;
	}
	if (strchr(atlas, '\'') || strchr(model, '\'')) {
		fprintf(stderr, "paths with a single quote are not supported\n");
		return 1;
	}
	snprintf(dir, sizeof dir, "%s/tests/default_model/golden", src);
	if (load_goldens(dir))
		return 1;
	return cmocka_run_group_tests_name("default_model", tests, setup, teardown);
}
