/* lab/ranks.c: data-parallel training, `mpirun -np N ./transformer train ...`
 *
 * The paper trained its models on 8 GPUs (§5.2), each batch of about 25,000 source and 25,000
 * target tokens (§5.1) spread over them. mpirun starts N copies of the program, the ranks; each
 * reads the same data, draws the same batches (the same generator, seeded alike), takes its
 * share of every batch (a run of neighbouring sentences: rank_batch) and takes the step one
 * process takes on the whole batch (ranks_train_step):
 *   1. its forward pass, on its share;
 *   2. every share's target tokens summed, the count the backward pass divides by (§5.4's loss
 *      is the mean over the whole batch's targets), and the shares' losses summed likewise: the
 *      loss printed is the batch's;
 *   3. its backward pass;
 *   4. the gradients (one allocation, grads_memory) summed across ranks in rank order, g_0 +
 *      g_1 + ... + g_{N-1}, so that two runs at one N give the same bits (MPI_Allreduce
 *      promises no order): each rank sums one slice of the gradients from every rank
 *      (MPI_Alltoallv), then every rank gets every slice (MPI_Allgatherv); 2 (N-1)/N of the
 *      gradients' bytes in and out of each rank, as a ring all-reduce moves;
 *   5. the same Adam step on every rank: their parameters stay equal without being sent.
 * --batch-tokens stays the whole batch's size, as the paper's 25,000 + 25,000 tokens were the
 * sum over its 8 GPUs. Rank 0 alone prints, evaluates, writes checkpoints and logs; a
 * checkpoint holds nothing of N, so --resume goes on at any N.
 *
 * Dropout (§5.4): rank r draws its masks from a generator of its own, a hash of the run's
 * generator and r; rank 0's is the run's own, so that `mpirun -np 1` repeats ./transformer bit
 * for bit. The run's generator then moves as rank 0's did, so a checkpoint keeps one generator,
 * whatever N.
 *
 * Faults. MPI starts only when a launcher started the program (ranks_launched), so
 * ./transformer alone starts as before. At the start the ranks agree: if any fails (a file it
 * alone cannot read, a bad flag), the first that failed prints its line and every rank exits 1;
 * then they compare what they read (ranks_check_same: the options, the training data, the
 * vocabulary, the model and its Adam state), and rank 0 names what differs, before any step.
 * A rank that fails later (rank 0's save to a full disk) prints its line and ends every rank
 * (MPI_Abort); a rank that is killed ends the run through mpirun, and the last checkpoint is
 * whole (a save is written to PATH.tmp and renamed).
 *
 * BUILD  included by lab/lab.c before lab/runs.c. With -DTRANSFORMER_MPI (make, where mpicc is
 *        found) it uses MPI; without, every function here sees one rank, and a program that a
 *        launcher started as several ranks stops with one line.
 */

#ifdef TRANSFORMER_MPI
#include <mpi.h>
#endif
#include <fcntl.h>   // open: /dev/null for the standard output of ranks other than 0
#include "ranks.h"

#ifdef TRANSFORMER_DOUBLE
#define MPI_REAL_TYPE MPI_DOUBLE
#else
#define MPI_REAL_TYPE MPI_FLOAT
#endif

// (what a rank returns for an error that another rank prints)
static const char ranks_reported_elsewhere[] = "(another rank reports the error)";

// The ranks of this run, and what a data-parallel step keeps between calls.
static struct {
    int started;                 // MPI_Init ran: a launcher started this program
    int rank, size;
    int local_rank, local_size;  // among the ranks on this machine
    int sharing, share_index;    // the ranks on this machine allowed the same cores as this one,
                                 // and this one's place among them (the threads' share)
    int *peer_pids;              // the other ranks on this machine: their CPU time is the run's
    int peer_count;
    struct RankPlace *places;    // (size) where each rank runs
    int *slice_counts;           // (size) the gradients' slices: rank r sums slice r
    int *slice_starts;
    int *from_counts;            // (size) what this rank gets of its slice from each rank
    int *from_starts;
    real *slices;                // (size, slice) its slice, as every rank computed it
    size_t slices_capacity;
    int held_stderr;             // ranks > 0, at the start: the real standard error (-1: none)
    FILE *held_messages;         // ... and the messages held back meanwhile
} run_ranks = { .size = 1, .local_size = 1, .sharing = 1, .held_stderr = -1 };

