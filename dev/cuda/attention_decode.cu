/* Decode attention lab: the split-K tensor-core decode kernel of
 * kernels/cuda/cuda_attention_decode.cuh (ring depths 2, 3, 4; without
 * splits at depths 2 and 3; splits of at least 64 (the backend's), 128 or
 * 256 keys) and the
 * generic kernel it replaced, on paged bf16 caches with shuffled block
 * tables, against a float64 CPU reference.
 *
 * Timing: each point's launches are captured n times in a CUDA graph and
 * replayed (the engine replays decode steps from graphs), so host launch
 * gaps stay out; the median replay over n.
 * Sweep: the Qwen3-8B shape (32 q heads, 8 kv heads, head_dim 128, block
 * 16), batch 1..64, every row at the same length 256..32768, with block ids
 * shuffled over the whole pool (the worst case for the TLB) and consecutive
 * within each sequence (a fresh allocator's case). GB/s counts the K and V
 * bytes a step must read (Σ len · n_kv · D · 2 · 2 B).
 * Checks: two rows of every sweep point, plus ragged batches (lengths from 1
 * up to max_kv_len, which the launch is planned for) for head_dim 64 and 128,
 * MHA and a GQA group of 32 (two head chunks).
 *
 * Build and run: see dev/cuda/README.md.
 */
#include "lab.cuh"

#include "kernels/cuda/cuda_attention_decode.cuh"
#include "kernels/cuda/cuda_attention_generic.cuh"

#define MAX_ROWS 64
#define MAX_LEN 32768
#define BS 16
#define WS_ROWS 512 /* row-splits per head in the workspace (as the backend sizes it) */

static const uint64_t SEED_K = 11, SEED_V = 22;

/* Device state shared by every case: caches big enough for MAX_ROWS rows of
 * MAX_LEN keys at 1024 cache columns, one block-table row per slot. */
struct lab {
	__nv_bfloat16 *kc, *vc;
	int64_t cache_elems;
	int32_t *bt[2];                /* [MAX_ROWS, MAX_LEN / BS]: scattered, contiguous */
	std::vector<int32_t> table[2]; /* host copies */
	float *part_o;
	float2 *part_ml;
	int *count;
	unsigned *fault;
	int n_sms;
	cudaStream_t s;
};

struct shape {
	int n_heads, n_kv, D;
};

struct step {
	shape sh;
	int layout; /* block table: 0 scattered (shuffled ids), 1 contiguous per sequence */
	int rows, max_kv_len;
	std::vector<int32_t> pos, seq;
	std::vector<float> q; /* [rows, n_heads * D] */
	float *dq, *dout;
	int32_t *dpos, *dseq;
};

static void step_make(step &st, const shape &sh, const std::vector<int> &lens, int max_kv_len,
		      int layout)
{
	st.sh = sh;
	st.layout = layout;
	st.rows = (int)lens.size();
	st.max_kv_len = max_kv_len;
	st.pos.resize(st.rows);
	st.seq.resize(st.rows);
	for (int r = 0; r < st.rows; r++) {
		st.pos[r] = lens[r] - 1;
		st.seq[r] = r;
	}
	st.q.resize((size_t)st.rows * sh.n_heads * sh.D);
	for (float &x : st.q)
		x = 2.0f * lab_uniform();
	st.dq = lab_upload(st.q);
	st.dpos = lab_upload(st.pos);
	st.dseq = lab_upload(st.seq);
	CHECK(cudaMalloc(&st.dout, st.q.size() * sizeof(float)));
}

static void step_free(step &st)
{
	CHECK(cudaFree(st.dq));
	CHECK(cudaFree(st.dout));
	CHECK(cudaFree(st.dpos));
	CHECK(cudaFree(st.dseq));
}

static paged_kv kv_of(const lab &L, const step &st)
{
	paged_kv kv;

	kv.pos = st.dpos;
	kv.seq = st.dseq;
	kv.bt = L.bt[st.layout];
	kv.bt_rows = MAX_ROWS;
	kv.bt_cols = MAX_LEN / BS;
	kv.row_len = (int64_t)st.sh.n_kv * st.sh.D;
	kv.n_blocks = L.cache_elems / kv.row_len / BS;
	kv.bs = BS;
	kv.block_rows = BS;
	return kv;
}

