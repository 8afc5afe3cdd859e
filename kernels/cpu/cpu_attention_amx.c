/* Attention on bf16 KV caches with AMX-BF16 tiles: cpu_precision bf16 on a
 * CPU with AMX, head_dim a multiple of 32 and at most CPU_AMX_MAX_D
 * (cpu_attention_amx_path); paged, part and staged attention alike.
 *
 * A tile folds up to 16 query rows together: the tokens × heads of one kv
 * head whose keys are the same rows (one sequence), so that each key and
 * value row is read once for all of them. Per chunk of up to 16 positions
 * (a block of block_size positions is cut into chunks of 16 from its
 * start):
 *   S^T [16 keys, 16 rows] = K [16 keys, D] · Q^T   (tile 0 += tile 1 · tile 2
 *       per 32 dims: K straight from the cache rows, Q rounded to bf16 once
 *       per tile in pairs, qp[s][p][row] = (q[32s + 2p], q[32s + 2p + 1]));
 *   per row, in f32: the scores times scale; its keys below its own length
 *       (positions it may see); the running max m rises to theirs, l and acc
 *       are scaled by corr = exp(m_old - m_new); e = exp(s - m) (vexp8, the
 *       others 0); l += e summed in key order; P = e rounded to bf16;
 *   O [16 rows, 16 dims] = P [16 rows, 16 keys] · V (tile 5 = tile 3 · tile 4
 *       per 16 dims, V in pairs of key rows, vb[slice][p][d] = (v[2p][d],
 *       v[2p + 1][d]), zero past the chunk), then acc = fma(acc, corr, O).
 *
 * Order (DESIGN §4.1): a row's scores, max, sum and products depend on its
 * q and the chunk's keys alone; keys past its length give it weight 0 and
 * rows past the tile are zeros, and a tile element never mixes rows or
 * columns. A row that sees none of a chunk is left as it was. So a token
 * gets the same bits alone, in a prompt chunk of any size, in any batch and
 * through parts that start on block boundaries (the staged and part ops).
 * The arithmetic differs from the widening path's (q and P are rounded to
 * bf16, sums in other orders); a backend uses one or the other for all its
 * calls.
 *
 * Work items (cpu_attention_amx_run): consecutive tokens × heads of one kv
 * head, up to 16 rows; within an item, each run of tokens of one key source
 * is a tile. A lone decode token's item holds its GQA group.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_attention.h"
#include "kernels/cpu/cpu_attention_bf16.h"

/* A tile: up to CPU_AMX_ROWS query rows, tokens × heads of one kv head over
 * the same key rows. Its scratch is the thread's xbuf: the tile's buffers
 * in the first CPU_AMX_SCRATCH bytes, then (attention without a state
 * tensor) the rows' m, l and acc. */
#define CPU_AMX_ROWS 16
#define CPU_AMX_MAX_D 512
#define CPU_AMX_SCRATCH (96 * CPU_AMX_MAX_D + 4096)
_Static_assert(CPU_AMX_SCRATCH + (CPU_AMX_ROWS * (CPU_AMX_MAX_D + 2)) * sizeof(float) <=
		       CPU_XBUF_ROWS * CPU_DP_MAX_K * sizeof(uint16_t),
	       "the AMX attention scratch fits the thread's xbuf");

struct cpu_amx_rows {
	int nr, D;                      /* rows (1..16); head_dim */
	float scale;
	const float *q[CPU_AMX_ROWS];   /* [D] each row's query */
	int32_t n[CPU_AMX_ROWS];        /* a row folds the positions below its n */
	float *m[CPU_AMX_ROWS];         /* each row's running max, */
	float *l[CPU_AMX_ROWS];         /* sum, */
	float *acc[CPU_AMX_ROWS];       /* and [D] accumulator (caller's memory) */
};

#if defined(__x86_64__)
#include "kernels/cpu/cpu_amx.h"

/* The scratch of a tile in buf (the thread's xbuf), 64-byte aligned parts:
 * qp [D / 2 pairs][16 rows] u32, kb [16 keys][D], vb [D / 16][8][32] and
 * pb [16 rows][16 keys] bf16, sc and oc [16][16] f32. */
struct amx_scratch {
	uint32_t *qp;
	uint16_t *kb, *vb, *pb;
	float *sc, *oc;
};

