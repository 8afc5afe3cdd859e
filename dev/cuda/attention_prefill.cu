/* Prefill attention lab: the tensor-core prefill kernel of
 * kernels/cuda/cuda_attention_prefill.cuh (warps per CTA 4 or 8, ring depth
 * 2 or 3, register cap for 1 to 3 CTAs per SM, softmax steps of 64 or 32
 * keys, one or two m-tiles of 16 rows a warp), the kernel on Hopper's
 * warpgroup MMA (kernels/cuda/cuda_attention_wgmma.cuh, head_dim 128 only:
 * 2 or 3 warpgroups, ring depth 2 or 3, 1 or 2 CTAs per SM) and the
 * generic kernel (checked only: it ran at 1.0 TFLOP/s on the Qwen3-8B
 * prompt, H100, 2026-11-22), on a paged bf16 cache with a shuffled block
 * table, against a float64 CPU reference (q as given, in f32).
 *
 * A prompt of `total` tokens runs in chunks of `chunk` (one segment each):
 * chunk c holds positions [c·chunk, (c+1)·chunk) and attends to every
 * earlier position plus causally within itself, as the engine's chunked
 * prefill does. TFLOP/s is the effective rate 4 · Σ_rows (pos + 1) · D ·
 * n_heads over the time of all chunks, printed with a digest of the
 * outputs' bits (a build before a kernel change against one after it).
 * Checked: the first, last and 10 random rows of every chunk, all heads;
 * plus single segments with odd GQA groups and history. Each wide and
 * wgmma variant must give the bits of its one-m-tile twin. Then the
 * backend's head_dim-128 kernels chunk by chunk, beside the ones its rules
 * pick.
 *
 * Build and run: see dev/cuda/README.md.
 */
#include "lab.cuh"

#include "kernels/cuda/cuda_attention_generic.cuh"
#include "kernels/cuda/cuda_attention_prefill.cuh"
#include "kernels/cuda/cuda_attention_wgmma.cuh"

#define BS 16

static const uint64_t SEED_K = 33, SEED_V = 44;

struct shape {
	int n_heads, n_kv, D;
};

/* One sequence's cache and the segments of its prompt. */
struct prompt {
	shape sh;
	int total;                  /* positions stored */
	std::vector<int32_t> table; /* block table row */
	int32_t *bt;
	__nv_bfloat16 *kc, *vc;
	int64_t n_blocks;
	unsigned *fault;
	cudaStream_t s;
};

struct segment {
	int pos0, n_rows;
	std::vector<float> q; /* [n_rows, n_heads * D] */
	float *dq, *dout;
};

static void prompt_make(prompt &P, const shape &sh, int total)
{
	const int nb = (total + BS - 1) / BS;
	std::vector<int32_t> perm;
	int64_t elems;

	P.sh = sh;
	P.total = total;
	P.n_blocks = nb + 9;
	for (int64_t i = 0; i < P.n_blocks; i++)
		perm.push_back((int32_t)i);
	lab_shuffle(perm);
	P.table.assign(perm.begin(), perm.begin() + nb);
	P.bt = lab_upload(P.table);
	elems = P.n_blocks * BS * sh.n_kv * sh.D;
	CHECK(cudaMalloc(&P.kc, elems * 2));
	CHECK(cudaMalloc(&P.vc, elems * 2));
	lab_fill(P.kc, elems, SEED_K);
	lab_fill(P.vc, elems, SEED_V);
	CHECK(cudaMalloc(&P.fault, 4));
	CHECK(cudaMemset(P.fault, 0, 4));
	CHECK(cudaStreamCreateWithFlags(&P.s, cudaStreamNonBlocking));
	CHECK(cudaDeviceSynchronize());
}

static void prompt_free(prompt &P)
{
	CHECK(cudaFree(P.bt));
	CHECK(cudaFree(P.kc));
	CHECK(cudaFree(P.vc));
	CHECK(cudaFree(P.fault));
	CHECK(cudaStreamDestroy(P.s));
}

static void segment_make(segment &g, const prompt &P, int pos0, int n_rows)
{
	g.pos0 = pos0;
	g.n_rows = n_rows;
	g.q.resize((size_t)n_rows * P.sh.n_heads * P.sh.D);
	for (float &x : g.q)
		x = 2.0f * lab_uniform();
	g.dq = lab_upload(g.q);
	CHECK(cudaMalloc(&g.dout, g.q.size() * 4));
}