/* Cache row of position j of step row t. */
static int64_t cache_row_of(const lab &L, const step &st, int t, int j)
{
	return (int64_t)L.table[st.layout][st.seq[t] * (MAX_LEN / BS) + j / BS] * BS + j % BS;
}

/* float64 reference of rows `which`, all heads: ref [rows, n_heads * D]. */
static void reference(const lab &L, const step &st, const std::vector<int> &which,
		      std::vector<double> &ref)
{
	const shape &sh = st.sh;
	const int g = sh.n_heads / sh.n_kv, D = sh.D;
	const int64_t row_len = (int64_t)sh.n_kv * D;
	const double scale = 1.0 / sqrt((double)D);

	ref.assign(st.q.size(), 0.0);
#pragma omp parallel for schedule(dynamic, 1)
	for (int it = 0; it < (int)which.size() * sh.n_kv; it++) {
		const int t = which[it / sh.n_kv], kvh = it % sh.n_kv, n = st.pos[t] + 1;
		std::vector<double> sc((size_t)g * n), kv(D);

		for (int j = 0; j < n; j++) {
			const int64_t row = cache_row_of(L, st, t, j);

			for (int d = 0; d < D; d++)
				kv[d] = lab_bf16(lab_val(row * row_len + kvh * D + d, SEED_K));
			for (int h = 0; h < g; h++) {
				const float *q = &st.q[((size_t)t * sh.n_heads + kvh * g + h) * D];
				double s = 0;

				for (int d = 0; d < D; d++)
					s += (double)q[d] * kv[d];
				sc[(size_t)h * n + j] = s * scale;
			}
		}
		for (int h = 0; h < g; h++) {
			double m = -INFINITY, sum = 0;

			for (int j = 0; j < n; j++)
				m = std::max(m, sc[(size_t)h * n + j]);
			for (int j = 0; j < n; j++)
				sum += sc[(size_t)h * n + j] = exp(sc[(size_t)h * n + j] - m);
			for (int j = 0; j < n; j++)
				sc[(size_t)h * n + j] /= sum;
		}
		for (int j = 0; j < n; j++) {
			const int64_t row = cache_row_of(L, st, t, j);

			for (int d = 0; d < D; d++)
				kv[d] = lab_bf16(lab_val(row * row_len + kvh * D + d, SEED_V));
			for (int h = 0; h < g; h++) {
				double *o = &ref[((size_t)t * sh.n_heads + kvh * g + h) * D];

				for (int d = 0; d < D; d++)
					o[d] += sc[(size_t)h * n + j] * kv[d];
			}
		}
	}
}

/* min N: splits of at least N keys (the backend uses decode_min_chunk) */
enum variant {
	V_SPLIT2, V_SPLIT3, V_SPLIT4, V_NOSPLIT3, V_MIN256, V_MIN128, V_NOSPLIT2, V_GENERIC,
	N_VARIANTS
};
static const char *vname[N_VARIANTS] = { "tc ring2", "tc ring3", "tc ring4", "tc ring3 1split",
					 "tc ring3 min256", "tc ring3 min128", "tc ring2 1split",
					 "generic" };

template <int D, int STAGES>
static void launch_tc(const lab &L, const step &st, bool split, decode_plan *plan_out,
		      int min_chunk = 0)
{
	static int slots;
	decode_args a;
	decode_plan p;

	if (!slots) {
		CHECK((decode_setup<D, STAGES>()));
		slots = decode_slots<D, STAGES>(L.n_sms);
	}
	p = decode_plan_make(st.rows, st.sh.n_heads / st.sh.n_kv, st.sh.n_kv, st.max_kv_len,
			     slots, split ? WS_ROWS : st.rows,
			     min_chunk ? min_chunk : decode_min_chunk(st.rows));
	a.out = { st.dout, false };
	a.q = st.dq;
	a.kc = L.kc;
	a.vc = L.vc;
	a.kv = kv_of(L, st);
	a.n_heads = st.sh.n_heads;
	a.group = st.sh.n_heads / st.sh.n_kv;
	a.head_chunks = p.head_chunks;
	a.max_pos = st.max_kv_len - 1;
	a.chunk = p.chunk;
	a.splits = p.splits;
	a.sl2 = ATT_LOG2E / sqrtf((float)D);
	a.part_o = L.part_o;
	a.part_ml = L.part_ml;
	a.count = L.count;
	a.fault = L.fault;
	decode_launch<D, STAGES>(false, a, st.rows, st.sh.n_kv, L.s);
	if (plan_out)
		*plan_out = p;
}