AMX_INLINE struct amx_scratch scratch_of(uint16_t *buf, int D)
{
	struct amx_scratch s;

	s.qp = (uint32_t *)buf;
	s.kb = buf + 16 * D;
	s.vb = s.kb + 16 * D;
	s.pb = s.vb + 16 * D;
	s.sc = (float *)(s.pb + 256);
	s.oc = s.sc + 256;
	return s;
}

/* Tile 0: S^T [16 keys][16 rows] f32; 1: K [16 keys][32 bf16]; 2: Q pairs
 * [16 pairs][16 rows × 2]; 3: P [16 rows][16 keys bf16]; 4: V pairs
 * [8 key pairs][16 dims × 2]; 5: O [16 rows][16 dims] f32. */
/* Loads the tile configuration on this thread and packs the rows' q. */
AMX_TARGET static void amx_begin(const struct cpu_amx_rows *r, uint16_t *buf)
{
	const __m512i idx = _mm512_mullo_epi32(_mm512_set1_epi32(16),
					       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
								 10, 11, 12, 13, 14, 15));
	struct amx_scratch s = scratch_of(buf, r->D);
	struct amx_tilecfg c = { .palette = 1 };

	for (int i = 0; i < 6; i++) {
		c.colsb[i] = i == 3 ? 32 : 64;
		c.rows[i] = i == 4 ? 8 : 16;
	}
	TILE_FENCE();
	_tile_loadconfig(&c);
	memset(s.qp, 0, (size_t)r->D * 16 * sizeof(uint16_t));
	memset(s.pb, 0, 256 * sizeof(uint16_t));
	for (int i = 0; i < r->nr; i++)
		for (int k = 0; k < r->D; k += 32) {
			__m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(r->q[i] + k + 16),
								 _mm512_loadu_ps(r->q[i] + k));

			_mm512_i32scatter_epi32(s.qp + k / 2 * 16 + i, idx, v, 4);
		}
}

/* Releases the tiles. */
AMX_TARGET static void amx_end(void)
{
	TILE_FENCE();
	_tile_release();
}

/* vb = the chunk's value rows [0, len) in pairs, zeros past len. */
AMX_INLINE void pack_values(uint16_t *vb, const uint16_t *v, int64_t ld, int len, int D)
{
	const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
					    40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
					    32, 0);
	const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));

	for (int p = 0; p < 8; p++) {
		const uint16_t *a = v + 2 * p * ld, *b = a + ld;

		for (int d = 0; d < D; d += 32) {
			__m512i x = 2 * p < len ? _mm512_loadu_si512(a + d) : _mm512_setzero_si512();
			__m512i y = 2 * p + 1 < len ? _mm512_loadu_si512(b + d)
						    : _mm512_setzero_si512();

			_mm512_storeu_si512(vb + ((d / 16) * 8 + p) * 32,
					    _mm512_permutex2var_epi16(x, lo, y));
			_mm512_storeu_si512(vb + ((d / 16 + 1) * 8 + p) * 32,
					    _mm512_permutex2var_epi16(x, hi, y));
		}
	}
}

