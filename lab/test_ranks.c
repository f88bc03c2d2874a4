/* lab/test_ranks.c: the proofs of data-parallel training (lab/ranks.c), `mpirun -np N
 * ./transformer train`, run as a user runs it
 *
 * Included by lab/test_lab.c; make test runs them once, in ./test_lab_f64, where MPI was built
 * in (make's MPI=1) and Open MPI's mpirun is on the PATH, else one line says why not. They set
 * OMPI_ALLOW_RUN_AS_ROOT and run mpirun with --oversubscribe (more ranks than cores), -q
 * (without Open MPI's own notes) and its shared-memory transport. The double program is this
 * binary itself: `./test_lab_f64 --lab train ...` runs the lab's command line (test_lab.c's
 * main). A tiny model (1 layer, d_model 16), a few steps each:
 *   - each rank's share: the target tokens each rank trained on (train's last line) are about
 *     1/N of the batches', and sum to them (a rank that trained on the whole batch fails it);
 *   - -np 2 and -np 3 (batches of 3 or 4 sentences: shares of 1, 2, none) against -np 1 on the
 *     same batches, dropout off, in double: the loss of every step within the bound of a sum in
 *     another order, the parameters after 20 steps within dev/FORMATS.md's per-step Adam bound;
 *     in float, the gradient of the first step (Adam's m) within FORMATS's gradient tolerance;
 *   - -np 1 repeats ./transformer bit for bit, dropout on; two -np 2 runs with dropout give one
 *     checkpoint, bit for bit;
 *   - a run resumed at another N: the same batches (--batch-log, byte for byte), the same rates
 *     and, within the bound, the same losses as the unbroken run;
 *   - faults: ranks given other options, data or checkpoints stop before any step with one line
 *     naming what differs; bad input one rank alone sees, and rank 0's full disk (a file-size
 *     limit) mid-run, end every rank with one line and exit 1, the last checkpoint as it was;
 *     a rank killed (kill -9) leaves a checkpoint that loads and resumes.
 * The CUDA companion's NCCL path on the emulator: cuda/test_cuda.c.
 */
#include <sys/wait.h>   // waitpid: the run whose rank test_killed_rank kills

#define RANK_RUN "--task copy --layers 1 --d-model 16 --d-ff 32 --heads 2 --warmup 5 " \
                 "--train-size 200 --valid-size 20 --eval-size 20 --log-every 0 --eval-every 0 " \
                 "--show 0 --force"
// (FORMATS.md, "How the test compares": the gradients of another summation order, relative to
// each tensor's largest, in float and in double)
#define RANK_GRADIENT_TOL_FLOAT 8e-6
#define RANK_GRADIENT_TOL_DOUBLE 2e-14
#define ADAM_RHO_MOST 1.7   // FORMATS.md: ρ_k is never above it

// The proofs run in the double build (./test_lab_f64), once; those of a build with MPI need it.
#ifdef TRANSFORMER_DOUBLE
static char rank_launch[600];      // "mpirun -q --oversubscribe"

// Runs `mpirun ... -np N BINARY ARGS` as run_cli runs a command (its output in cli_output)
static int run_as_ranks(int ranks, const char *binary, const char *format, ...) {
    char args[4096], program[5000];
    va_list list;
    va_start(list, format);
    vsnprintf(args, sizeof args, format, list);
    va_end(list);
    snprintf(program, sizeof program, "%s -np %d %s", rank_launch, ranks, binary);
    const char *saved = cli_binary;
    cli_binary = program;
    int status = run_cli("%s", args);
    cli_binary = saved;
    return status;
}

#ifdef TRANSFORMER_MPI
static char rank_self[700];        // this binary: the lab's program in double (--lab)
static char rank_program[700];     // ./transformer, its absolute path
static char rank_dir[600];         // the files of these tests

static const char *rank_path(char *out, const char *name) {
    snprintf(out, 700, "%s/%s", rank_dir, name);
    return out;
}

