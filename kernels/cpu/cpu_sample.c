/* Sampling one token id per row of logits [n, V] f32.
 *
 * temperature 0: argmax, lowest id on ties. Otherwise the tokens are taken in
 * "rank order" (larger logit first, lower id on equal logits; NaN counts as
 * -inf) and p(i) = exp((l[i] - l_max) / temperature), which is the softmax of
 * l / temperature up to its normalizer:
 *  1. top-k keeps the first k tokens of rank order (0 or >= V: all);
 *  2. top-p keeps the shortest rank-order prefix of those whose mass reaches
 *     top_p times their total (at least one token);
 *  3. the kept tokens are walked in rank order and the first whose running
 *     mass exceeds u times the kept mass is the pick.
 * Masses are summed in double. The result depends only on the inputs.
 *
 * Rank order is produced chunk by chunk without a V-sized buffer: one pass
 * over the row fills a bounded heap (the worker's scratch) with the best
 * tokens ranked after the previous chunk, then the heap is sorted. The first
 * chunk is the whole top-k set when it fits (CPU_SAMPLE_CHUNK), else
 * CPU_SAMPLE_FIRST tokens, which hold the nucleus of most real rows; later
 * chunks are CPU_SAMPLE_CHUNK long. A walk that rewinds inside the first
 * chunk does not pass over the row again.
 *
 * Threads: rows are split over the OpenMP team.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

static inline float rank_logit(float l)
{
	return isnan(l) ? -INFINITY : l;
}

/* a comes before b in rank order. */
static inline bool before(struct cpu_cand a, struct cpu_cand b)
{
	return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static int32_t argmax(const float *l, int64_t V)
{
	int32_t best = 0;
	float bl = rank_logit(l[0]);

	for (int64_t i = 1; i < V; i++) {
		if (l[i] > bl) {
			bl = l[i];
			best = (int32_t)i;
		}
	}
	return best;
}

/* Heap whose root is the candidate ranked last. */
static void heap_down(struct cpu_cand *h, int n, int i)
{
	for (;;) {
		int c = 2 * i + 1;
		struct cpu_cand tmp;

		if (c >= n)
			return;
		if (c + 1 < n && before(h[c], h[c + 1]))
			c++;
		if (!before(h[i], h[c]))
			return;
		tmp = h[i];
		h[i] = h[c];
		h[c] = tmp;
		i = c;
	}
}

static void heap_up(struct cpu_cand *h, int i)
{
	while (i > 0) {
		int p = (i - 1) / 2;
		struct cpu_cand tmp;

		if (!before(h[p], h[i]))
			return;
		tmp = h[i];
		h[i] = h[p];
		h[p] = tmp;
		i = p;
	}
}

/* A walk over one row in rank order, limited to its first `limit` tokens. */
struct walk {
	const float *l;
	int64_t V, limit;
	float lmax, temperature;
	struct cpu_cand *buf;   /* the current chunk, best first */
	int cap, n, i;          /* buf capacity, tokens in it, cursor */
	int64_t done;           /* tokens yielded since the start */
	bool first;             /* buf holds the first chunk of the row */
	struct cpu_cand last;   /* last token of buf: the next chunk ranks after it */
};

/* Fill buf with the best `want` tokens ranked after w->last (after nothing
 * when w->done is 0), best first; returns how many. */
static int collect(struct walk *w, int want)
{
	struct cpu_cand *h = w->buf, after = w->last;
	bool bounded = w->done > 0;
	int n = 0;

	for (int64_t i = 0; i < w->V; i++) {
		struct cpu_cand c = { rank_logit(w->l[i]), (int32_t)i };

		if (bounded && !before(after, c))
			continue;
		if (n < want) {
			h[n] = c;
			heap_up(h, n++);
		} else if (c.logit > h[0].logit) {
			/* Equal logits need not be tried: ids rise, so c ranks after the root. */
			h[0] = c;
			heap_down(h, n, 0);
		}
	}
	for (int k = n - 1; k > 0; k--) {
		struct cpu_cand tmp = h[0];

		h[0] = h[k];
		h[k] = tmp;
		heap_down(h, k, 0);
	}
	return n;
}

static bool walk_next(struct walk *w, struct cpu_cand *c)
{
	if (w->done >= w->limit)
		return false;
	if (w->i == w->n) {
		int64_t left = w->limit - w->done;
		int want = w->cap;

		w->first = w->done == 0;
		if (w->first && w->limit > w->cap)
			want = CPU_SAMPLE_FIRST;
		w->n = collect(w, left < want ? (int)left : want);
		w->i = 0;
		if (!w->n)
			return false;
		w->last = w->buf[w->n - 1];
	}
	*c = w->buf[w->i++];
	w->done++;
	return true;
}

static void walk_rewind(struct walk *w)
{
	if (!w->first)
		w->n = 0;
	w->i = 0;
	w->done = 0;
}

static inline float weight(const struct walk *w, float logit)
{
	return logit == w->lmax ? 1.0f : expf((logit - w->lmax) / w->temperature);
}

static int32_t sample_row(const float *l, int64_t V, const struct kt_sample_row *s,
			  struct cpu_cand *buf)
{
	struct walk w = { .l = l, .V = V, .temperature = s->temperature, .buf = buf,
			  .cap = CPU_SAMPLE_CHUNK, .lmax = -INFINITY };
	struct cpu_cand c;
	double total = 0.0, kept, target, acc = 0.0;
	int64_t keep;
	int32_t id = 0;

	if (s->temperature == 0.0f)
		return argmax(l, V);
	for (int64_t i = 0; i < V; i++)
		w.lmax = rank_logit(l[i]) > w.lmax ? rank_logit(l[i]) : w.lmax;
	w.limit = s->top_k > 0 && s->top_k < V ? s->top_k : V;
	if (w.limit == V) {
		for (int64_t i = 0; i < V; i++)
			total += weight(&w, rank_logit(l[i]));
	} else {
		while (walk_next(&w, &c))
			total += weight(&w, c.logit);
		walk_rewind(&w);
	}
	keep = w.limit;
	kept = total;
	if (s->top_p < 1.0f) {
		double need = (double)s->top_p * total;

		/* If rounding keeps the mass below need, keep ends past limit:
		 * the pick walk below stops at limit all the same. */
		for (keep = 1, kept = 0.0; walk_next(&w, &c); keep++) {
			kept += weight(&w, c.logit);
			if (kept >= need)
				break;
		}
		walk_rewind(&w);
	}
	target = (double)s->u * kept;
	for (int64_t k = 1; walk_next(&w, &c); k++) {
		acc += weight(&w, c.logit);
		id = c.id;
		if (acc > target || k == keep)
			break;
	}
	return id;
}

static bool row_ok(const struct kt_sample_row *s)
{
	return isfinite(s->temperature) && s->temperature >= 0.0f && s->top_p >= 0.0f &&
	       s->top_p <= 1.0f && s->top_k >= 0 && s->u >= 0.0f && s->u < 1.0f;
}

int cpu_sample(struct kt_backend *be, const struct kt_tensor *logits,
	       const struct kt_sample_row *rows, int n, int32_t *ids)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t V;

	if (n < 0 || !cpu_valid(logits, KT_F32) || logits->rows != n || (n && (!rows || !ids)))
		return -EINVAL;
	V = logits->cols;
	if (V < 1 || V > INT32_MAX)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (!row_ok(&rows[i]))
			return -EINVAL;
#pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 1) if (n > 1)
	for (int i = 0; i < n; i++)
		ids[i] = sample_row((const float *)logits->data + (int64_t)i * V, V, &rows[i],
				    cpu_scratch_self(cpu)->cands);
	return 0;
}