// ---- MPI's calls: with one rank (no launcher, or no MPI) each is what it does for one ----

// Every rank's `bytes` bytes, in rank order, into all (size * bytes)
static void ranks_allgather(const void *mine, void *all, size_t bytes) {
#ifdef TRANSFORMER_MPI
    if (run_ranks.started) {
        MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
        return;
    }
#endif
    memcpy(all, mine, bytes);
}

// The least of every rank's value
static int ranks_min(int value) {
#ifdef TRANSFORMER_MPI
    if (run_ranks.started)
        MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
#endif
    return value;
}

// Rank `from`'s text, to rank 0 (a copy there, to free; NULL on the others)
static char *ranks_text_to_zero(const char *text, int from) {
    if (from == 0)
        return run_ranks.rank == 0 ? strdup(text) : NULL;
#ifdef TRANSFORMER_MPI
    int length = (int)strlen(text) + 1;
    if (run_ranks.rank == from) {
        MPI_Send(&length, 1, MPI_INT, 0, 0, MPI_COMM_WORLD);
        MPI_Send(text, length, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
    } else if (run_ranks.rank == 0) {
        MPI_Recv(&length, 1, MPI_INT, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        char *theirs = checked_calloc((size_t)length, 1, "ranks");
        MPI_Recv(theirs, length, MPI_CHAR, from, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        return theirs;
    }
#endif
    return NULL;
}

// A line naming an error that this rank alone has met, then every rank ended (MPI_Abort), the
// launcher's status 1. With one rank it only returns: the caller goes on as one process does.
static void ranks_stop_every_rank(const char *error) {
#ifdef TRANSFORMER_MPI
    if (run_ranks.started && run_ranks.size > 1) {
        if (run_ranks.rank > 0)
            fprintf(stderr, "error: train: rank %d of %d: %s\n", run_ranks.rank, run_ranks.size,
                    error);
        else
            fprintf(stderr, "error: train: %s\n", error);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
#endif
    (void)error;
}

// ---- starting and ending ------------------------------------------------------------

// Whether a launcher started this program, and as how many ranks (0: it does not say; -1: no
// launcher): Open MPI's mpirun, MPICH's and Intel MPI's Hydra (PMI), a PMIx launcher, MVAPICH's.
static int ranks_launched_as(void) {
    const char *sizes[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE" };
    const char *ranks[] = { "PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK" };
    for (int i = 0; i < 3; i++) {
        const char *text = getenv(sizes[i]);
        if (text && *text)
            return atoi(text) > 0 ? atoi(text) : 0;
    }
    for (int i = 0; i < 3; i++) {
        const char *text = getenv(ranks[i]);
        if (text && *text)
            return 0;
    }
    return -1;
}

// The cores this process may run on, as /proc/self/status lists them ("0-3,8"); "" where it
// cannot tell
static void allowed_cores(char *text, size_t size) {
    text[0] = '\0';
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
            snprintf(text, size, "%s", line + 18 + strspn(line + 18, " \t"));
            text[strcspn(text, "\n")] = '\0';
        }
    }
    fclose(f);
}

// What each rank tells the others of itself at the start
enum { CORES_TEXT = 240 };
typedef struct RankPlace {
    char host[64];            // (gethostname, cut to 63 bytes)
    int pid;
    char cores[CORES_TEXT];   // allowed_cores
} RankPlace;

// The ranks on this machine (the same host name): how many, this one's place, the others'
// process ids, and which of them may run on the same cores as this one (they share those
// cores' threads).
static void ranks_find_neighbours(void) {
    RankPlace mine, *all = checked_calloc((size_t)run_ranks.size, sizeof(RankPlace), "ranks");
    memset(&mine, 0, sizeof mine);
    gethostname(mine.host, sizeof mine.host - 1);
    mine.pid = (int)getpid();
    allowed_cores(mine.cores, sizeof mine.cores);
    ranks_allgather(&mine, all, sizeof mine);
    run_ranks.peer_pids = checked_calloc((size_t)run_ranks.size, sizeof(int), "ranks");
    run_ranks.local_size = run_ranks.sharing = 0;
    for (int r = 0; r < run_ranks.size; r++) {
        if (strcmp(all[r].host, mine.host) != 0)
            continue;
        if (r == run_ranks.rank)
            run_ranks.local_rank = run_ranks.local_size;
        else
            run_ranks.peer_pids[run_ranks.peer_count++] = all[r].pid;
        run_ranks.local_size++;
        if (strcmp(all[r].cores, mine.cores) == 0) {
            if (r == run_ranks.rank)
                run_ranks.share_index = run_ranks.sharing;
            run_ranks.sharing++;
        }
    }
    run_ranks.places = all;
}

// MPI, when a launcher started this program (else nothing: one rank). Returns an error, or NULL.
static const char *ranks_start(void) {
    int launched_as = ranks_launched_as();
    if (launched_as < 0)
        return NULL;
#ifdef TRANSFORMER_MPI
    int already = 0;
    MPI_Initialized(&already);
    if (!already && MPI_Init(NULL, NULL) != MPI_SUCCESS)
        return errorf("MPI_Init failed: a launcher started this program (%d ranks), but MPI "
                      "would not start", launched_as);
    run_ranks.started = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &run_ranks.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &run_ranks.size);
    ranks_find_neighbours();
    int n = run_ranks.size;
    run_ranks.slice_counts = checked_calloc((size_t)4 * n, sizeof(int), "ranks");
    run_ranks.slice_starts = run_ranks.slice_counts + n;
    run_ranks.from_counts = run_ranks.slice_counts + 2 * n;
    run_ranks.from_starts = run_ranks.slice_counts + 3 * n;
    return NULL;
#else
    if (launched_as > 1)
        return errorf("a launcher started %d copies of this program, which was built without MPI "
                      "(make MPI=0, or no mpicc when it was built): each would train alone and "
                      "write the same checkpoint; expected ./transformer built by make where "
                      "Open MPI's mpicc is installed, or one process", launched_as);
    (void)ranks_find_neighbours;   // (MPI's alone)
    return NULL;
#endif
}

static void ranks_end(void) {
#ifdef TRANSFORMER_MPI
    if (run_ranks.started)
        MPI_Finalize();
#endif
    free(run_ranks.peer_pids);
    free(run_ranks.places);
    free(run_ranks.slice_counts);
    free(run_ranks.slices);
    if (run_ranks.held_messages)
        fclose(run_ranks.held_messages);
    memset(&run_ranks, 0, sizeof run_ranks);
    run_ranks.size = run_ranks.local_size = run_ranks.sharing = 1;
    run_ranks.held_stderr = -1;
}

// ---- what the ranks print ---------------------------------------------------------

// Ranks other than 0 print nothing: their standard output goes to /dev/null, and until the
// start is agreed (ranks_release_messages) their standard error is held back, so that the
// warnings and errors every rank meets alike are printed once, by rank 0.
static void ranks_hold_output(void) {
    if (run_ranks.rank == 0)
        return;
    fflush(stdout);
    fflush(stderr);
    int null_out = open("/dev/null", O_WRONLY);
    if (null_out >= 0) {
        dup2(null_out, 1);
        close(null_out);
    }
    run_ranks.held_messages = tmpfile();
    if (!run_ranks.held_messages)
        return;   // (its messages are printed as they come)
    run_ranks.held_stderr = dup(2);
    dup2(fileno(run_ranks.held_messages), 2);
}

// Standard error back; with `replay`, the messages held back printed first (this rank failed
// at the start, and no rank before it did: it reports).
static void ranks_release_messages(int replay) {
    if (run_ranks.held_stderr < 0)
        return;
    fflush(stderr);
    dup2(run_ranks.held_stderr, 2);
    close(run_ranks.held_stderr);
    run_ranks.held_stderr = -1;
    char line[4096];
    rewind(run_ranks.held_messages);
    while (replay && fgets(line, sizeof line, run_ranks.held_messages))
        fputs(line, stderr);
    fflush(stderr);
}

// The first rank that failed (failed: this one's verdict), or -1 when none did
static int ranks_first_failed(int failed) {
    int first = ranks_min(failed ? run_ranks.rank : run_ranks.size);
    return first < run_ranks.size ? first : -1;
}

// ---- the ranks read the same: compared before the first step ---------------------------

// 64 bits of each thing the ranks must agree on
enum { FINGERPRINT_FIELDS = 5 };
typedef struct {
    // the number type's bytes (a float build beside a double one); the run's flags as text
    // (format_run_options); the training pairs (dataset_hash); the vocabulary's tokens in order;
    // the model: its parameters, Adam's moments and step, the generators, the place in the data
    uint64_t field[FINGERPRINT_FIELDS];
} RankFingerprint;

static const char *fingerprint_names[FINGERPRINT_FIELDS] = {
    "number type (a float build beside a double build)", "options", "training data",
    "vocabulary", "model (its parameters and Adam's state: the checkpoint --resume read)",
};

// A hash of n bytes a 64-bit word at a time (the model's megabytes in milliseconds)
static uint64_t words_hash(uint64_t hash, const void *data, size_t n) {
    const unsigned char *bytes = data;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t word;
        memcpy(&word, bytes + i, 8);
        hash = (hash ^ word) * 0x100000001B3ULL;
    }
    return fnv1a(hash, bytes + n / 8 * 8, n % 8);
}

static RankFingerprint rank_fingerprint(const TrainRun *run, const char *options,
                                        uint64_t data_hash) {
    const Transformer *m = &run->model;
    RankFingerprint f = { { sizeof(real), fnv1a(FNV_OFFSET, options, strlen(options)), data_hash,
                            FNV_OFFSET, FNV_OFFSET } };
    for (int id = 0; id < run->vocab.size; id++)
        f.field[3] = fnv1a(f.field[3], run->vocab.words[id], strlen(run->vocab.words[id]) + 1);
    size_t bytes = m->num_parameters * sizeof(real);
    f.field[4] = words_hash(f.field[4], m->params_memory, bytes);
    f.field[4] = words_hash(f.field[4], m->adam_m, bytes);
    f.field[4] = words_hash(f.field[4], m->adam_v, bytes);
    uint64_t counters[5] = { (uint64_t)m->adam_step, m->dropout_rng.state, run->data_rng.state,
                             (uint64_t)run->epoch, (uint64_t)run->epoch_batches };
    f.field[4] = words_hash(f.field[4], counters, sizeof counters);
    return f;
}

// One "--name\nvalue\n" of a run's options text: its name and value, and where the next starts
typedef struct {
    const char *name, *value, *next;
    int name_length, value_length;
} OptionLine;

static OptionLine option_line(const char *text) {
    OptionLine o = { text, text, text, (int)strcspn(text, "\n"), 0 };
    o.value = text + o.name_length + (text[o.name_length] != '\0');
    o.value_length = (int)strcspn(o.value, "\n");
    o.next = o.value + o.value_length + (o.value[o.value_length] != '\0');
    return o;
}

// The first flag whose value differs between rank 0's options and rank r's, as "--seed is 2 on
// rank 1 and 1 on rank 0"
static void first_differing_option(char *out, size_t size, const char *zeros, const char *theirs,
                                   int r) {
    snprintf(out, size, "rank %d's options differ from rank 0's", r);
    for (OptionLine a = option_line(zeros), b = option_line(theirs); *a.name || *b.name;
         a = option_line(a.next), b = option_line(b.next)) {
        int same_name = a.name_length == b.name_length &&
                        strncmp(a.name, b.name, (size_t)a.name_length) == 0;
        if (!same_name) {   // (a flag given to one rank and not to the other)
            OptionLine given = a.name_length ? a : b;
            snprintf(out, size, "%.*s is given to rank %d and not to rank %d", given.name_length,
                     given.name, a.name_length ? 0 : r, a.name_length ? r : 0);
            return;
        }
        if (a.value_length != b.value_length ||
            strncmp(a.value, b.value, (size_t)a.value_length) != 0) {
            snprintf(out, size, "%.*s is %.*s on rank %d and %.*s on rank 0", a.name_length,
                     a.name, b.value_length, b.value, r, a.value_length, a.value);
            return;
        }
    }
}

// Before the first step: every rank's options, data, vocabulary and model against rank 0's.
// NULL when they agree; else rank 0 returns the line naming the first rank and the first thing
// that differs, the others ranks_reported_elsewhere.
static const char *ranks_check_same(const TrainRun *run, const char *options,
                                    uint64_t data_hash) {
    if (run_ranks.size == 1)
        return NULL;
    RankFingerprint mine = rank_fingerprint(run, options, data_hash);
    RankFingerprint *all = checked_calloc((size_t)run_ranks.size, sizeof mine, "ranks");
    ranks_allgather(&mine, all, sizeof mine);
    int differing = -1, field = 0;
    for (int r = 1; r < run_ranks.size && differing < 0; r++) {
        for (field = 0; field < FINGERPRINT_FIELDS && all[r].field[field] == all[0].field[field];
             field++) {}
        if (field < FINGERPRINT_FIELDS)
            differing = r;
    }
    free(all);
    if (differing < 0)
        return NULL;
    char what[600];
    snprintf(what, sizeof what, "rank %d's %s differs from rank 0's", differing,
             fingerprint_names[field]);
    char *theirs = field == 1 ? ranks_text_to_zero(options, differing) : NULL;
    if (theirs)   // (rank 0: which flag)
        first_differing_option(what, sizeof what, options, theirs, differing);
    free(theirs);
    if (run_ranks.rank != 0)
        return ranks_reported_elsewhere;
    return errorf("the ranks disagree before the first step: %s; expected every rank to be given "
                  "the same options, data and checkpoint", what);
}

// ---- the data-parallel step ---------------------------------------------------------

// Where rank r's share of a batch starts (r = N: where the batch ends). The shares are runs of
// neighbours in the batch's order by length, cut where the tokens before (sources and targets)
// come nearest r/N of the batch's, the first such place: their work is about equal.
static int share_start(const Dataset *data, const int *pairs, int count, int r) {
    long total = 0, before = 0;
    for (int i = 0; i < count; i++)
        total += data->pairs[pairs[i]].src_len + data->pairs[pairs[i]].tgt_len + 2;
    long goal = total * r, best_gap = goal;   // (both N times the tokens)
    int start = 0;
    for (int i = 1; i <= count; i++) {
        before += data->pairs[pairs[i - 1]].src_len + data->pairs[pairs[i - 1]].tgt_len + 2;
        long gap = labs(before * run_ranks.size - goal);
        if (gap < best_gap) {
            best_gap = gap;
            start = i;
        }
    }
    return start;
}

// This rank's share of the batch every rank drew (run->batch), into *share; the whole batch
// when the run has one rank
static const Batch *rank_batch(TrainRun *run, BatchBuffer *share) {
    if (run_ranks.size == 1)
        return &run->batch.batch;
    BatchSpan span = run->plan.spans[run->epoch_batches - 1];   // (train_next_batch's)
    const int *pairs = run->plan.order + span.start;
    int first = share_start(&run->train, pairs, span.count, run_ranks.rank);
    int count = share_start(&run->train, pairs, span.count, run_ranks.rank + 1) - first;
    batch_buffer_free(share);
    if (count == 0) {   // fewer sentences than ranks: this one's share is empty
        share->batch.S = share->batch.T = 1;
        return &share->batch;
    }
    batch_fill(share, &run->train, pairs + first, count);
    return &share->batch;
}

// The dropout generator of rank r for a step: the run's for rank 0, else a hash of it and r
static uint64_t rank_dropout_state(uint64_t run_state, int rank) {
    if (rank == 0)
        return run_state;
    uint64_t state = hash64(run_state ^ ((uint64_t)rank * 0x9E3779B97F4A7C15ULL));
    return state ? state : 1;   // (xorshift64*'s state is never 0)
}

// How many numbers the generator drew from `from` to reach `to` (at most `most`; -1: not so)
static long draws_between(Rng from, Rng to, long most) {
    for (long draws = 0; draws <= most; draws++) {
        if (from.state == to.state)
            return draws;
        rng_next(&from);
    }
    return -1;
}

// Each rank's part of a step; summed over the ranks, the batch's
typedef struct {
    double loss_sum;        // its targets' label-smoothed losses, summed
    double target_tokens;   // its share's target tokens (exact: far below 2^53)
    double dropout_draws;   // the numbers its forward pass drew for its masks (the most, summed)
} ShareOfStep;

static ShareOfStep ranks_step_totals(ShareOfStep mine) {
    ShareOfStep *all = checked_calloc((size_t)run_ranks.size, sizeof mine, "ranks"),
                total = { 0, 0, 0 };
    ranks_allgather(&mine, all, sizeof mine);
    for (int r = 0; r < run_ranks.size; r++) {   // in rank order: the same sums on every rank
        total.loss_sum += all[r].loss_sum;
        total.target_tokens += all[r].target_tokens;
        total.dropout_draws = fmax(total.dropout_draws, all[r].dropout_draws);
    }
    free(all);
    return total;
}

// Every rank's n values summed in rank order, into every rank's values: rank r sums slice r
// (about n/N values) of all ranks' (MPI_Alltoallv), then the slices go to every rank
// (MPI_Allgatherv). The slices' sums run on this rank's threads.
static void ranks_sum_reals(real *values, size_t n) {
#ifdef TRANSFORMER_MPI
    int N = run_ranks.size, rank = run_ranks.rank;
    if (!run_ranks.started || N == 1)
        return;
    if (n > (size_t)INT_MAX)
        ranks_stop_every_rank("the gradients are more numbers than MPI's int counts can hold");
    for (int r = 0; r < N; r++) {
        size_t start = n * (size_t)r / (size_t)N, end = n * (size_t)(r + 1) / (size_t)N;
        run_ranks.slice_starts[r] = (int)start;
        run_ranks.slice_counts[r] = (int)(end - start);
    }
    int mine = run_ranks.slice_counts[rank];
    for (int r = 0; r < N; r++) {
        run_ranks.from_counts[r] = mine;
        run_ranks.from_starts[r] = r * mine;
    }
    size_t need = (size_t)N * (size_t)mine;
    if (need > run_ranks.slices_capacity) {
        run_ranks.slices = checked_realloc(run_ranks.slices, need, sizeof(real), "gradient slices");
        run_ranks.slices_capacity = need;
    }
    real *slices = run_ranks.slices, *sum = values + run_ranks.slice_starts[rank];
    MPI_Alltoallv(values, run_ranks.slice_counts, run_ranks.slice_starts, MPI_REAL_TYPE, slices,
                  run_ranks.from_counts, run_ranks.from_starts, MPI_REAL_TYPE, MPI_COMM_WORLD);
    #pragma omp parallel for
    for (int i = 0; i < mine; i++) {
        real total = slices[i];
        for (int r = 1; r < N; r++) total += slices[(size_t)r * mine + i];
        sum[i] = total;
    }
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_REAL_TYPE, values, run_ranks.slice_counts,
                   run_ranks.slice_starts, MPI_REAL_TYPE, MPI_COMM_WORLD);
#else
    (void)values;
    (void)n;
#endif
}

