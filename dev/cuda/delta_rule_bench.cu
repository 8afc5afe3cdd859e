/* delta_rule_bench: the gated delta rule's kernels as the backend runs them
 * (kernels/cuda/cuda_delta_rule.cuh): the recurrent kernel (decode rows,
 * verify runs) and the chunked one (long segments).
 *
 * Checks (each against a float64 host reference of the recurrence, on the
 * heads it recomputes, and chunked against recurrent on every head):
 *  - shapes (dk, dv) = (128, 128), (64, 32), (32, 16), (16, 16), Hk 2, Hv 4:
 *    a segment of 200 rows (three full chunks and a partial one) starting at
 *    position 37 from a random state, and one at position 0 over a garbage
 *    state row (must start from zero);
 *  - Qwen3-Next (Hk 16, Hv 32, dk = dv = 128): 64 decode rows of distinct
 *    slots plus a verify run of 4 rows; an 8192-row segment, chunked vs
 *    recurrent (out and final state), heads 0 and 31 vs the reference.
 * Tolerance: max |got - ref| <= 2e-3 (out values are O(0.1), state O(1)).
 *
 * Timing (Qwen3-Next shapes): the recurrent kernel for T = 1, 2, 4, 8, 16,
 * 32, 64 decode rows (one row per sequence; µs from a replayed graph, and
 * the state bytes read + written per µs), then the 8192-row segment with
 * the chunked kernel and with the recurrent one (ms).
 *
 * Build (from the repository root; H100/H200):
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I. dev/cuda/delta_rule_bench.cu -o /tmp/delta_rule_bench
 * Run: /tmp/delta_rule_bench     exits non-zero when a check fails
 */
#include "dev/cuda/lab.cuh"
#include "kernels/cuda/cuda_delta_rule.cuh"

#define TOL 2e-3

/* One problem: T rows, the state of n_slots sequences, on host and device. */
struct prob {
	int Hk, Hv, dk, dv, T, n_slots;
	int64_t qkv_cols, F;
	std::vector<float> qkv, ba, a_log, dt_bias, state;
	std::vector<int32_t> slot, pos;
	float *qkv_d, *ba_d, *a_log_d, *dt_bias_d, *state_d, *out_d;
	int32_t *slot_d, *pos_d;
	unsigned *fault_d;
};

static prob make_prob(int Hk, int Hv, int dk, int dv, int T, int n_slots)
{
	prob p;

	p.Hk = Hk, p.Hv = Hv, p.dk = dk, p.dv = dv, p.T = T, p.n_slots = n_slots;
	p.qkv_cols = 2 * (int64_t)Hk * dk + (int64_t)Hv * dv;
	p.F = 16 + (int64_t)Hv * dk * dv; /* off 16: a conv state in front */
	p.qkv.resize((size_t)T * p.qkv_cols);
	p.ba.resize((size_t)T * 2 * Hv);
	p.a_log.resize(Hv);
	p.dt_bias.resize(Hv);
	p.state.resize((size_t)n_slots * p.F);
	for (auto &x : p.qkv)
		x = lab_uniform();
	for (auto &x : p.ba)
		x = 2.0f * lab_uniform();
	for (auto &x : p.a_log)
		x = lab_uniform();
	for (auto &x : p.dt_bias)
		x = lab_uniform();
	for (auto &x : p.state)
		x = 0.5f * lab_uniform();
	p.slot.assign(T, 0);
	p.pos.assign(T, 0);
	return p;
}

static void upload(prob &p)
{
	p.qkv_d = lab_upload(p.qkv);
	p.ba_d = lab_upload(p.ba);
	p.a_log_d = lab_upload(p.a_log);
	p.dt_bias_d = lab_upload(p.dt_bias);
	p.state_d = lab_upload(p.state);
	p.slot_d = lab_upload(p.slot);
	p.pos_d = lab_upload(p.pos);
	CHECK(cudaMalloc(&p.out_d, (size_t)p.T * p.Hv * p.dv * sizeof(float)));
	CHECK(cudaMalloc(&p.fault_d, sizeof(unsigned)));
	CHECK(cudaMemset(p.fault_d, 0, sizeof(unsigned)));
}