/* One chunk: positions [j, j + len) of rows k, v (ld apart), len <= 16. */
AMX_INLINE void chunk(const struct cpu_amx_rows *r, struct amx_scratch *s, const uint16_t *k,
		      const uint16_t *v, int64_t ld, int32_t j, int len)
{
	const int D = r->D;
	const uint16_t *ka = k;
	int64_t kld = ld;
	float corr[16];
	bool active[16];

	if (len < 16) {
		/* rows past the chunk may lie past the block or the cache */
		for (int i = 0; i < len; i++)
			memcpy(s->kb + i * D, k + i * ld, (size_t)D * sizeof(uint16_t));
		memset(s->kb + len * D, 0, (size_t)(16 - len) * D * sizeof(uint16_t));
		ka = s->kb;
		kld = D;
	}
	_tile_zero(0);
	for (int d = 0; d < D; d += 32) {
		TILE_LOAD(1, ka + d, kld * 2);
		TILE_LOAD(2, s->qp + d / 2 * 16, 64);
		_tile_dpbf16ps(0, 1, 2);
	}
	TILE_STORE(0, s->sc, 64);
	for (int i = 0; i < r->nr; i++) {
		const int n = r->n[i] - j < len ? r->n[i] - j : len;
		float w[16], m_new = *r->m[i], sum = 0.0f;

		active[i] = n > 0;
		if (!active[i]) {
			_mm256_storeu_si256((__m256i *)(s->pb + i * 16), _mm256_setzero_si256());
			continue;
		}
		for (int c = 0; c < n; c++) {
			w[c] = s->sc[c * 16 + i] * r->scale;
			m_new = w[c] > m_new ? w[c] : m_new;
		}
		corr[i] = *r->m[i] == -INFINITY ? 0.0f : expf(*r->m[i] - m_new);
		exp_block(w, n, m_new);
		for (int c = 0; c < n; c++)
			sum += w[c];
		for (int c = n; c < 16; c++)
			w[c] = 0.0f;
		*r->m[i] = m_new;
		*r->l[i] = *r->l[i] * corr[i] + sum;
		_mm256_storeu_si256((__m256i *)(s->pb + i * 16),
				    (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(w)));
	}
	pack_values(s->vb, v, ld, len, D);
	TILE_LOAD(3, s->pb, 32);
	for (int d = 0; d < D; d += 16) {
		_tile_zero(5);
		TILE_LOAD(4, s->vb + (d / 16) * 8 * 32, 64);
		_tile_dpbf16ps(5, 3, 4);
		TILE_STORE(5, s->oc, 64);
		for (int i = 0; i < r->nr; i++) {
			float *acc = r->acc[i] + d;

			if (active[i])
				_mm512_storeu_ps(acc, _mm512_fmadd_ps(_mm512_loadu_ps(acc),
								      _mm512_set1_ps(corr[i]),
								      _mm512_loadu_ps(s->oc + i * 16)));
		}
	}
}

/* Folds positions [j0, j0 + len) (one block, at most block_size), whose
 * bf16 key and value rows are k and v, ld elements apart, into the rows. */
AMX_TARGET static void amx_block(const struct cpu_amx_rows *r, uint16_t *buf, const uint16_t *k,
				 const uint16_t *v, int64_t ld, int32_t j0, int32_t len)
{
	struct amx_scratch s = scratch_of(buf, r->D);

	for (int32_t c = 0; c < len; c += 16)
		chunk(r, &s, k + c * ld, v + c * ld, ld, j0 + c, len - c < 16 ? len - c : 16);
}

#else

static void amx_begin(const struct cpu_amx_rows *r, uint16_t *buf)
{
	abort();
}

static void amx_block(const struct cpu_amx_rows *r, uint16_t *buf, const uint16_t *k,
		      const uint16_t *v, int64_t ld, int32_t j0, int32_t len)
{
	abort();
}

static void amx_end(void)
{
	abort();
}

#endif

bool cpu_attention_amx_path(const struct cpu_backend *cpu, enum kt_dtype kv, int D)
{
	return cpu->bf16 && cpu->isa == CPU_ISA_AMX && kv == KT_BF16 && D % 32 == 0 &&
	       D <= CPU_AMX_MAX_D;
}

/* The AMX path's items: up to CPU_AMX_ROWS / per consecutive tokens × per
 * heads of one kv head, fewer heads when there would be fewer items than
 * threads; a row's arithmetic is the same in any item. */
static struct att_split amx_split(const struct cpu_backend *cpu, int64_t T, int n_heads,
				  int n_kv_heads)
{
	struct att_split p = { .group = n_heads / n_kv_heads };

	p.per = ATLAS_MIN(p.group, CPU_AMX_ROWS);
	while (p.per > 1 && T * n_kv_heads * ((p.group + p.per - 1) / p.per) < cpu->threads)
		p.per = (p.per + 1) / 2;
	p.chunks = (p.group + p.per - 1) / p.per;
	p.items = (T + CPU_AMX_ROWS / p.per - 1) / (CPU_AMX_ROWS / p.per) * n_kv_heads * p.chunks;
	return p;
}

/* Tokens [t0, t1) of one key source (a sequence, or staged rows) and the
 * item's heads, folded through the AMX path: a->kv, kc, vc, ld, bs, from,
 * D, scale, kvh, h0 and nh are set; n[t - t0] is token t's end. The state
 * is rows of st, or (st NULL) the thread's scratch, finished into out. */