// The label-smoothed losses of the last forward pass's real target positions, summed
static double target_loss_sum(const Transformer *model, const Batch *batch) {
    double total = 0;
    for (int b = 0; b < batch->B; b++)
        for (int t = 0; t < batch->tgt_len[b]; t++)
            total += model->acts.token_loss[(size_t)b * batch->T + t];
    return total;
}

// transformer_train_step on this rank's share (B may be 0: a batch of fewer sentences than
// ranks), as one process takes it on the whole batch: the steps of the header comment.
static real ranks_train_step(Transformer *model, const Batch *share, int warmup_steps,
                             double lr_factor) {
    Rng run_generator = model->dropout_rng;
    model->dropout_rng.state = rank_dropout_state(run_generator.state, run_ranks.rank);
    Rng drawn_from = model->dropout_rng;
    ShareOfStep mine = { 0, 0, 0 };
    if (share->B > 0) {
        transformer_forward(model, share);
        mine.loss_sum = target_loss_sum(model, share);
        mine.target_tokens = model->num_target_tokens;
        long most_draws = 2 + 5L * model->config.n_layers;   // (a key a dropout: §5.4's places)
        mine.dropout_draws = (double)draws_between(drawn_from, model->dropout_rng, most_draws);
        if (mine.dropout_draws < 0) {
            ranks_stop_every_rank("a forward pass drew more dropout keys than the model has "
                                  "dropouts");
            mine.dropout_draws = 0;
        }
    }
    ShareOfStep batch = ranks_step_totals(mine);
    model->num_target_tokens = (int)batch.target_tokens;   // what the backward pass divides by
    transformer_zero_grad(model);
    if (share->B > 0)
        transformer_backward(model, share);
    ranks_sum_reals(model->grads_memory, model->num_parameters);
    model->dropout_rng = run_generator;   // moved on as far as rank 0's moved
    for (long i = 0; i < (long)batch.dropout_draws; i++) rng_next(&model->dropout_rng);
    long step = model->adam_step + 1;
    adam_update(model,
                transformer_learning_rate(step, model->config.d_model, warmup_steps, lr_factor));
    model->loss = batch.target_tokens > 0 ? (real)(batch.loss_sum / batch.target_tokens) : 0;
    return model->loss;
}