// The numbers of train's line "ranks  target tokens trained on, by rank: a b c (the batches held
// n)": each rank's count into counts (at most `most`), the batches' into *batches; the count read
static int rank_token_counts(const char *output, long *counts, int most, long *batches) {
    const char *line = strstr(output, "target tokens trained on, by rank:");
    if (!line)
        return 0;
    const char *p = line + strlen("target tokens trained on, by rank:");
    int n = 0;
    char *end;
    for (long v = strtol(p, &end, 10); end != p && n < most; v = strtol(p, &end, 10)) {
        counts[n++] = v;
        p = end;
    }
    const char *held = strstr(p, "the batches held");
    *batches = held ? strtol(held + strlen("the batches held"), NULL, 10) : -1;
    return n;
}

// A loss log's losses and rates ("step loss lr" a line), at most `most`; the lines read
static int read_loss_log(const char *path, double *loss, double *lr, int most) {
    FILE *f = fopen(path, "r");
    int n = 0;
    long step;
    while (f && n < most && fscanf(f, "%ld %lf %lf", &step, &loss[n], &lr[n]) == 3)
        n++;
    if (f)
        fclose(f);
    return n;
}

// The largest |a - b| over the bound 2 n u |b| of two sums of n terms in two orders (Higham's
// γ_n, twice: each order's own error), n = --batch-tokens (at least the target tokens whose
// losses a step's loss sums), u double's unit roundoff. The parameters' own differences, from
// their gradients' sums (below, measured at most 6e-11 of the largest), move the loss by less.
static double loss_bound_ratio(const double *a, const double *b, int steps, int batch_tokens) {
    double worst = 0;
    for (int k = 0; k < steps; k++) {
        double bound = 2.0 * batch_tokens * DBL_EPSILON / 2 * fabs(b[k]);
        worst = fmax(worst, fabs(a[k] - b[k]) / bound);
    }
    return worst;
}

// Two runs' checkpoints, both loaded (1), or neither (0: nothing left allocated)
static int load_checkpoint_pair(const char *path_a, const char *path_b, LabCheckpoint *a,
                                LabCheckpoint *b) {
    if (lab_checkpoint_load(path_a, a))
        return 0;
    if (lab_checkpoint_load(path_b, b)) {
        lab_checkpoint_free(a);
        return 0;
    }
    return 1;
}

// Two runs' parameters after K steps from one start, whose gradients differ by another
// summation order only: dev/FORMATS.md's per-step Adam bound summed over the steps, each element
//     sum_k lr_k min(|r| + ρ, (1 + ρ) δ_t / (s + ε)) + 2 K u |θ| + 64 u (|r| + 1) sum_k lr_k,
// s = sqrt(v̂) and r = m̂ / (s + ε) from the moments the second run saved after its last step,
// δ_t the gradient tolerance times tensor t's largest s (its gradients' size). An element whose
// gradient is rounding noise may move a full lr_k either way; one the arithmetic resolves, about
// lr δ / |g|. Returns the largest difference over its bound (NaN: the checkpoints would not load).
static double adam_bound_ratio(const char *path_a, const char *path_b, const double *lr,
                               int steps, double gradient_tol) {
    LabCheckpoint a, b;
    if (!load_checkpoint_pair(path_a, path_b, &a, &b))
        return NAN;
    double worst = a.model.num_parameters == b.model.num_parameters ? 0 : INFINITY, lr_sum = 0;
    for (int k = 0; k < steps; k++) lr_sum += lr[k];
    const Transformer *m = &b.model;
    double c1 = 1 - pow(m->adam.beta1, (double)m->adam_step),
           c2 = 1 - pow(m->adam.beta2, (double)m->adam_step), u = DBL_EPSILON / 2;
    size_t start = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS && isfinite(worst); t++) {
        size_t end = start + m->param_sizes[t];
        double largest = 0;
        for (size_t i = start; i < end; i++) largest = fmax(largest, sqrt(m->adam_v[i] / c2));
        for (size_t i = start; i < end; i++) {
            double s = sqrt(m->adam_v[i] / c2), r = m->adam_m[i] / c1 / (s + m->adam.eps);
            double resolved = (1 + ADAM_RHO_MOST) * gradient_tol * largest / (s + m->adam.eps);
            double bound = lr_sum * fmin(fabs(r) + ADAM_RHO_MOST, resolved) +
                           2 * steps * u * fabs(m->params_memory[i]) +
                           64 * u * (fabs(r) + 1) * lr_sum;
            double d = fabs((double)a.model.params_memory[i] - (double)m->params_memory[i]);
            worst = fmax(worst, isnan(d) ? INFINITY : d / bound);
        }
        start = end;
    }
    lab_checkpoint_free(&a);
    lab_checkpoint_free(&b);
    return worst;
}