static void segment_free(segment &g)
{
	CHECK(cudaFree(g.dq));
	CHECK(cudaFree(g.dout));
}

/* float64 reference of segment rows `rows`, all heads: ref [rows.size(), n_heads * D]. */
static void reference(const prompt &P, const segment &g, const std::vector<int> &rows,
		      std::vector<double> &ref)
{
	const shape &sh = P.sh;
	const int grp = sh.n_heads / sh.n_kv, D = sh.D;
	const int64_t row_len = (int64_t)sh.n_kv * D;
	const double scale = 1.0 / sqrt((double)D);

	ref.assign(rows.size() * sh.n_heads * D, 0.0);
#pragma omp parallel for schedule(dynamic, 1)
	for (int it = 0; it < (int)rows.size() * sh.n_kv; it++) {
		const int i = it / sh.n_kv, kvh = it % sh.n_kv, n = g.pos0 + rows[i] + 1;
		std::vector<double> sc((size_t)grp * n), kv(D);

		for (int pass = 0; pass < 2; pass++) {
			for (int j = 0; j < n; j++) {
				const int64_t crow = (int64_t)P.table[j / BS] * BS + j % BS;

				for (int d = 0; d < D; d++)
					kv[d] = lab_bf16(lab_val(crow * row_len + kvh * D + d,
								 pass ? SEED_V : SEED_K));
				for (int h = 0; h < grp; h++) {
					const int head = kvh * grp + h;
					double *s = &sc[(size_t)h * n + j];

					if (!pass) {
						const float *q =
							&g.q[((size_t)rows[i] * sh.n_heads + head) * D];
						double dot = 0;

						for (int d = 0; d < D; d++)
							dot += (double)q[d] * kv[d];
						*s = dot * scale;
					} else {
						const size_t at = (size_t)i * sh.n_heads + head;
						double *o = &ref[at * D];

						for (int d = 0; d < D; d++)
							o[d] += *s * kv[d];
					}
				}
			}
			if (pass)
				break;
			for (int h = 0; h < grp; h++) {
				double m = -INFINITY, sum = 0;

				for (int j = 0; j < n; j++)
					m = std::max(m, sc[(size_t)h * n + j]);
				for (int j = 0; j < n; j++) {
					double *x = &sc[(size_t)h * n + j];

					sum += *x = exp(*x - m);
				}
				for (int j = 0; j < n; j++)
					sc[(size_t)h * n + j] /= sum;
			}
		}
	}
}

/* tc W w, ring S, B CTAs/SM asked, softmax steps of K keys, mM: M m-tiles
 * of 16 rows a warp (the wide kernel); wgmma wW: W warpgroups, sS: a ring of
 * S (else 2), m2: two CTAs an SM asked (else one) */
enum variant { V_A, V_C, V_E, V_F, V_G, V_H, V_W4M2, V_W4M2K32, V_W8M2, V_W8M2K32, V_W8S3M2,
	       V_WG2, V_WG3, V_WG3S3, V_WG2M2, V_GENERIC,
	       N_VARIANTS };
static const char *vname[N_VARIANTS] = {
	"tc w4s2b2k64", "tc w4s2b3k32", "tc w8s2b1k64", "tc w8s3b1k64", "tc w8s2b1k32",
	"tc w8s3b1k32", "tc w4s2b2k64m2", "tc w4s2b2k32m2", "tc w8s2b1k64m2", "tc w8s2b1k32m2",
	"tc w8s3b1k64m2", "wgmma w2", "wgmma w3", "wgmma w3s3", "wgmma w2m2",
	"generic",
};

/* The kernels' arguments for segment g of prompt P (its whole cache one
 * sequence, out f32). */