static void ranks_nothing_to_copy(Transformer *model) {
    (void)model;
}

static const TrainingCompute ranks_cpu_training = {
    "transformer.c on every rank, data-parallel over MPI", ranks_nothing_to_copy,
    ranks_train_step, ranks_nothing_to_copy,
};

// The steps' compute for this run: transformer.c's own becomes the data-parallel step when a
// launcher started the ranks; a companion's (the CUDA one) sums its gradients itself (NCCL).
static const TrainingCompute *ranks_training(const TrainingCompute *compute) {
    return run_ranks.started && compute == &transformer_cpu_training ? &ranks_cpu_training
                                                                      : compute;
}

// train's line about the ranks (rank 0 prints it; the others' standard output is /dev/null)
static void ranks_print_header(int batch_tokens) {
    if (!run_ranks.started)
        return;
    printf("ranks  %d (MPI), each training on its share of every batch of <= %d tokens and "
           "summing the gradients; rank 0 prints, evaluates and saves:", run_ranks.size,
           batch_tokens);
    for (int r = 0; r < run_ranks.size && r < 16; r++)
        printf(" rank %d pid %d on %s%s", r, run_ranks.places[r].pid, run_ranks.places[r].host,
               r + 1 < run_ranks.size ? "," : "\n");
    if (run_ranks.size > 16)
        printf(" ... (%d more)\n", run_ranks.size - 16);
}