static void amx_rows(const struct att_item *a, int64_t t0, int64_t t1, const int32_t *n,
		     const struct kt_att_state *st, bool empty, struct att_out out, int64_t qcols,
		     const float *q, uint16_t *buf)
{
	float *own = (float *)((char *)buf + CPU_AMX_SCRATCH);
	struct cpu_amx_rows r = { .D = a->D, .scale = a->scale };
	int32_t nmax = 0;

	for (int64_t t = t0; t < t1; t++)
		for (int h = a->h0; h < a->h0 + a->nh; h++, r.nr++) {
			r.q[r.nr] = q + t * qcols + (int64_t)h * a->D;
			r.n[r.nr] = n[t - t0];
			r.m[r.nr] = st ? (float *)st->ml.data + t * st->ml.cols + 2 * h
				       : own + CPU_AMX_ROWS * a->D + 2 * r.nr;
			r.l[r.nr] = r.m[r.nr] + 1;
			r.acc[r.nr] = st ? (float *)st->acc.data + t * st->acc.cols + (int64_t)h * a->D
					 : own + r.nr * a->D;
			if (empty || !st) {
				*r.m[r.nr] = -INFINITY;
				*r.l[r.nr] = 0.0f;
				memset(r.acc[r.nr], 0, (size_t)a->D * sizeof(float));
			}
			nmax = n[t - t0] > nmax ? n[t - t0] : nmax;
		}
	amx_begin(&r, buf);
	for (int32_t j0 = a->from; j0 < nmax; j0 += a->bs) {
		int64_t base = j0 * a->ld + (int64_t)a->kvh * a->D;

		if (a->kv)
			base = (int64_t)seq_blocks(a->kv, t0)[j0 / a->bs] * a->kv->stride * a->ld +
			       (int64_t)a->kvh * a->D;
		amx_block(&r, buf, (const uint16_t *)a->kc + base, (const uint16_t *)a->vc + base,
			  a->ld, j0, nmax - j0 < a->bs ? nmax - j0 : a->bs);
	}
	amx_end();
	for (int i = 0; out.p && i < r.nr; i++)
		att_out_row(out, (t0 + i / a->nh) * qcols + (int64_t)(a->h0 + i % a->nh) * a->D,
			    r.acc[i], 1.0f / *r.l[i], a->D);
}

/* Item it of split p: its heads into a, its tokens [*t0, *t1). */
static void amx_place(struct att_item *a, const struct att_split *p, int64_t it, int n_kv_heads,
		      int64_t T, int64_t *t0, int64_t *t1)
{
	const int64_t per_group = (int64_t)n_kv_heads * p->chunks;
	const int tokens = CPU_AMX_ROWS / p->per, c = (int)(it % per_group % p->chunks);

	a->kvh = (int)(it % per_group / p->chunks);
	a->h0 = a->kvh * p->group + c * p->per;
	a->nh = ATLAS_MIN(p->per, p->group - c * p->per);
	*t0 = it / per_group * tokens;
	*t1 = ATLAS_MIN(T, *t0 + tokens);
}

void cpu_attention_amx_run(struct cpu_backend *cpu, const struct att_item *tmpl,
			   const struct cpu_amx_src *src, int64_t T, int n_heads, int n_kv_heads,
			   const struct kt_att_state *st, bool empty, struct att_out out,
			   const float *q, int64_t qcols, int64_t work)
{
	const struct att_split p = amx_split(cpu, T, n_heads, n_kv_heads);

#pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 1) if (work > CPU_PAR_MIN)
	for (int64_t it = 0; it < p.items; it++) {
		struct att_item a = *tmpl;
		int32_t n[CPU_AMX_ROWS];
		int64_t t0, t1, e;

		amx_place(&a, &p, it, n_kv_heads, T, &t0, &t1);
		for (; t0 < t1; t0 = e) {
			const int32_t id = src->id[t0 * src->stride];

			for (e = t0; e < t1 && src->id[e * src->stride] == id; e++)
				n[e - t0] = src->end[e * src->stride] + src->add;
			a.from = src->from ? src->from[id] : 0;
			if (!a.kv) {
				a.kc = (const uint16_t *)tmpl->kc + (int64_t)id * a.ld;
				a.vc = (const uint16_t *)tmpl->vc + (int64_t)id * a.ld;
			}
			amx_rows(&a, t0, e, n, st, empty, out, qcols, q, cpu_scratch_self(cpu)->xbuf);
		}
	}
}