// The largest |a_i - b_i| over the largest |b_i| (a NaN: infinity)
static double scaled_gap(const real *a, const real *b, size_t n) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        worst = isnan(d) ? INFINITY : fmax(worst, d);
        scale = fmax(scale, fabs((double)b[i]));
    }
    return worst / (scale > 0 ? scale : 1);
}

// The first step's gradients of two runs, as Adam's first moment keeps them ((1 - β1) g after
// one step): the largest difference, relative to each tensor's largest, over `tolerance`
static double first_gradient_ratio(const char *path_a, const char *path_b, double tolerance) {
    LabCheckpoint a, b;
    if (!load_checkpoint_pair(path_a, path_b, &a, &b))
        return NAN;
    double worst = a.model.adam_step == 1 && b.model.adam_step == 1 ? 0 : INFINITY;
    size_t start = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS && isfinite(worst); t++) {
        size_t n = b.model.param_sizes[t];
        worst = fmax(worst, scaled_gap(a.model.adam_m + start, b.model.adam_m + start, n) /
                            tolerance);
        start += n;
    }
    lab_checkpoint_free(&a);
    lab_checkpoint_free(&b);
    return worst;
}

// -np 1, 2 and 3 on the same batches (at most 80 tokens: 3 or 4 sentences, so -np 3's shares
// are 2, 1 and 1 sentences, or 1, 1 and none), dropout off, in double (this binary): each rank's
// share, the loss of every step and the parameters after 20 steps. The -np 2 run's checkpoint,
// loss log and batch log are test_ranks_resume's unbroken run.
enum { RANK_STEPS = 20 };
static void test_ranks_against_one(void) {
    char ckpt[3][700], loss_log[3][700], batch_log[700], name[64];
    double loss[3][RANK_STEPS], lr[3][RANK_STEPS];
    long counts[3][4], batches[3];
    int status[3], read[3], ranks_read[3];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "np%d.ckpt", i + 1);
        rank_path(ckpt[i], name);
        snprintf(name, sizeof name, "np%d.loss", i + 1);
        rank_path(loss_log[i], name);
        status[i] = run_as_ranks(i + 1, rank_self, "--lab train " RANK_RUN " --steps %d "
                                 "--dropout 0 --batch-tokens 80 --checkpoint %s --loss-log %s "
                                 "%s%s", RANK_STEPS, ckpt[i], loss_log[i],
                                 i == 1 ? "--batch-log " : "",
                                 i == 1 ? rank_path(batch_log, "np2.batches") : "");
        ranks_read[i] = rank_token_counts(cli_output, counts[i], 4, &batches[i]);
        read[i] = read_loss_log(loss_log[i], loss[i], lr[i], RANK_STEPS);
    }
    int ran = status[0] == 0 && status[1] == 0 && status[2] == 0 && read[0] == RANK_STEPS &&
              read[1] == RANK_STEPS && read[2] == RANK_STEPS;
    for (int n = 1; n <= 3; n++) {
        long sum = 0, far = 0;   // far: the share farthest from 1/n of the batches'
        for (int r = 0; r < ranks_read[n - 1]; r++) {
            sum += counts[n - 1][r];
            far = labs(counts[n - 1][r] * n - batches[0]) > far ? labs(counts[n - 1][r] * n -
                                                                       batches[0]) : far;
        }
        check(ran && ranks_read[n - 1] == n && sum == batches[0] && batches[n - 1] == batches[0] &&
              far * 4 <= batches[0],
              "ranks: -np %d: each rank trained on its share of the batches' %ld target tokens, "
              "within a quarter of 1/%d (%ld ... by rank), together all of them", n, batches[0], n,
              counts[n - 1][0]);
    }
    for (int n = 2; n <= 3 && ran; n++) {
        double loss_ratio = loss_bound_ratio(loss[n - 1], loss[0], RANK_STEPS, 80);
        double adam_ratio = adam_bound_ratio(ckpt[n - 1], ckpt[0], lr[0], RANK_STEPS,
                                             RANK_GRADIENT_TOL_DOUBLE);
        check(loss_ratio <= 1 && adam_ratio <= 1,
              "ranks: -np %d against -np 1 in double, dropout off: every step's loss within 2 n u "
              "of it (%.2g of the bound), the parameters after %d steps within dev/FORMATS.md's "
              "Adam bound (%.2g of it)", n, loss_ratio, RANK_STEPS, adam_ratio);
    }
    if (!ran)
        check(0, "ranks: the runs at -np 1, 2, 3 trained %d, %d, %d steps (exit %d, %d, %d): %s",
              read[0], read[1], read[2], status[0], status[1], status[2], cli_output);
}