// Every rank's count, into all (size numbers) on every rank
static void ranks_gather_counts(long mine, long *all) {
    ranks_allgather(&mine, all, sizeof mine);
}

// The CPU seconds the other ranks on this machine have used (Linux's /proc/PID/stat: user and
// system time), which the busy machine's thread count takes as the run's own
static double ranks_peers_cpu_seconds(void) {
    double ticks = 0;
    for (int i = 0; i < run_ranks.peer_count; i++) {
        char path[64], text[1024];
        snprintf(path, sizeof path, "/proc/%d/stat", run_ranks.peer_pids[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t got = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[got] = '\0';
        const char *after_name = strrchr(text, ')');   // (the name may hold spaces)
        double user, system;
        if (after_name && sscanf(after_name + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                                 "%lf %lf", &user, &system) == 2)
            ticks += user + system;
    }
    return ticks / (double)sysconf(_SC_CLK_TCK);
}

// ---- for the CUDA companion (ranks.h) ------------------------------------------------

int lab_ranks_launched(void) {
    return run_ranks.started;
}

int lab_rank(void) {
    return run_ranks.rank;
}

int lab_rank_count(void) {
    return run_ranks.size;
}

int lab_local_rank(void) {
    return run_ranks.local_rank;
}

void lab_ranks_broadcast(void *bytes, size_t count) {
#ifdef TRANSFORMER_MPI
    if (run_ranks.started)
        MPI_Bcast(bytes, (int)count, MPI_BYTE, 0, MPI_COMM_WORLD);
#else
    (void)bytes;
    (void)count;
#endif
}

uint64_t lab_rank_dropout_state(uint64_t run_state) {
    return rank_dropout_state(run_state, run_ranks.rank);
}

long lab_ranks_sum(long value) {
#ifdef TRANSFORMER_MPI
    if (run_ranks.started)
        MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
#endif
    return value;
}
