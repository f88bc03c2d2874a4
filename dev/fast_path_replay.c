// dev/fast_path_replay.c: the fast path's time in one training step, for a
// machine too busy for `bench` (dev/PERFORMANCE.md, "A machine shared by
// many"). One step of a bench config runs with lab/fast_path.c's four hooks
// wrapped; their calls are recorded (arguments: the model's own buffers),
// then each call is run again REPS times and its least time kept. A call
// lasts 0.1-5 ms, so the least of a few is one that no other process
// interrupted, where a whole step's 60 ms rarely is. Prints the sum, by hook.
// Before/after: build it against each tree (-I) and run the two in turn.
//   cc -O3 -march=native -ffp-contract=fast -fno-math-errno -std=c11 -fopenmp -I . -o /tmp/replay
//      dev/fast_path_replay.c -lm && OMP_NUM_THREADS=1 /tmp/replay toy 10
// Accumulating calls (the backward pass's +=) run REPS times more on the
// same buffers: the numbers grow, the time does not change. Nothing here is
// used by the build or the tests.
#define TRANSFORMER_NO_MAIN
#include "lab/lab.c"
// One recorded call: which hook (0 linear_forward, 1 linear_backward,
// 2 attention_forward, 3 attention_backward), its pointers and its integers.
typedef struct {
    int hook;
    real *p[9];
    int i[9];
    AttentionShape shape;   // the attention hooks' sizes
} Call;
static Call calls[4096];
static int ncalls, recording;
static __typeof__(fast_path) real_hooks;   // lab/fast_path.c's, which the recorders call
static void rec_lf(real *out, const real *inp, const real *weight, const real *bias, int N, int IC,
                   int OC) {
    if (recording) {
        Call call = { 0, { out, (real *)inp, (real *)weight, (real *)bias }, { N, IC, OC },
                      { 0 } };
        calls[ncalls] = call;
        ncalls++;
    }
    real_hooks.linear_forward(out, inp, weight, bias, N, IC, OC);
}
static void rec_lb(real *dinp, real *dweight, real *dbias, const real *dout, const real *inp,
                   const real *weight, int N, int IC, int OC) {
    if (recording) {
        Call call = { 1, { dinp, dweight, dbias, (real *)dout, (real *)inp, (real *)weight },
                      { N, IC, OC }, { 0 } };
        calls[ncalls] = call;
        ncalls++;
    }
    real_hooks.linear_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}
static void rec_af(real *out, real *att, const real *q, const real *k, const real *v,
                   const int *key_len, int causal, AttentionShape shape) {
    if (recording) {
        Call call = { 2, { out, att, (real *)q, (real *)k, (real *)v, (real *)key_len },
                      { causal }, shape };
        calls[ncalls] = call;
        ncalls++;
    }
    real_hooks.attention_forward(out, att, q, k, v, key_len, causal, shape);
}
static void rec_ab(real *dq, real *dk, real *dv, const real *dout, const real *att, const real *q,
                   const real *k, const real *v, AttentionShape shape) {
    if (recording) {
        Call call = { 3, { dq, dk, dv, (real *)dout, (real *)att, (real *)q, (real *)k,
                           (real *)v }, { 0 }, shape };
        calls[ncalls] = call;
        ncalls++;
    }
    real_hooks.attention_backward(dq, dk, dv, dout, att, q, k, v, shape);
}
static void replay(const Call *c) {
    const int *i = c->i;
    real *const *p = c->p;
    if (c->hook == 0)
        real_hooks.linear_forward(p[0], p[1], p[2], p[3], i[0], i[1], i[2]);
    if (c->hook == 1)
        real_hooks.linear_backward(p[0], p[1], p[2], p[3], p[4], p[5], i[0], i[1], i[2]);
    if (c->hook == 2)
        real_hooks.attention_forward(p[0], p[1], p[2], p[3], p[4], (const int *)p[5], i[0],
                                     c->shape);
    if (c->hook == 3)
        real_hooks.attention_backward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], c->shape);
}
int main(int argc, char **argv) {
    const char *config = argc > 1 ? argv[1] : "toy";
    int reps = argc > 2 ? atoi(argv[2]) : 30;
    const BenchPreset *p = NULL;
    for (int k = 0; k < NUM_BENCH_PRESETS; k++)
        if (strcmp(bench_presets[k].name, config) == 0)
            p = &bench_presets[k];
    if (!p)
        return 1;
    TransformerConfig c = transformer_default_config();
    c.n_layers = p->layers;
    c.d_model = p->d_model;
    c.d_ff = p->d_ff;
    c.n_heads = p->heads;
    c.vocab_size = p->vocab;
    c.dropout = 0.1f;
    c.label_smoothing = 0.1f;
    c.max_len = p->S > p->T ? p->S : p->T;
    fast_path_use(1);
    real_hooks = fast_path;
    fast_path.linear_forward = rec_lf;
    fast_path.linear_backward = rec_lb;
    fast_path.attention_forward = rec_af;
    fast_path.attention_backward = rec_ab;
    Transformer model;
    transformer_build(&model, &c, 1);
    int *tokens = checked_calloc((size_t)p->B * (p->S + 2 * p->T + 2), sizeof(int), "batch");
    Batch batch = bench_batch(tokens, p->B, p->S, p->T, c.vocab_size);
    for (int step = 0; step < 2; step++) {
        recording = step == 1;
        model.training = 1;
        transformer_forward(&model, &batch);
        transformer_zero_grad(&model);
        transformer_backward(&model, &batch);
    }
    double by_hook[4] = { 0 }, total = 0;
    for (int k = 0; k < ncalls; k++) {
        double best = 1e9;
        for (int r = 0; r < reps; r++) {
            double t0 = wall_seconds();
            replay(&calls[k]);
            double t = wall_seconds() - t0;
            if (t < best)
                best = t;
        }
        by_hook[calls[k].hook] += best;
        total += best;
    }
    printf("%s, %d threads, %d calls, least of %d each: fast path %.2f ms per step (linear forward "
           "%.2f, backward %.2f; attention forward %.2f, backward %.2f)\n",
           config, omp_get_max_threads(), ncalls, reps, total * 1e3, by_hook[0] * 1e3,
           by_hook[1] * 1e3, by_hook[2] * 1e3, by_hook[3] * 1e3);
    return 0;
}