// A run of 10 steps at -np 2, resumed at -np 3 to step 20, against the unbroken -np 2 run of
// test_ranks_against_one: the same batches (their log, byte for byte), the same rates, and
// the losses and parameters within the bounds of another summation order.
static void test_ranks_resume(void) {
    char ckpt[700], loss_log[700], batch_log[700], unbroken[3][700];
    rank_path(unbroken[0], "np2.ckpt");
    rank_path(unbroken[1], "np2.loss");
    rank_path(unbroken[2], "np2.batches");
    const char *common = "--dropout 0 --batch-tokens 80 --checkpoint %s --loss-log %s "
                         "--batch-log %s";
    char first[300], second[300];
    snprintf(first, sizeof first, "--lab train " RANK_RUN " --steps 10 %s", common);
    snprintf(second, sizeof second, "--lab train --resume %%s --steps %d --loss-log %%s "
             "--batch-log %%s", RANK_STEPS);
    rank_path(ckpt, "resumed.ckpt");
    rank_path(loss_log, "resumed.loss");
    rank_path(batch_log, "resumed.batches");
    int part1 = run_as_ranks(2, rank_self, first, ckpt, loss_log, batch_log);
    int part2 = part1 ? -1 : run_as_ranks(3, rank_self, second, ckpt, loss_log, batch_log);
    double loss[2][RANK_STEPS], lr[2][RANK_STEPS];
    int got = read_loss_log(loss_log, loss[0], lr[0], RANK_STEPS),
        unbroken_got = read_loss_log(unbroken[1], loss[1], lr[1], RANK_STEPS);
    int same_rates = got == RANK_STEPS && unbroken_got == RANK_STEPS;
    for (int k = 0; k < RANK_STEPS && same_rates; k++) same_rates = lr[0][k] == lr[1][k];
    double loss_ratio = same_rates ? loss_bound_ratio(loss[0], loss[1], RANK_STEPS, 80) : NAN;
    double adam_ratio = same_rates ? adam_bound_ratio(ckpt, unbroken[0], lr[1], RANK_STEPS,
                                                      RANK_GRADIENT_TOL_DOUBLE) : NAN;
    check(part1 == 0 && part2 == 0 && same_rates && files_equal(batch_log, unbroken[2]) &&
          loss_ratio <= 1 && adam_ratio <= 1,
          "ranks: 10 steps at -np 2 resumed at -np 3 to step %d: the unbroken run's batches (byte "
          "for byte) and rates, its losses (%.2g of the bound) and parameters (%.2g) (exit %d, %d)",
          RANK_STEPS, loss_ratio, adam_ratio, part1, part2);
}