/* A draw is sample() of the staged requests, done at once: drawn() only
 * copies its ids. */
int cpu_draw_rows(struct kt_backend *be, const struct kt_sample_row *rows, int n, int64_t V)
{
	struct cpu_backend *cpu = cpu_of(be);
	bool greedy = true;

	if (n < 1 || n > cpu->draw_cap || !rows || V < 1 || V > INT32_MAX)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		if (!row_ok(&rows[i]))
			return -EINVAL;
		greedy = greedy && rows[i].temperature == 0.0f;
	}
	memcpy(cpu->draw_req, rows, (size_t)n * sizeof(*rows));
	cpu->draw_n = n;
	cpu->draw_v = V;
	return greedy ? 0 : 1;
}

int cpu_draw(struct kt_backend *be, const struct kt_tensor *logits)
{
	struct cpu_backend *cpu = cpu_of(be);

	if (!cpu_valid(logits, KT_F32) || cpu->draw_n < 1 || logits->rows != cpu->draw_n ||
	    logits->cols != cpu->draw_v)
		return -EINVAL;
	return cpu_sample(be, logits, cpu->draw_req, cpu->draw_n, cpu->drawn_ids);
}

int cpu_drawn(struct kt_backend *be, int32_t *ids, int n)
{
	struct cpu_backend *cpu = cpu_of(be);

	if (n < 0 || n > cpu->draw_n || (n && !ids))
		return -EINVAL;
	memcpy(ids, cpu->drawn_ids, (size_t)n * sizeof(*ids));
	return 0;
}