static prefill_args lab_args(const prompt &P, const segment &g)
{
	const int D = P.sh.D;
	prefill_args a;

	a.out = { g.dout, false };
	a.q = g.dq;
	a.kc = P.kc;
	a.vc = P.vc;
	a.blocks = P.bt;
	a.kv.pos = a.kv.seq = NULL;
	a.kv.bt = P.bt;
	a.kv.bt_rows = 1;
	a.kv.bt_cols = (int64_t)P.table.size();
	a.kv.n_blocks = P.n_blocks;
	a.kv.row_len = (int64_t)P.sh.n_kv * D;
	a.kv.bs = BS;
	a.kv.block_rows = BS;
	a.row0 = 0;
	a.n_rows = g.n_rows;
	a.pos0 = g.pos0;
	a.n_heads = P.sh.n_heads;
	a.group = P.sh.n_heads / P.sh.n_kv;
	a.sl2 = ATT_LOG2E / sqrtf((float)D);
	a.fault = P.fault;
	return a;
}

template <int D, int WARPS, int STAGES, int MINB, int SUB, int MT = 1>
static void launch_tc(const prompt &P, const segment &g)
{
	static bool ready;

	if (!ready) {
		CHECK((prefill_setup<D, WARPS, STAGES, MINB, SUB, MT>()));
		ready = true;
	}
	prefill_launch<D, WARPS, STAGES, MINB, SUB, MT>(false, lab_args(P, g), P.sh.n_kv, P.s);
}

template <int WGS, int STAGES, int MINB> static void launch_wgmma(const prompt &P, const segment &g)
{
	static bool ready;

	if (!ready) {
		CHECK((prefill_wgmma_setup<WGS, STAGES, MINB>()));
		ready = true;
	}
	prefill_wgmma_launch<WGS, STAGES, MINB>(false, lab_args(P, g), P.sh.n_kv, P.s);
}

/* Whether variant v runs on heads of D dims: the wgmma ones need D 128. */
static bool runs(int v, int D)
{
	return v < V_WG2 || v > V_WG2M2 || D == 128;
}

/* The generic kernel reads device positions: build them for the segment once. */
struct gen_meta {
	int32_t *pos, *seq;
};

template <int D> static void launch_generic(const prompt &P, const segment &g, gen_meta &m)
{
	gen_args<__nv_bfloat16> a;

	if (!m.pos) {
		std::vector<int32_t> pos(g.n_rows), seq(g.n_rows, 0);

		for (int i = 0; i < g.n_rows; i++)
			pos[i] = g.pos0 + i;
		m.pos = lab_upload(pos);
		m.seq = lab_upload(seq);
	}
	a.out = { g.dout, false };
	a.q = g.dq;
	a.kc = P.kc;
	a.vc = P.vc;
	a.kv.pos = m.pos;
	a.kv.seq = m.seq;
	a.kv.bt = P.bt;
	a.kv.bt_rows = 1;
	a.kv.bt_cols = (int64_t)P.table.size();
	a.kv.n_blocks = P.n_blocks;
	a.kv.row_len = (int64_t)P.sh.n_kv * D;
	a.kv.bs = BS;
	a.kv.block_rows = BS;
	a.n_heads = P.sh.n_heads;
	a.group = P.sh.n_heads / P.sh.n_kv;
	a.D = D;
	a.max_pos = (1 << 30) - 1;
	a.scale = 1.0f / sqrtf((float)D);
	a.vec4 = false;
	a.fault = P.fault;
	gen_launch(a, (unsigned)(g.n_rows * P.sh.n_heads), P.s);
}

template <int D> static void launch(const prompt &P, const segment &g, int v, gen_meta &m)
{
	switch (v) {
	case V_A: launch_tc<D, 4, 2, 2, 64>(P, g); break;
	case V_C: launch_tc<D, 4, 2, 3, 32>(P, g); break;
	case V_E: launch_tc<D, 8, 2, 1, 64>(P, g); break;
	case V_F: launch_tc<D, 8, 3, 1, 64>(P, g); break;
	case V_G: launch_tc<D, 8, 2, 1, 32>(P, g); break;
	case V_H: launch_tc<D, 8, 3, 1, 32>(P, g); break;
	case V_W4M2: launch_tc<D, 4, 2, 2, 64, 2>(P, g); break;
	case V_W4M2K32: launch_tc<D, 4, 2, 2, 32, 2>(P, g); break;
	case V_W8M2: launch_tc<D, 8, 2, 1, 64, 2>(P, g); break;
	case V_W8M2K32: launch_tc<D, 8, 2, 1, 32, 2>(P, g); break;
	case V_W8S3M2: launch_tc<D, 8, 3, 1, 64, 2>(P, g); break;
	case V_WG2: launch_wgmma<2, 2, 1>(P, g); break;
	case V_WG3: launch_wgmma<3, 2, 1>(P, g); break;
	case V_WG3S3: launch_wgmma<3, 3, 1>(P, g); break;
	case V_WG2M2: launch_wgmma<2, 2, 2>(P, g); break;
	default: launch_generic<D>(P, g, m); break;
	}
	CHECK_LAUNCH();
}