// In float (./transformer), the first step's gradient at -np 2 and 3 against -np 1's, within
// the tolerance of another summation order; -np 1 against ./transformer alone, with dropout:
// the same file, bit for bit; two -np 2 runs with dropout: the same file; two unbound ranks on
// this machine's cores: a share of its cores each (the threads in train's header).
static void test_ranks_float(const char *transformer) {
    char ckpt[3][700], name[64];
    int status[3];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "first%d.ckpt", i + 1);
        status[i] = run_as_ranks(i + 1, transformer, "train " RANK_RUN " --steps 1 --dropout 0 "
                              "--batch-tokens 400 --checkpoint %s", rank_path(ckpt[i], name));
    }
    for (int n = 2; n <= 3; n++) {
        double ratio = status[0] || status[n - 1]
                     ? NAN : first_gradient_ratio(ckpt[n - 1], ckpt[0], RANK_GRADIENT_TOL_FLOAT);
        check(ratio <= 1, "ranks: -np %d's first gradient (Adam's m) against -np 1's in float, "
              "relative to each tensor's largest: %.2g of dev/FORMATS.md's 8e-6 (exit %d)", n,
              ratio, status[n - 1]);
    }
    char plain[700], one[700], a[700], b[700];
    const char *run = "train " RANK_RUN " --steps 6 --batch-tokens 200 --checkpoint %s";
    const char *saved = cli_binary;
    cli_binary = transformer;
    int alone = run_cli(run, rank_path(plain, "plain.ckpt"));
    cli_binary = saved;
    int np1 = run_as_ranks(1, transformer, run, rank_path(one, "dropout1.ckpt"));
    check(alone == 0 && np1 == 0 && files_equal(plain, one),
          "ranks: -np 1 with dropout writes ./transformer's checkpoint, bit for bit (rank 0's "
          "dropout generator is the run's)");
    int first = run_as_ranks(2, transformer, run, rank_path(a, "dropout2a.ckpt"));
    char unbound[800];
    snprintf(unbound, sizeof unbound, "--bind-to none %s", transformer);
    int second = run_as_ranks(2, unbound, run, rank_path(b, "dropout2b.ckpt"));
    int cores = 1;
#ifdef _OPENMP
    cores = omp_get_num_procs();
#endif
    int share = cores / 2 > 1 ? cores / 2 : 1;
    double threads = printed_number_after(cli_output, "seed 1, ");   // (train's header)
    check(first == 0 && second == 0 && files_equal(a, b) && !files_equal(a, one) &&
          threads >= 1 && threads <= share,
          "ranks: two -np 2 runs with dropout write one checkpoint, bit for bit (not -np 1's); "
          "unbound, each rank runs on its share of the %d cores (%g thread%s, at most %d)", cores,
          threads, threads == 1 ? "" : "s", share);
}

// mpirun with the arguments as given (app contexts of their own: "-np 1 ... : -np 1 ..."), as
// run_cli runs a command
static int run_mpirun(const char *format, ...) {
    char args[8192];
    va_list list;
    va_start(list, format);
    vsnprintf(args, sizeof args, format, list);
    va_end(list);
    const char *saved = cli_binary;
    cli_binary = rank_launch;
    int status = run_cli("%s", args);
    cli_binary = saved;
    return status;
}