template <int D> static void launch_generic(const lab &L, const step &st)
{
	gen_args<__nv_bfloat16> a;

	a.out = { st.dout, false };
	a.q = st.dq;
	a.kc = L.kc;
	a.vc = L.vc;
	a.kv = kv_of(L, st);
	a.n_heads = st.sh.n_heads;
	a.group = st.sh.n_heads / st.sh.n_kv;
	a.D = D;
	a.max_pos = MAX_LEN - 1;
	a.scale = 1.0f / sqrtf((float)D);
	a.vec4 = false;
	a.fault = L.fault;
	gen_launch(a, (unsigned)(st.rows * st.sh.n_heads), L.s);
}

template <int D>
static void launch(const lab &L, const step &st, int v, decode_plan *p)
{
	switch (v) {
	case V_SPLIT2: launch_tc<D, 2>(L, st, true, p); break;
	case V_SPLIT3: launch_tc<D, 3>(L, st, true, p); break;
	case V_SPLIT4: launch_tc<D, 4>(L, st, true, p); break;
	case V_NOSPLIT3: launch_tc<D, 3>(L, st, false, p); break;
	case V_MIN256: launch_tc<D, 3>(L, st, true, p, 256); break;
	case V_MIN128: launch_tc<D, 3>(L, st, true, p, 128); break;
	case V_NOSPLIT2: launch_tc<D, 2>(L, st, false, p); break;
	default: launch_generic<D>(L, st); break;
	}
	CHECK_LAUNCH();
}

static void launch_any(const lab &L, const step &st, int v, decode_plan *p)
{
	if (st.sh.D == 64)
		launch<64>(L, st, v, p);
	else
		launch<128>(L, st, v, p);
}

/* Run variant v once over poisoned output and compare rows `which` with ref. */
static lab_err check(const lab &L, const step &st, int v, const std::vector<int> &which,
		     const std::vector<double> &ref)
{
	std::vector<float> out(st.q.size());
	unsigned fault = 0;
	lab_err e;

	CHECK(cudaMemset(st.dout, 0xff, out.size() * 4));
	CHECK(cudaMemset(L.fault, 0, 4));
	launch_any(L, st, v, NULL);
	CHECK(cudaStreamSynchronize(L.s));
	CHECK(cudaMemcpy(out.data(), st.dout, out.size() * 4, cudaMemcpyDeviceToHost));
	CHECK(cudaMemcpy(&fault, L.fault, 4, cudaMemcpyDeviceToHost));
	for (int t : which)
		for (size_t i = 0; i < (size_t)st.sh.n_heads * st.sh.D; i++)
			e.add(out[(size_t)t * st.sh.n_heads * st.sh.D + i],
			      ref[(size_t)t * st.sh.n_heads * st.sh.D + i]);
	if (fault)
		e.bad++;
	return e;
}

static int failures;

static void report_check(const char *what, int v, const lab_err &e)
{
	const bool ok = e.ok(2e-2);

	printf("  check %-34s %-16s max_abs %.2e rel_l2 %.2e%s\n", what, vname[v], e.max_abs,
	       e.rel(), ok ? "" : "  FAIL");
	failures += !ok;
}