static void reset_state(prob &p)
{
	CHECK(cudaMemcpy(p.state_d, p.state.data(), p.state.size() * sizeof(float),
			 cudaMemcpyHostToDevice));
	CHECK(cudaMemset(p.out_d, 0xff, (size_t)p.T * p.Hv * p.dv * sizeof(float)));
}

static dr_args args_of(const prob &p, int r0, int r1)
{
	dr_args a;

	a.out = p.out_d, a.qkv = p.qkv_d, a.ba = p.ba_d, a.a_log = p.a_log_d;
	a.dt_bias = p.dt_bias_d, a.state = p.state_d, a.slot = p.slot_d, a.pos = p.pos_d;
	a.qkv_cols = p.qkv_cols, a.out_cols = (int64_t)p.Hv * p.dv, a.F = p.F, a.off = 16;
	a.n_slots = p.n_slots, a.Hk = p.Hk, a.Hv = p.Hv, a.dv = p.dv, a.r0 = r0, a.r1 = r1;
	a.fault = p.fault_d;
	return a;
}

template <int DK, int BV> static void run_rec(const prob &p, int r0, int r1, cudaStream_t s)
{
	const dim3 grid((unsigned)(r1 - r0), (unsigned)p.Hv, (unsigned)(p.dv / BV));

	dr_recurrent_kernel<DK, BV><<<grid, BV * DR_REC_P(DK, BV), 0, s>>>(args_of(p, r0, r1));
	CHECK_LAUNCH();
}