// Writes `lines` sentence pairs into path, the target words spelt `letter`N; line bad_line
// (1 = first; 0: none) holds no tab, and line changed_line one other word. Another letter gives
// the same pairs of token ids (the tokens numbered as they first appear) in another vocabulary.
static void write_rank_data(const char *path, int lines, int bad_line, int changed_line,
                            char letter) {
    FILE *f = fopen(path, "w");
    for (int i = 1; f && i <= lines; i++) {
        if (i == bad_line)
            fprintf(f, "one side only\n");
        else if (i == changed_line)
            fprintf(f, "w%d w%d w%d\t%c%d %c%d changed\n", i % 7, i % 5, i % 3, letter, i % 3,
                    letter, i % 7);
        else
            fprintf(f, "w%d w%d w%d\t%c%d %c%d %c1\n", i % 7, i % 5, i % 3, letter, i % 3, letter,
                    i % 7, letter);
    }
    if (f)
        fclose(f);
}

// The checkpoint at path still holds exactly `bytes` (n of them), and loads
static int checkpoint_kept(const char *path, const unsigned char *bytes, size_t n) {
    size_t size;
    unsigned char *now = read_file(path, &size);
    int same = now && bytes && size == n && memcmp(now, bytes, n) == 0;
    free(now);
    LabCheckpoint c;
    if (!same || lab_checkpoint_load(path, &c))
        return 0;
    lab_checkpoint_free(&c);
    return 1;
}

// Ranks given other options, data or checkpoints stop before any step, one line naming what
// differs, the checkpoint there as it was; bad input that one rank alone sees (its data file
// has a line without a tab) ends every rank with that rank's line; rank 0 that cannot write its
// checkpoint (a file-size limit, as a full disk) ends every rank with its line mid-run. Each
// rank runs in a directory of its own, where the same paths name other files.
static void test_ranks_disagree(const char *transformer) {
    char a[700], b[700], path[1600], kept[800];
    rank_path(a, "rank_a");
    rank_path(b, "rank_b");
    mkdir(a, 0777);
    mkdir(b, 0777);
    for (int i = 0; i < 2; i++) {   // a checkpoint in each, of 2 and of 3 steps
        snprintf(path, sizeof path, "train " RANK_RUN " --steps %d --checkpoint %s/model.ckpt",
                 2 + i, i ? b : a);
        const char *saved = cli_binary;
        cli_binary = transformer;
        run_cli("%s", path);
        cli_binary = saved;
    }
    snprintf(kept, sizeof kept, "%s/model.ckpt", a);
    size_t n;
    unsigned char *before = read_file(kept, &n);
    const char *app = "-np 1 -wdir %s %s train ";
    char two[1200];   // "-np 1 -wdir A BIN train ARGS : -np 1 -wdir B BIN train ARGS"
    struct {
        const char *what, *args_a, *args_b, *expected;
    } cases[] = {
        { "another --seed", RANK_RUN " --steps 3 --checkpoint model.ckpt",
          RANK_RUN " --steps 3 --checkpoint model.ckpt --seed 2",
          "the ranks disagree before the first step: --seed is 2 on rank 1 and 1 on rank 0" },
        { "another --d-model", RANK_RUN " --steps 3 --checkpoint model.ckpt",
          RANK_RUN " --steps 3 --checkpoint model.ckpt --d-model 8",
          "the ranks disagree before the first step: --d-model is 8 on rank 1 and 16 on rank 0" },
        { "other data at the same path", "--train data.tsv --steps 3 --force",
          "--train data.tsv --steps 3 --force",
          "rank 1's training data differs from rank 0's" },
        { "another vocabulary (the same token ids, the words spelt otherwise)",
          "--train words.tsv --steps 3 --force", "--train words.tsv --steps 3 --force",
          "rank 1's vocabulary differs from rank 0's" },
        { "another checkpoint to resume", "--resume model.ckpt --steps 5",
          "--resume model.ckpt --steps 5",
          "rank 1's model (its parameters and Adam's state: the checkpoint --resume read) differs "
          "from rank 0's" },
        { "a data file one rank alone cannot read", "--train bad.tsv --steps 3 --force",
          "--train bad.tsv --steps 3 --force",
          "error: train: rank 1 of 2: bad.tsv:3: no tab; expected source<TAB>target" },
    };
    const char *files[3] = { "data.tsv", "words.tsv", "bad.tsv" };
    for (int i = 0; i < 3; i++) {   // in a, then in b: another pair, spelling, a line with no tab
        snprintf(path, sizeof path, "%s/%s", a, files[i]);
        write_rank_data(path, 60, 0, 0, 'v');
        snprintf(path, sizeof path, "%s/%s", b, files[i]);
        write_rank_data(path, 60, i == 2 ? 3 : 0, i == 0 ? 17 : 0, i == 1 ? 'u' : 'v');
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(two, sizeof two, "%s%s : %s%s", app, cases[i].args_a, app, cases[i].args_b);
        char command[3200];
        snprintf(command, sizeof command, two, a, transformer, b, transformer);
        int status = run_mpirun("%s", command);
        const char *line = strstr(cli_output, "error:");
        check(status == 1 && count_lines_starting(cli_output, "error:") == 1 && line &&
              strstr(line, cases[i].expected) && !strstr(cli_output, "step ") &&
              checkpoint_kept(kept, before, n),
              "ranks: %s: one line, exit 1, before any step, the checkpoint as it was (exit %d: "
              "%.*s)", cases[i].what, status, line ? (int)strcspn(line, "\n") : 300,
              line ? line : cli_output);
    }
    // rank 0's disk full at its first save: a file-size limit (EFBIG, SIGXFSZ ignored) on it
    // alone; the ranks talk over TCP, since the limit would stop the shared-memory transport's
    // file too
    char limited[3200];
    snprintf(limited, sizeof limited, "--mca btl self,tcp -np 1 -wdir %s sh -c \"trap '' XFSZ; "
             "ulimit -f 8; exec %s "
             "train --resume model.ckpt --steps 6 --save-every 1\" : -np 1 -wdir %s %s train "
             "--resume model.ckpt --steps 6 --save-every 1", a, transformer, a, transformer);
    int status = run_mpirun("%s", limited);
    const char *line = strstr(cli_output, "error:");
    check(status == 1 && count_lines_starting(cli_output, "error:") == 1 && line &&
          strstr(line, "model.ckpt.tmp: writing the checkpoint failed: File too large; "
                       "model.ckpt was left as it was") && checkpoint_kept(kept, before, n),
          "ranks: rank 0 cannot write its checkpoint (a full disk): one line, every rank ended, "
          "exit 1, the checkpoint as it was (exit %d: %.*s)", status,
          line ? (int)strcspn(line, "\n") : 300, line ? line : cli_output);
    free(before);
}