static void ragged(lab &L, const shape &sh, int rows, int max_kv_len, const char *what)
{
	static const int picks[] = { 1, 2, 15, 16, 17, 63, 64, 65, 255, 256, 257, 511, 1000, 2049 };
	std::vector<int> lens, which;
	std::vector<double> ref;
	step st;

	for (int r = 0; r < rows; r++) {
		const int n_picks = (int)(sizeof picks / sizeof *picks);
		int n = r < n_picks ? picks[r] : 1 + (int)(lab_next() % max_kv_len);

		lens.push_back(std::min(n, max_kv_len));
		which.push_back(r);
	}
	lens[rows - 1] = max_kv_len;
	step_make(st, sh, lens, max_kv_len, 0);
	reference(L, st, which, ref);
	for (int v = 0; v < N_VARIANTS; v++)
		report_check(what, v, check(L, st, v, which, ref));
	step_free(st);
}

/* Variants vs of one point; layout picks the block table; the launch is
 * planned for `planned` keys (0: len), as a graph's is for its bucket. */
static void sweep_point(lab &L, int rows, int len, int layout, const std::vector<int> &vs,
			int planned = 0, shape sh = { 32, 8, 128 })
{
	std::vector<int> lens(rows, len), which = { 0 };
	std::vector<double> ref;
	const double bytes = (double)rows * len * sh.n_kv * sh.D * 2 * 2;
	char what[64];
	step st;

	if (rows > 1)
		which.push_back(rows - 1);
	step_make(st, sh, lens, planned ? planned : len, layout);
	reference(L, st, which, ref);
	if (planned)
		snprintf(what, sizeof what, "%d/%d b%d len %d/%d", sh.n_heads, sh.n_kv, rows, len,
			 planned);
	else
		snprintf(what, sizeof what, "batch %d len %d", rows, len);
	printf("%-22s", what);
	for (int v : vs) {
		decode_plan p = { 1, 0, 1 };
		lab_err e;
		float us;

		if (v == V_GENERIC && (double)rows * len > 65536.0) {
			printf(" | %-15s       -", vname[v]);
			continue;
		}
		e = check(L, st, v, which, ref);
		if (!e.ok(2e-2)) {
			printf("\n");
			report_check(what, v, e);
		}
		us = lab_time_graph_us([&] { launch_any(L, st, v, &p); },
				       std::max(1, std::min(50, (int)(5e8 / bytes))), 10, L.s);
		printf(" | %-8s %2dsp %6.1fus %4.0fGB/s", vname[v], v == V_GENERIC ? 0 : p.splits,
		       us, bytes / (us * 1e-6) / 1e9);
	}
	printf("\n");
	step_free(st);
}

static void copy_bandwidth(void)
{
	const size_t n = (size_t)2 << 30;
	void *a, *b;
	cudaStream_t s0 = 0;
	float ms;

	CHECK(cudaMalloc(&a, n));
	CHECK(cudaMalloc(&b, n));
	CHECK(cudaMemset(a, 1, n));
	ms = lab_time([&] { CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s0)); }, 10,
		      s0);
	printf("device copy 2 GiB: %.3f ms, %.0f GB/s (read + write)\n", ms,
	       2.0 * n / (ms * 1e-3) / 1e9);
	CHECK(cudaFree(a));
	CHECK(cudaFree(b));
}