template <int DK, int BV> static void run_chunk(const prob &p, int r0, int n, cudaStream_t s)
{
	const size_t smem = sizeof(float) * DR_CHUNK_FLOATS(DK, BV);

	CHECK(cudaFuncSetAttribute(dr_chunk_kernel<DK, BV>,
				   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	dr_chunk_kernel<DK, BV><<<dim3(p.Hv, p.dv / BV), DR_CHUNK_THREADS, smem, s>>>(
		args_of(p, r0, r0 + n), r0, n);
	CHECK_LAUNCH();
}

/* The float64 recurrence of head h over rows [t0, t1) (one run): out rows
 * [t1 - t0, dv] and the final state [dk, dv]. */
static void reference(const prob &p, int h, int t0, int t1, std::vector<double> &out,
		      std::vector<double> &S)
{
	const int dk = p.dk, dv = p.dv, hk = h / (p.Hv / p.Hk);
	const float *s0 = p.state.data() + (size_t)p.slot[t0] * p.F + 16 + (size_t)h * dk * dv;
	std::vector<double> q(dk), k(dk);

	S.assign((size_t)dk * dv, 0.0);
	if (p.pos[t0] != 0)
		for (int e = 0; e < dk * dv; e++)
			S[e] = s0[e];
	out.assign((size_t)(t1 - t0) * dv, 0.0);
	for (int t = t0; t < t1; t++) {
		const float *row = p.qkv.data() + (size_t)t * p.qkv_cols;
		double ssq = 0, ssk = 0, b = p.ba[(size_t)t * 2 * p.Hv + h];
		double x = p.ba[(size_t)t * 2 * p.Hv + p.Hv + h] + (double)p.dt_bias[h];
		double beta = 1.0 / (1.0 + exp(-b)), g, decay;

		g = -exp((double)p.a_log[h]) * (x > 20 ? x : log1p(exp(x)));
		decay = exp(g);
		for (int i = 0; i < dk; i++) {
			q[i] = row[hk * dk + i];
			k[i] = row[(p.Hk + hk) * dk + i];
			ssq += q[i] * q[i];
			ssk += k[i] * k[i];
		}
		for (int i = 0; i < dk; i++) {
			q[i] /= sqrt(ssq + 1e-6) * sqrt((double)dk);
			k[i] /= sqrt(ssk + 1e-6);
		}
		for (int j = 0; j < dv; j++) {
			double kv = 0, o = 0, d;

			for (int i = 0; i < dk; i++)
				kv += (S[(size_t)i * dv + j] *= decay) * k[i];
			d = beta * (row[2 * p.Hk * dk + h * dv + j] - kv);
			for (int i = 0; i < dk; i++)
				o += (S[(size_t)i * dv + j] += k[i] * d) * q[i];
			out[(size_t)(t - t0) * dv + j] = o;
		}
	}
}

static std::vector<float> download(const float *d, size_t n)
{
	std::vector<float> h(n);

	CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
	return h;
}

static int failures;

static void verdict(const char *what, const lab_err &e, const prob &p)
{
	unsigned f = 0;

	CHECK(cudaMemcpy(&f, p.fault_d, sizeof f, cudaMemcpyDeviceToHost));
	printf("%-60s max_abs %.3g rel_l2 %.3g%s%s\n", what, e.max_abs, e.rel(),
	       f ? " FAULT" : "", e.ok(TOL) && !f ? "" : "  FAIL");
	failures += !(e.ok(TOL) && !f);
}

/* Rows [t0, t1) of one sequence in slot 1 at positions pos0..: the chunked
 * kernel (or the recurrent one) against the reference on heads `heads`. */
template <int DK, int BV>
static void check_segment(prob &p, int t0, int t1, int pos0, bool chunk,
			  const std::vector<int> &heads, const char *name)
{
	std::vector<double> ro, rs;
	lab_err eo, es;
	char what[128];

	for (int t = t0; t < t1; t++)
		p.slot[t] = 1, p.pos[t] = pos0 + t - t0;
	CHECK(cudaMemcpy(p.slot_d, p.slot.data(), p.T * 4, cudaMemcpyHostToDevice));
	CHECK(cudaMemcpy(p.pos_d, p.pos.data(), p.T * 4, cudaMemcpyHostToDevice));
	reset_state(p);
	if (chunk)
		run_chunk<DK, BV>(p, t0, t1 - t0, 0);
	else
		run_rec<DK, BV>(p, t0, t1, 0);
	CHECK(cudaDeviceSynchronize());
	std::vector<float> out = download(p.out_d, (size_t)p.T * p.Hv * p.dv);
	std::vector<float> st = download(p.state_d, p.state.size());
	for (int h : heads) {
		reference(p, h, t0, t1, ro, rs);
		for (int t = t0; t < t1; t++)
			for (int j = 0; j < p.dv; j++)
				eo.add(out[((size_t)t * p.Hv + h) * p.dv + j],
				       ro[(size_t)(t - t0) * p.dv + j]);
		for (int e = 0; e < p.dk * p.dv; e++)
			es.add(st[(size_t)p.F + 16 + (size_t)h * p.dk * p.dv + e], rs[e]);
	}
	snprintf(what, sizeof what, "%s %s dk %d dv %d rows %d pos0 %d: out", name,
		 chunk ? "chunked" : "recurrent", p.dk, p.dv, t1 - t0, pos0);
	verdict(what, eo, p);
	snprintf(what, sizeof what, "%s %s dk %d dv %d rows %d pos0 %d: state", name,
		 chunk ? "chunked" : "recurrent", p.dk, p.dv, t1 - t0, pos0);
	verdict(what, es, p);
}

template <int DK, int DV> static void check_shape(void)
{
	constexpr int BV = DV < 32 ? DV : 32;
	prob p = make_prob(2, 4, DK, DV, 200, 3);

	upload(p);
	check_segment<DK, BV>(p, 0, 200, 37, true, { 0, 1, 2, 3 }, "small");
	check_segment<DK, BV>(p, 0, 200, 0, true, { 0, 1, 2, 3 }, "small");
	check_segment<DK, BV>(p, 0, 200, 37, false, { 0, 1, 2, 3 }, "small");
}

int main(void)
{
	cudaStream_t s;

	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	check_shape<128, 128>();
	check_shape<64, 32>();
	check_shape<32, 16>();
	check_shape<16, 16>();

	/* Qwen3-Next decode: 64 rows of 64 slots, then a verify run of 4 in slot 64. */
	{
		prob p = make_prob(16, 32, 128, 128, 68, 65);
		lab_err e;

		for (int t = 0; t < 64; t++)
			p.slot[t] = 63 - t, p.pos[t] = 100 + t;
		for (int t = 64; t < 68; t++)
			p.slot[t] = 64, p.pos[t] = 500 + t;
		upload(p);
		reset_state(p);
		run_rec<128, 32>(p, 0, 68, 0);
		CHECK(cudaDeviceSynchronize());
		std::vector<float> out = download(p.out_d, (size_t)68 * 32 * 128);
		std::vector<double> ro, rs;
		for (int h : { 0, 17, 31 })
			for (int t0 : { 0, 5, 63, 64 }) {
				const int t1 = t0 == 64 ? 68 : t0 + 1;

				reference(p, h, t0, t1, ro, rs);
				for (int t = t0; t < t1; t++)
					for (int j = 0; j < 128; j++)
						e.add(out[((size_t)t * 32 + h) * 128 + j],
						      ro[(size_t)(t - t0) * 128 + j]);
			}
		verdict("qwen3-next decode 64 rows + verify run of 4: out", e, p);

		printf("\nrecurrent decode, Hk 16 Hv 32 dk dv 128 (graph replay)\n");
		for (int T : { 1, 2, 4, 8, 16, 32, 64 }) {
			const double bytes = 2.0 * T * 32 * 128 * 128 * 4;
			float us = lab_time_graph_us([&] { run_rec<128, 32>(p, 0, T, s); }, 20, 10, s);

			printf("  T %3d  %8.2f us  %7.1f GB/s state\n", T, us, bytes / us * 1e-3);
		}
	}

	/* Qwen3-Next prefill: one 8192-row segment. */
	{
		const int T = 8192;
		prob p = make_prob(16, 32, 128, 128, T, 2);
		std::vector<float> oc, sc, orr, sr;
		lab_err eo, es;
		float ms_c, ms_r;

		for (int t = 0; t < T; t++)
			p.slot[t] = 1, p.pos[t] = 1000 + t;
		upload(p);
		check_segment<128, 32>(p, 0, T, 1000, true, { 0, 31 }, "qwen3-next 8K");
		reset_state(p);
		run_chunk<128, 32>(p, 0, T, 0);
		CHECK(cudaDeviceSynchronize());
		oc = download(p.out_d, (size_t)T * 32 * 128);
		sc = download(p.state_d, p.state.size());
		reset_state(p);
		run_rec<128, 32>(p, 0, T, 0);
		CHECK(cudaDeviceSynchronize());
		orr = download(p.out_d, (size_t)T * 32 * 128);
		sr = download(p.state_d, p.state.size());
		for (size_t i = 0; i < oc.size(); i++)
			eo.add(oc[i], orr[i]);
		for (size_t i = 0; i < sc.size(); i++)
			es.add(sc[i], sr[i]);
		verdict("qwen3-next 8K chunked vs recurrent, all heads: out", eo, p);
		verdict("qwen3-next 8K chunked vs recurrent, all heads: state", es, p);
		ms_c = lab_time([&] { run_chunk<128, 32>(p, 0, T, s); }, 5, s);
		ms_r = lab_time([&] { run_rec<128, 32>(p, 0, T, s); }, 3, s);
		printf("\nsegment of %d rows: chunked %.3f ms, recurrent %.3f ms\n", T, ms_c, ms_r);
	}
	printf("%s\n", failures ? "FAILED" : "all checks passed");
	return failures ? 1 : 0;
}