// A run whose rank 0 is killed (kill -9) between its saves, or in one: mpirun ends the run, and
// the checkpoint loads and resumes at -np 2 (a save is written whole to PATH.tmp and renamed).
static void test_killed_rank(const char *transformer) {
    char ckpt[700], out[700], command[3200];
    rank_path(ckpt, "killed.ckpt");
    rank_path(out, "killed.out");
    snprintf(command, sizeof command, "exec %s -np 2 %s train " RANK_RUN " --steps 1000000 "
             "--save-every 3 --checkpoint %s > %s 2>&1", rank_launch, transformer, ckpt, out);
    fflush(stdout);
    pid_t launcher = fork();
    if (launcher == 0) {
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    double began = wall_seconds(), pid_zero = NAN;
    while (launcher > 0 && wall_seconds() - began < 30) {   // rank 0's pid, then a checkpoint
        size_t size;
        unsigned char *text = read_file(out, &size);
        pid_zero = text ? printed_number_after((char *)text, "rank 0 pid ") : NAN;
        free(text);
        if (pid_zero > 1 && access(ckpt, F_OK) == 0)
            break;
        nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
    }
    nanosleep(&(struct timespec){ 0, 37000000 }, NULL);   // more saves, then kill -9
    int killed = pid_zero > 1 && kill((pid_t)pid_zero, SIGKILL) == 0, status = 0, ended = 0;
    for (began = wall_seconds(); launcher > 0 && !ended && wall_seconds() - began < 30;) {
        ended = waitpid(launcher, &status, WNOHANG) == launcher;
        nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
    }
    if (launcher > 0 && !ended) {   // (mpirun did not end the run: it is stopped here)
        kill(launcher, SIGTERM);
        waitpid(launcher, &status, 0);
    }
    LabCheckpoint c;
    const char *error = lab_checkpoint_load(ckpt, &c);
    long step = error ? -1 : c.model.adam_step;
    if (!error)
        lab_checkpoint_free(&c);
    int resumed = step > 0 ? run_as_ranks(2, transformer, "train --resume %s --steps %ld", ckpt,
                                       step + 2) : -1;
    check(killed && ended && !(WIFEXITED(status) && WEXITSTATUS(status) == 0) && step > 0 &&
          resumed == 0,
          "ranks: rank 0 killed (kill -9): mpirun ended the run; its checkpoint (step %ld) loads "
          "and resumes at -np 2 (%s)", step, error ? error : "loaded");
}

#endif   // TRANSFORMER_MPI
#endif   // TRANSFORMER_DOUBLE

// Every proof above, where MPI was built in and Open MPI's mpirun is found; else the line that
// says why not. A build without MPI that a launcher starts as 2 ranks must refuse to run.
static void run_rank_tests(void) {
#ifndef TRANSFORMER_DOUBLE
    printf("-- data-parallel training over MPI: in ./test_lab_f64 (once)\n");
#else
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    int open_mpi = system("mpirun --version 2>/dev/null | grep -q 'Open MPI'") == 0;
    // (the shared-memory transport named, which a command line's --mca btl overrides: Open
    // MPI's probing of the networks' (UCX, OFI) took 0.2 s of each 0.4 s start on this machine)
    snprintf(rank_launch, sizeof rank_launch, "mpirun -q --oversubscribe --mca pml ob1");
    setenv("OMPI_MCA_btl", "self,vader", 0);
    const char *transformer = cli_binary;
#ifndef TRANSFORMER_MPI
    if (open_mpi) {
        printf("-- data-parallel training: this build has no MPI (make MPI=0, or no mpicc)\n");
        int status = run_as_ranks(2, transformer, "train " RANK_RUN " --steps 2 --checkpoint %s/x",
                               test_dir);
        check(status != 0 && strstr(cli_output, "error: train: a launcher started 2 copies of "
                                                "this program, which was built without MPI"),
              "ranks: a build without MPI started as 2 ranks refuses to train (exit %d)", status);
    } else {
        printf("-- data-parallel training over MPI: skipped (built without MPI, and no Open MPI "
               "mpirun on the PATH)\n");
    }
#else
    if (!open_mpi) {
        printf("-- data-parallel training over MPI: skipped (no Open MPI mpirun on the PATH: "
               "apt-get install openmpi-bin)\n");
        return;
    }
    ssize_t got = readlink("/proc/self/exe", rank_self, sizeof rank_self - 1);
    rank_self[got > 0 ? got : 0] = '\0';
    snprintf(rank_dir, sizeof rank_dir, "%s/ranks", test_dir);
    mkdir(rank_dir, 0777);
    char here[400] = "";   // (the ranks run in directories of their own: an absolute path)
    if (transformer[0] != '/' && !getcwd(here, sizeof here))
        here[0] = '\0';
    snprintf(rank_program, sizeof rank_program, "%s%s%s", here, here[0] ? "/" : "", transformer);
    transformer = rank_program;
    printf("-- data-parallel training over MPI (lab/ranks.c): mpirun -np 1, 2, 3\n");
    test_ranks_against_one();
    test_ranks_resume();
    test_ranks_float(transformer);
    test_ranks_disagree(transformer);
    test_killed_rank(transformer);
#endif
#endif
}