int main(int argc, char **argv)
{
	const bool short_only = argc > 1 && !strcmp(argv[1], "short");
	cudaDeviceProp prop;
	lab L;
	const int bt_cols = MAX_LEN / BS;
	const int64_t n_blocks = (int64_t)MAX_ROWS * bt_cols;
	std::vector<int32_t> perm(n_blocks);

	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("device %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
	       prop.l2CacheSize >> 20);
	copy_bandwidth();
	L.n_sms = prop.multiProcessorCount;
	CHECK(cudaStreamCreateWithFlags(&L.s, cudaStreamNonBlocking));
	L.cache_elems = n_blocks * BS * 1024;
	CHECK(cudaMalloc(&L.kc, L.cache_elems * 2));
	CHECK(cudaMalloc(&L.vc, L.cache_elems * 2));
	lab_fill(L.kc, L.cache_elems, SEED_K);
	lab_fill(L.vc, L.cache_elems, SEED_V);
	for (int64_t i = 0; i < n_blocks; i++)
		perm[i] = (int32_t)i;
	L.table[1] = perm; /* slot s owns entries [s * bt_cols, (s + 1) * bt_cols) */
	lab_shuffle(perm);
	L.table[0] = perm;
	L.bt[0] = lab_upload(L.table[0]);
	L.bt[1] = lab_upload(L.table[1]);
	CHECK(cudaMalloc(&L.part_o, (size_t)WS_ROWS * 64 * 128 * 4));
	CHECK(cudaMalloc(&L.part_ml, (size_t)WS_ROWS * 64 * 8));
	CHECK(cudaMalloc(&L.count, (size_t)WS_ROWS * 64 * 4));
	CHECK(cudaMemset(L.count, 0, (size_t)WS_ROWS * 64 * 4));
	CHECK(cudaMalloc(&L.fault, 4));
	CHECK(cudaDeviceSynchronize());

	if (argc == 5 && !strcmp(argv[1], "one")) {
		/* one ROWS LEN PLANNED: the backend's variant on one point, for a profiler */
		sweep_point(L, atoi(argv[2]), atoi(argv[3]), 1, { V_SPLIT3 }, atoi(argv[4]));
		return failures ? 1 : 0;
	}
	printf("\n== correctness: ragged batches (lengths 1..max_kv_len, planned for "
	       "max_kv_len)\n");
	ragged(L, { 32, 8, 128 }, 20, 4096, "32/8 D128 20 rows <=4096");
	ragged(L, { 8, 4, 64 }, 16, 3000, "8/4 D64 16 rows <=3000");
	ragged(L, { 8, 8, 64 }, 6, 700, "MHA 8/8 D64 6 rows <=700");
	ragged(L, { 32, 1, 128 }, 4, 1500, "32/1 D128 (2 head chunks)");
	ragged(L, { 10, 2, 64 }, 5, 9000, "10/2 D64 (group 5) <=9000");

	/* The engine's decode graphs are planned for their KV bucket (256 keys
	 * and up, doubling) while the rows hold fewer: the short contexts of a
	 * chat's first tokens and of atlas bench's decode rows. */
	printf("\n== short rows in a graph planned for 256 keys (Qwen3-8B 32/8 and "
	       "Qwen3-0.6B 16/8 heads, D 128)\n");
	for (shape sh : { shape{ 32, 8, 128 }, shape{ 16, 8, 128 } })
		for (int rows : { 1, 8, 64 })
			for (int len : { 24, 80, 140 })
				sweep_point(L, rows, len, 1,
					    { V_SPLIT3, V_NOSPLIT3, V_SPLIT2, V_NOSPLIT2 },
					    256, sh);
	printf("\n   longer rows, planned for their length (Qwen3-8B)\n");
	for (int rows : { 1, 8, 32, 64 })
		for (int len : { 512, 1024, 4096 })
			sweep_point(L, rows, len, 1,
				    { V_SPLIT3, V_NOSPLIT3, V_SPLIT2, V_NOSPLIT2 });
	if (short_only) {
		printf("\n%s: %d check(s) failed\n", failures ? "FAIL" : "ok", failures);
		return failures ? 1 : 0;
	}

	printf("\n== sweep: Qwen3-8B decode (32/8 heads, D 128, block 16), us per step "
	       "(graph replay) and K+V GB/s\n"
	       "   block ids shuffled over the whole 8.6 GB pool\n");
	for (int rows : { 1, 8, 32, 64 })
		for (int len : { 256, 1024, 4096, 16384, 32768 })
			sweep_point(L, rows, len, 0,
				    { V_SPLIT2, V_SPLIT3, V_NOSPLIT3, V_MIN256, V_MIN128,
				      V_GENERIC });
	printf("\n   block ids consecutive within each sequence\n");
	for (int rows : { 1, 8, 32, 64 })
		for (int len : { 256, 1024, 4096, 16384, 32768 })
			sweep_point(L, rows, len, 1, { V_SPLIT3 });
	printf("\n%s: %d check(s) failed\n", failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