static void launch_any(const prompt &P, const segment &g, int v, gen_meta &m)
{
	if (P.sh.D == 64)
		launch<64>(P, g, v, m);
	else
		launch<128>(P, g, v, m);
}

static int failures;

/* The one-m-tile variant whose arithmetic a wide or a wgmma variant repeats
 * (the same softmax step, the products' sums in the same order), or -1:
 * their outputs must be the same bits. */
static int same_bits_as(int v)
{
	switch (v) {
	case V_W4M2: case V_W8M2: return V_E;
	case V_W8S3M2: return V_F;
	case V_W4M2K32: case V_W8M2K32: return V_G;
	case V_WG2: case V_WG3: case V_WG3S3: case V_WG2M2: return V_E;
	default: return -1;
	}
}

/* Values whose bits differ, counted per wide variant over every check. */
static long long bit_diffs[N_VARIANTS];

/* Check every variant on segment g's rows `rows`. */
static void check(const prompt &P, const segment &g, const std::vector<int> &rows,
		  std::vector<lab_err> &errs, std::vector<gen_meta> &meta)
{
	std::vector<double> ref;
	std::vector<float> out(g.q.size());
	const size_t rl = (size_t)P.sh.n_heads * P.sh.D;

	std::vector<std::vector<float>> outs(N_VARIANTS);

	reference(P, g, rows, ref);
	for (int v = 0; v < N_VARIANTS; v++) {
		unsigned fault;

		if (!runs(v, P.sh.D))
			continue;
		CHECK(cudaMemset(g.dout, 0xff, out.size() * 4));
		launch_any(P, g, v, meta[v]);
		CHECK(cudaStreamSynchronize(P.s));
		CHECK(cudaMemcpy(out.data(), g.dout, out.size() * 4, cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(&fault, P.fault, 4, cudaMemcpyDeviceToHost));
		outs[v] = out;
		if (same_bits_as(v) >= 0)
			for (size_t k = 0; k < out.size(); k++)
				bit_diffs[v] += memcmp(&out[k], &outs[same_bits_as(v)][k], 4) != 0;
		for (size_t i = 0; i < rows.size(); i++)
			for (size_t k = 0; k < rl; k++)
				errs[v].add(out[rows[i] * rl + k], ref[i * rl + k]);
		if (fault)
			errs[v].bad++;
	}
}

static void report(const char *what, const std::vector<lab_err> &errs, int D)
{
	for (int v = 0; v < N_VARIANTS; v++) {
		const bool ok = errs[v].ok(2e-2);

		if (!runs(v, D))
			continue;
		printf("  check %-36s %-12s max_abs %.2e rel_l2 %.2e%s\n", what, vname[v],
		       errs[v].max_abs, errs[v].rel(), ok ? "" : "  FAIL");
		failures += !ok;
	}
}

/* FNV-1a over the bits of every chunk's output, to compare a variant's
 * results across two builds of this lab (a kernel change that should keep
 * every bit) where the checks above only bound the error. */
static uint64_t digest(const std::vector<segment> &segs, const shape &sh)
{
	uint64_t h = 1469598103934665603ull;

	for (const segment &g : segs) {
		std::vector<float> out((size_t)g.n_rows * sh.n_heads * sh.D);

		CHECK(cudaMemcpy(out.data(), g.dout, out.size() * sizeof(float),
				 cudaMemcpyDeviceToHost));
		const unsigned char *b = (const unsigned char *)out.data();

		for (size_t i = 0; i < out.size() * sizeof(float); i++)
			h = (h ^ b[i]) * 1099511628211ull;
	}
	return h;
}

/* A prompt of total tokens in chunks: check sampled rows, then time all
 * chunks per variant, with the digest of its outputs. */
static void chunked(const shape &sh, int total, int chunk, bool time_generic)
{
	prompt P;
	std::vector<segment> segs(total / chunk);
	std::vector<lab_err> errs(N_VARIANTS);
	std::vector<std::vector<gen_meta>> meta(segs.size(), std::vector<gen_meta>(N_VARIANTS));
	double flops = 0;
	char what[96];

	prompt_make(P, sh, total);
	for (size_t c = 0; c < segs.size(); c++) {
		std::vector<int> rows = { 0, 1, chunk - 1 };

		segment_make(segs[c], P, (int)c * chunk, chunk);
		for (int i = 0; i < 10; i++)
			rows.push_back((int)(lab_next() % chunk));
		check(P, segs[c], rows, errs, meta[c]);
		for (int i = 0; i < chunk; i++)
			flops += 4.0 * ((int)c * chunk + i + 1) * sh.D * sh.n_heads;
	}
	snprintf(what, sizeof what, "%d/%d D%d, %d tokens in chunks of %d", sh.n_heads, sh.n_kv,
		 sh.D, total, chunk);
	report(what, errs, sh.D);
	for (int v = 0; v < N_VARIANTS; v++) {
		float ms;

		if ((v == V_GENERIC && !time_generic) || !runs(v, sh.D))
			continue;
		ms = lab_time(
			[&] {
				for (size_t c = 0; c < segs.size(); c++)
					launch_any(P, segs[c], v, meta[c][v]);
			},
			v == V_GENERIC ? 2 : 10, P.s);
		printf("  time  %-36s %-12s %8.3f ms  %6.1f TFLOP/s  bits %016llx\n", what, vname[v],
		       ms, flops / (ms * 1e-3) / 1e12, (unsigned long long)digest(segs, sh));
	}
	for (size_t c = 0; c < segs.size(); c++) {
		segment_free(segs[c]);
		for (gen_meta &m : meta[c])
			if (m.pos) {
				CHECK(cudaFree(m.pos));
				CHECK(cudaFree(m.seq));
			}
	}
	prompt_free(P);
}

/* Chunk by chunk, the backend's head_dim-128 kernels: one m-tile a warp
 * (w8s2b1k64), the wide variant (w8s2b1k64m2) and the wgmma kernel at one
 * and at two CTAs per SM (w2, w2m2). Which of the first two
 * prefill_wide_pays picks (the rule of a GPU without wgmma), and which of
 * the last two prefill_wgmma_pair picks: the prompt's time under each rule
 * against the fastest kernel at every chunk. */
static void routing(const shape &sh, int total, int chunk, int sms)
{
	typedef prefill_cfg<128, 8, 2, 1, 64> narrow_cfg;
	typedef prefill_cfg<128, 8, 2, 1, 64, 2> wide_cfg;
	enum { NARROW, WIDE, WG1, WG2, N_K };
	static const int kv[N_K] = { V_E, V_W8M2, V_WG2, V_WG2M2 };
	prompt P;
	double t_mma = 0, t_wgmma = 0, t_best = 0, t_all[N_K] = {};

	prompt_make(P, sh, total);
	for (int c = 0; c < total / chunk; c++) {
		segment g;
		gen_meta m = {};
		prefill_args a = {};
		float t[N_K], best = 1e30f;
		int pick_mma, pick_wgmma;

		segment_make(g, P, c * chunk, chunk);
		for (int k = 0; k < N_K; k++) {
			t[k] = lab_time([&] { launch_any(P, g, kv[k], m); }, 10, P.s);
			best = fminf(best, t[k]);
			t_all[k] += t[k];
		}
		a.n_rows = chunk;
		a.pos0 = c * chunk;
		a.group = sh.n_heads / sh.n_kv;
		pick_mma = prefill_wide_pays(a, sh.n_kv, sms, narrow_cfg::rows, wide_cfg::rows) ? WIDE
											 : NARROW;
		pick_wgmma = prefill_wgmma_pair(a, (int64_t)prefill_tiles(a, wgmma_cfg<2, 2, 1>::rows) *
							   sh.n_kv, sms)
				     ? WG2
				     : WG1;
		printf("  %2d/%d chunk %5d at %5d: narrow %7.3f  wide %7.3f  w2 %7.3f  w2m2 %7.3f ms  "
		       "picks %s (%+5.1f%% on mma.sync's pick)%s\n",
		       sh.n_heads, sh.n_kv, chunk, c * chunk, t[NARROW], t[WIDE], t[WG1], t[WG2],
		       pick_wgmma == WG2 ? "w2m2" : "w2  ", 100.0 * (t[pick_mma] / t[pick_wgmma] - 1.0),
		       t[pick_wgmma] > best * 1.02f ? "  (slower than the best)" : "");
		t_mma += t[pick_mma];
		t_wgmma += t[pick_wgmma];
		t_best += best;
		segment_free(g);
	}
	printf("  %2d/%d %d tokens in chunks of %d: wgmma rule %.3f ms, mma.sync rule %.3f, best "
	       "%.3f; all narrow %.3f, wide %.3f, w2 %.3f, w2m2 %.3f\n",
	       sh.n_heads, sh.n_kv, total, chunk, t_wgmma, t_mma, t_best, t_all[NARROW],
	       t_all[WIDE], t_all[WG1], t_all[WG2]);
	prompt_free(P);
}

/* One segment of n_rows after pos0 positions of history: check every row. */
static void single(const shape &sh, int pos0, int n_rows)
{
	prompt P;
	segment g;
	std::vector<int> rows;
	std::vector<lab_err> errs(N_VARIANTS);
	std::vector<gen_meta> meta(N_VARIANTS);
	char what[96];

	prompt_make(P, sh, pos0 + n_rows);
	segment_make(g, P, pos0, n_rows);
	for (int i = 0; i < n_rows; i++)
		rows.push_back(i);
	check(P, g, rows, errs, meta);
	snprintf(what, sizeof what, "%d/%d D%d, rows %d after %d", sh.n_heads, sh.n_kv, sh.D,
		 n_rows, pos0);
	report(what, errs, sh.D);
	segment_free(g);
	for (gen_meta &m : meta)
		if (m.pos) {
			CHECK(cudaFree(m.pos));
			CHECK(cudaFree(m.seq));
		}
	prompt_free(P);
}

int main(void)
{
	cudaDeviceProp prop;

	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
	printf("\n== correctness: single segments with history\n");
	single({ 10, 2, 64 }, 37, 50);   /* group 5: packed rows straddle tokens */
	single({ 4, 4, 128 }, 100, 300); /* MHA */
	single({ 32, 8, 128 }, 0, 1);    /* one row, one key */
	single({ 48, 3, 64 }, 5, 70);    /* group 16: a whole warp per token */
	printf("\n== Qwen3-8B prefill (32/8 heads, D 128, block 16)\n");
	chunked({ 32, 8, 128 }, 8192, 2048, false);
	chunked({ 32, 8, 128 }, 2048, 512, false);
	printf("\n== atlas-tiny prefill (8/4 heads, D 64)\n");
	chunked({ 8, 4, 64 }, 4096, 1024, false);
	printf("\n== routing a head_dim-128 segment: one m-tile a warp or two\n");
	routing({ 32, 8, 128 }, 8192, 2048, prop.multiProcessorCount);
	routing({ 32, 8, 128 }, 8192, 512, prop.multiProcessorCount);
	routing({ 32, 8, 128 }, 2048, 2048, prop.multiProcessorCount);
	routing({ 32, 8, 128 }, 2048, 512, prop.multiProcessorCount);
	routing({ 16, 8, 128 }, 8192, 2048, prop.multiProcessorCount);
	routing({ 16, 8, 128 }, 8192, 1024, prop.multiProcessorCount);
	routing({ 16, 8, 128 }, 2048, 2048, prop.multiProcessorCount);
	routing({ 16, 8, 128 }, 2048, 512, prop.multiProcessorCount);
	routing({ 40, 8, 128 }, 8192, 1024, prop.multiProcessorCount);
	routing({ 64, 8, 128 }, 4096, 1024, prop.multiProcessorCount);
	printf("\n== the wide and wgmma variants against their one-m-tile twins, bit for bit\n");
	for (int v = 0; v < N_VARIANTS; v++)
		if (same_bits_as(v) >= 0) {
			printf("  %-14s vs %-12s %lld values differ%s\n", vname[v],
			       vname[same_bits_as(v)], bit_diffs[v], bit_diffs[v] ? "  FAIL" : "");
			failures += bit_diffs[v] != 0;
		}
	printf("\n%s: %d check(s) failed\n", failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
