/* transformer.h: every type of transformer.c, and its public interface
 *
 * transformer.c is the Transformer of "Attention Is All You Need" (Vaswani et al., 2017),
 * encoder and decoder, forward pass, hand-derived backward pass and Adam, in plain C loops,
 * and the smallest program that trains it (Part II). This header holds the types both use:
 * the model's (the configuration, the tensors with their shapes, the batch, the model), the
 * program's (data, options, evaluation, a training run, the checkpoint's header), and the two
 * seams where a companion beside it (lab/, cuda/) plugs in: FastPath and TrainingCompute.
 *
 * BUILD
 *     cc -O3 -march=native -fopenmp transformer.c -lm -o transformer_minimal
 *                   transformer.c alone (train, decode) on every core, its dot products in
 *                   vector lanes; anywhere: cc -O2 transformer.c -lm, one core and slower
 *     make          ./transformer, the lab's program (lab/lab.c includes transformer.c): the
 *                   fast path, real text, §5.1 subwords, --resume and the instruments
 *                   (OpenMP on; `make OPENMP=0` for none)
 *     make demo     builds, trains the copy task, decodes held-out examples
 *     make test     builds and runs the tests
 *     make debug    -O0 -g, transformer.c alone without OpenMP: for gdb
 *
 * USE (as a library: compile transformer.c with -DTRANSFORMER_NO_MAIN)
 *     TransformerConfig config = transformer_default_config();
 *     config.vocab_size = 100; ...
 *     Transformer model;
 *     const char *error = transformer_build(&model, &config, seed);
 *     if (error) { fprintf(stderr, "%s\n", error); exit(1); }
 *     for (step = 1; ...) {
 *         model.training = 1;                    // dropout on
 *         real loss = transformer_train_step(&model, &batch, warmup_steps, 1.0);
 *     }                      // forward, zero_grad, backward, eq. 3's rate, Adam
 *     transformer_free(&model);
 *
 * READ
 *     transformer.c from the top: Part I is the model, building blocks first, each section
 *     headed by the paper's (§3 ... §6.1); every layer is a *_forward function followed by
 *     its *_backward, arguments in the order outputs, inputs, sizes. Part II is the program.
 *     NOTES.md gives a reading path, maps every equation to its function and gives the
 *     backward derivations.
 *
 * The number type `real` is float; compiling with -DTRANSFORMER_DOUBLE makes it double
 * everywhere, which the gradient checks use.
 */
#ifndef TRANSFORMER_H
#define TRANSFORMER_H

#include <stddef.h>
#include <stdint.h>

// libm's e^x, ln x and square root in the precision of `real`
#ifdef TRANSFORMER_DOUBLE
typedef double real;
#define real_exp exp
#define real_log log
#define real_sqrt sqrt
#else
typedef float real;
#define real_exp expf
#define real_log logf
#define real_sqrt sqrtf
#endif

// The four special tokens every vocabulary starts with.
enum { TOKEN_PAD = 0, TOKEN_BOS = 1, TOKEN_EOS = 2, TOKEN_UNK = 3, NUM_SPECIAL_TOKENS = 4 };

// §3.5: the positions are sinusoids, or (Table 3, row E) a learned table.
enum { POSITIONAL_SINUSOID = 0, POSITIONAL_LEARNED = 1 };

// ----------------------------------------------------------------------------
// The model's sizes (Table 3 of the paper names them N, d_model, d_ff, h, P_drop, eps_ls)

typedef struct {
    int n_layers;          // N: layers in the encoder, and again in the decoder
    int d_model;           // width of every sub-layer's output
    int d_ff;              // inner width of the feed-forward network (§3.3)
    int n_heads;           // h: attention heads; d_k = d_v = d_model / h
    int vocab_size;        // shared source/target vocabulary (§3.4), specials included
    int max_len;           // longest sentence (positional-encoding rows)
    int positional;        // POSITIONAL_SINUSOID (§3.5, the default) or POSITIONAL_LEARNED
    float dropout;         // P_drop (§5.4)
    float label_smoothing; // eps_ls (§5.4)
    float layer_norm_eps;  // not in the paper; PyTorch's default 1e-5
} TransformerConfig;

// The limits transformer_config_check enforces, so that no size product
// overflows and every allocation stays reasonable.
#define TRANSFORMER_MAX_LAYERS 64
#define TRANSFORMER_MAX_WIDTH 16384    // d_model and d_ff
#define TRANSFORMER_MAX_VOCAB 1000000
#define TRANSFORMER_MAX_LEN 4096

// ----------------------------------------------------------------------------
// All parameters, in one allocation with named pointers into it, in this order (checkpoints
// keep it). Each per-layer tensor holds all N layers, layer 0 first. Weights are stored as
// PyTorch stores them, (out_features, in_features): a linear layer computes y = x W^T + b.
// Shapes: L layers, C = d_model, F = d_ff, V vocabulary.

typedef struct {
    real *embedding;           // (V, C)        shared: source, target, pre-softmax (§3.4)
    real *position_embedding;  // (max_len, C)  learned positions (Table 3, row E); else empty
    // the encoder (§3.1)
    real *enc_qkv_w;           // (L, 3C, C)    W^Q, W^K, W^V stacked as rows (§3.2.2)
    real *enc_qkv_b;           // (L, 3C)
    real *enc_out_w;           // (L, C, C)     W^O
    real *enc_out_b;           // (L, C)
    real *enc_ln1_g;           // (L, C)        the layer norm after self-attention: gain
    real *enc_ln1_b;           // (L, C)        ... and bias
    real *enc_ff1_w;           // (L, F, C)     W_1 (§3.3)
    real *enc_ff1_b;           // (L, F)
    real *enc_ff2_w;           // (L, C, F)     W_2
    real *enc_ff2_b;           // (L, C)
    real *enc_ln2_g;           // (L, C)        the layer norm after the FFN
    real *enc_ln2_b;           // (L, C)
    // the decoder (§3.1)
    real *dec_self_qkv_w;      // (L, 3C, C)    masked self-attention
    real *dec_self_qkv_b;      // (L, 3C)
    real *dec_self_out_w;      // (L, C, C)
    real *dec_self_out_b;      // (L, C)
    real *dec_ln1_g;           // (L, C)
    real *dec_ln1_b;           // (L, C)
    real *dec_cross_qkv_w;     // (L, 3C, C)    encoder-decoder attention: rows 0..C-1 make the
    real *dec_cross_qkv_b;     // (L, 3C)       queries from the decoder, rows C..3C-1 the keys
    real *dec_cross_out_w;     // (L, C, C)     and values from the encoder's output
    real *dec_cross_out_b;     // (L, C)
    real *dec_ln2_g;           // (L, C)
    real *dec_ln2_b;           // (L, C)
    real *dec_ff1_w;           // (L, F, C)
    real *dec_ff1_b;           // (L, F)
    real *dec_ff2_w;           // (L, C, F)
    real *dec_ff2_b;           // (L, C)
    real *dec_ln3_g;           // (L, C)
    real *dec_ln3_b;           // (L, C)
} ParameterTensors;

enum { NUM_PARAMETER_TENSORS = 32 };   // the fields above

// One layer's views of the parameters (or of their gradients: the same layout), as the
// layers take them: each pointer is layer l's part of a tensor above.

typedef struct {          // one multi-head attention (§3.2.2)
    real *qkv_w;          // (3C, C)  W^Q, W^K, W^V stacked
    real *qkv_b;          // (3C)
    real *out_w;          // (C, C)   W^O
    real *out_b;          // (C)
} AttentionParams;

typedef struct {          // one feed-forward network (§3.3)
    real *w1;             // (F, C)
    real *b1;             // (F)
    real *w2;             // (C, F)
    real *b2;             // (C)
} FeedForwardParams;

typedef struct {          // one layer norm
    real *gain;           // (C)
    real *bias;           // (C)
} LayerNormParams;

typedef struct {
    AttentionParams self_attn;
    LayerNormParams ln1;
    FeedForwardParams ffn;
    LayerNormParams ln2;
} EncoderLayerParams;

typedef struct {
    AttentionParams self_attn;
    LayerNormParams ln1;
    AttentionParams cross_attn;
    LayerNormParams ln2;
    FeedForwardParams ffn;
    LayerNormParams ln3;
} DecoderLayerParams;

// ----------------------------------------------------------------------------
// Everything the forward pass computes, kept for the backward pass and for anyone who wants
// to look; and the gradient of the loss with respect to each of them, in a second set of the
// same structs (Transformer.grads_acts): grads_acts.enc[l].ffn.hidden is dL/d(acts.enc[l].
// ffn.hidden). Tensors only the forward pass needs (dropout masks, attention probabilities, a
// norm's sums) have no gradient: their pointers there are NULL.
// Shapes: B sentences, S padded source length, T padded target length, NH heads. In a layer
// of the encoder the rows are (B, S), in the decoder (B, T).

typedef struct {          // one multi-head attention (§3.2.2), and its input's projections
    real *qkv;            // (B, T, 3C)  self-attention: q | k | v of each position (else NULL)
    real *q;              // (B, T, C)   encoder-decoder attention: the queries ...
    real *kv;             // (B, S, 2C)  ... and the keys | values of the memory (else NULL)
    real *att;            // (B, NH, T, keys)  the attention probabilities, softmax(q k^T/√d_k)
    real *heads;          // (B, T, C)   Concat(head_1, ..., head_h)
    real *out;            // (B, T, C)   Concat(...) W^O + b^O
} AttentionActs;

typedef struct {          // one feed-forward network (§3.3)
    real *hidden;         // (B, T, F)   max(0, x W_1^T + b_1)
    real *out;            // (B, T, C)   hidden W_2^T + b_2
} FeedForwardActs;

typedef struct {          // one "Add & Norm" (Figure 1): out = LayerNorm(x + Dropout(sublayer))
    real *mask;           // (B, T, C)   the dropout mask: 0 or 1/(1 - P_drop)
    real *res;            // (B, T, C)   x + sublayer * mask
    real *out;            // (B, T, C)   LayerNorm(res): the sub-layer's output
    real *mean;           // (B, T)      each row's mean ...
    real *rstd;           // (B, T)      ... and 1/sqrt(variance + eps)
} AddNormActs;

typedef struct {
    AttentionActs self_attn;
    AddNormActs norm1;
    FeedForwardActs ffn;
    AddNormActs norm2;    // norm2.out: the layer's output; the last layer's is the memory
} EncoderLayerActs;

typedef struct {
    AttentionActs self_attn;
    AddNormActs norm1;
    AttentionActs cross_attn;
    AddNormActs norm2;
    FeedForwardActs ffn;
    AddNormActs norm3;    // norm3.out: the layer's output; the last layer's feeds the softmax
} DecoderLayerActs;

typedef struct {
    real *enc_embedded;      // (B, S, C)  E[token] * sqrt(C) + PE
    real *enc_emb_mask;      // (B, S, C)  its dropout mask
    real *enc_x0;            // (B, S, C)  the input of encoder layer 0
    EncoderLayerActs *enc;   // (L)        the encoder's layers
    real *dec_embedded;      // (B, T, C)
    real *dec_emb_mask;      // (B, T, C)
    real *dec_x0;            // (B, T, C)
    DecoderLayerActs *dec;   // (L)        the decoder's layers
    real *logits;            // (B, T, V)
    real *probs;             // (B, T, V)  softmax(logits)
    real *token_loss;        // (B, T)     the label-smoothed loss at each target position
} ActivationTensors;

// ----------------------------------------------------------------------------
// A batch of sentence pairs, padded to the longest: src[b*S + s] for s < src_len[b] are
// real tokens, the rest TOKEN_PAD. Teacher forcing (§3.1): the decoder reads tgt_in = <s>
// y_1 .. y_{n-1} and must predict tgt_out = y_1 .. y_{n-1} </s>; positions t >= tgt_len[b]
// are padding and carry no loss.

typedef struct {
    int B, S, T;
    int *src;      // (B, S)
    int *src_len;  // (B)
    int *tgt_in;   // (B, T)
    int *tgt_out;  // (B, T)
    int *tgt_len;  // (B)
} Batch;

// Where scaled dot-product attention (transformer.c, §3.2.1) finds its rows: B sentences of
// Tq queries and Tk keys (and values), NH heads of d_k = C / NH numbers each. Queries,
// keys and values are read in place from the projections (§3.2.2): row i of q starts
// i * q_stride numbers on, row j of k and of v j * kv_stride numbers on.
typedef struct {
    int B;
    int Tq;
    int Tk;
    int C;
    int NH;
    int q_stride;
    int kv_stride;
} AttentionShape;

typedef struct {
    uint64_t state;   // xorshift64*'s state, never 0
} Rng;

// §5.3: 0.9, 0.98, 1e-9 (double: the double build uses these exactly, as PyTorch does)
typedef struct {
    double beta1;
    double beta2;
    double eps;
} AdamConfig;

typedef struct KeyValueCache KeyValueCache;   // the fast path's, in lab/fast_path.c

// The decoding state of R rows decoded side by side: R sentences (greedy) or the R beams of
// one sentence (beam search). transformer.c's decoder keeps each row's inputs so far and runs
// the decoder over all of them at each position; the fast path's keeps its key/value cache.
typedef struct {
    int rows;               // R
    int S;                  // padded source length
    int max_T;              // the most positions
    int *src_len;           // (R)         real source tokens of each row
    int *tgt_len;           // (R)         positions so far, t + 1
    int *history;           // (R, max_T)  each row's inputs <s> y_1 .. y_t, row r at r * max_T
    int *inputs;            // (R, t + 1)  the same, packed as a batch of t + 1 positions (and
                            //             decoder_reorder's room for the history's new order)
    real *logits;           // (R, V)      the next token's, from decoder_step
    KeyValueCache *cache;   // the fast path's key/value cache; NULL in transformer.c's
} Decoder;

typedef struct {
    TransformerConfig config;
    // the parameters, their gradients and Adam's two moments: four allocations of one layout
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    ParameterTensors params;
    ParameterTensors grads;
    real *params_memory;
    real *grads_memory;
    real *adam_m;
    real *adam_v;
    AdamConfig adam;
    long adam_step;             // steps taken so far; the next update is step adam_step+1
    real *positional_encoding;  // (max_len, C), §3.5: the sinusoids, or params.position_embedding
    // the activations and their gradients, allocated for the largest batch seen so far
    ActivationTensors acts;
    ActivationTensors grads_acts;
    real *acts_memory;
    real *grads_acts_memory;
    int cap_B, cap_S, cap_T;    // the batch shape the buffers were sized for
    int B, S, T;                // the shape of the last forward pass
    int training;               // 1: dropout on (§5.4); 0: evaluation
    Rng dropout_rng;
    real loss;                  // of the last forward pass
    int num_target_tokens;      // non-padding target tokens in the last batch
} Transformer;

TransformerConfig transformer_default_config(void);
const char *transformer_config_check(const TransformerConfig *config);
const char *transformer_build(Transformer *model, const TransformerConfig *config, uint64_t seed);
void transformer_free(Transformer *model);
const char *batch_check(const Batch *batch, const TransformerConfig *config);
real transformer_forward(Transformer *model, const Batch *batch);
void transformer_zero_grad(Transformer *model);
void transformer_backward(Transformer *model, const Batch *batch);
double transformer_learning_rate(long step, int d_model, int warmup_steps, double factor);
void adam_update(Transformer *model, double learning_rate);
// One training step: transformer_forward, transformer_zero_grad, transformer_backward,
// then adam_update at eq. 3's rate for step adam_step + 1. Returns the loss.
real transformer_train_step(Transformer *model, const Batch *batch, int warmup_steps,
                            double lr_factor);

// ----------------------------------------------------------------------------
// Where the training steps of `train` and `bench` run: the loop calls the model through
// transformer_training, which is transformer.c's own (transformer_train_step) unless a
// program sets it to another. The CUDA companion (cuda/transformer_cuda.cu) sets it to a
// GPU's, which keeps its own copy of the parameters and Adam's moments: begin copies the host
// model's there (after building or loading it) and to_host copies them, and the gradients,
// back (before an evaluation or a checkpoint). Everything else (data, decoding, checkpoints)
// runs on the host.
typedef struct {
    const char *name;                      // printed by train and bench
    void (*begin)(Transformer *model);
    // as transformer_train_step
    real (*train_step)(Transformer *model, const Batch *batch, int warmup_steps,
                       double lr_factor);
    void (*to_host)(Transformer *model);
} TrainingCompute;
extern const TrainingCompute transformer_cpu_training;
extern const TrainingCompute *transformer_training;
// The key of the model's next dropout mask (dropout_mask draws it the same way),
// for a program that draws its masks itself.
uint64_t transformer_dropout_key(Transformer *model);

// ----------------------------------------------------------------------------
// Decoding (§6.1): the encoder runs once per sentence, the decoder once per position (over
// the positions so far, or, with the FastPath hooks, with a key/value cache). Outputs never
// contain <pad>, <s> or </s>; at most transformer_decode_limit tokens (source length + 50,
// and no more than max_len).

int transformer_decode_limit(const Transformer *model, int src_len);
// One sentence; returns the output length (out holds transformer_decode_limit tokens), and
// *score (if not NULL) gets log P(output) / ((5 + length) / 6)^alpha, </s> counted in length.
// beam_size 1 is greedy decoding.
int transformer_beam_search(Transformer *model, int *out, double *score, const int *src,
                            int src_len, int beam_size, double alpha);

// ----------------------------------------------------------------------------
// The program (transformer.c, Part II): its vocabulary, command line, data, evaluation and
// training run.

// §3.4: one vocabulary for source and target. A hash table finds a token's id.
typedef struct {
    char **words;     // (size) id -> the token's text
    int size;
    int capacity;
    int *slots;       // (num_slots) the ids by their text's hash, -1 where empty
    int num_slots;    // 2 * capacity: the table is at most half full
} Vocabulary;

// FLAG takes no value: it sets an int to 1
typedef enum { OPTION_INT, OPTION_NUMBER, OPTION_TEXT, OPTION_FLAG } OptionKind;

typedef struct {
    const char *name;     // "--steps"
    OptionKind kind;
    void *value;          // int *, double * or const char **
    double min, max;      // the accepted range of a number
    int above_min;        // 1: the value must be > min (not >=)
    const char *help;
    int seen;             // given on this command line
} Option;

#define INT_OPTION(name, value, lo, hi, help) { name, OPTION_INT, value, lo, hi, 0, help, 0 }
#define NUMBER_OPTION(name, value, lo, hi, above, help) \
    { name, OPTION_NUMBER, value, lo, hi, above, help, 0 }
#define TEXT_OPTION(name, value, help) { name, OPTION_TEXT, value, 0, 0, 0, help, 0 }
#define FLAG_OPTION(name, value, help) { name, OPTION_FLAG, value, 0, 1, 0, help, 0 }

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);   // argv[0] is the command's name
    const char *summary;
} Command;

#define MAX_UNKNOWN_WARNINGS 5          // unknown tokens warned of, for one input (TextSource)
#define MAX_TRAINING_STEPS 1000000000   // the most --steps
typedef unsigned long long u64;         // for printf's %llu

// Where a sentence came from, for messages: "data.tsv:12", "stdin:3", "argument 2".
typedef struct {
    char where[300];
    int warnings;             // unknown-token warnings printed so far for this input
    long unknown;             // tokens read as <unk>
    const char *reserved;     // the special token's text that made tokenize refuse the sentence
} TextSource;

typedef struct {
    size_t src, tgt;          // offsets of the tokens in Dataset.tokens
    int src_len, tgt_len;     // tokens, without <s> or </s>
    int line;                 // line in its file (1 = first), 0 for generated data
} SentencePair;

typedef struct {
    SentencePair *pairs;
    int count, capacity;
    int *tokens;
    size_t num_tokens, tokens_capacity;
    int longest_src, longest_tgt;
} Dataset;

// A batch of an epoch's plan: the pairs order[start .. start + count - 1]
typedef struct {
    int start;
    int count;
} BatchSpan;

typedef struct {
    int *order;          // (pairs) pair indices, grouped by length
    BatchSpan *spans;    // the batches, in the order they are visited
    int num_spans;
} EpochPlan;

// A Batch whose arrays are its own (batch_fill, batch_buffer_free)
typedef struct {
    Batch batch;
    long tokens;   // source and target positions without padding, for tokens/s
} BatchBuffer;

// Held-out sentences decoded and compared with their references (evaluate)
typedef struct {
    long correct, compared;  // token accuracy = correct / compared
    int exact, sentences;
    int *output;             // (sentences, stride) the decoded outputs
    int *output_len;         // (sentences)
    int stride;
} Evaluation;

// train's flags and their defaults (transformer.c's train_defaults)
typedef struct {
    const char *task;         // copy or reverse
    int words;                // the task's words are the numbers 0..words-1,
    int min_length;           // in sequences of min_length to max_length of them:
    int max_length;
    int train_size;           // train_size pairs to learn from, valid_size held out
    int valid_size;
    int layers;               // Table 3's N, d_model, d_ff and h
    int d_model;
    int d_ff;
    int heads;
    int positions;            // max_len (0: the longest sentence + 50, §6.1)
    int positional;           // POSITIONAL_SINUSOID (§3.5) or POSITIONAL_LEARNED (Table 3, E)
    double dropout;           // P_drop and eps_ls (§5.4)
    double label_smoothing;
    int steps;                // training steps
    int warmup;               // eq. 3's warmup_steps
    int batch_tokens;         // the most tokens of a batch, source + target, padding included
    int seed;                 // of the data, the initial weights and dropout
    double lr;                // the peak learning rate: eq. 3 scaled to reach it at warmup
    const char *checkpoint;   // the file saves go to (NULL: runs/TASK.ckpt)
    int eval_every;           // an evaluation and a save every eval_every steps
    int log_every;            // a progress line every log_every steps (0: none)
    int eval_size;            // held-out pairs decoded at each evaluation (0: all)
    int show;                 // held-out examples printed at the end
} TrainOptions;

// A training run: its options, data, model and place in the data.
typedef struct {
    TrainOptions opt;
    Vocabulary vocab;
    Dataset train;
    Dataset valid;
    Transformer model;
    Rng data_rng;                 // draws each epoch's batch order
    EpochPlan plan;               // the current epoch's batches
    long epoch;                   // epochs begun (the first is 1)
    int epoch_batches;            // batches of the current epoch trained on
    BatchBuffer batch;
    char checkpoint_path[4096];
    char data_name[300];          // for messages: "copy task"
    real loss;                    // the step just taken: its loss and learning rate
    double lr;
} TrainRun;

// The model's checkpoint begins with this header, as it lies in memory (dev/FORMATS.md).
typedef struct {
    char magic[4];               // "TCKP"
    uint32_t version;            // 4
    uint32_t real_bytes;         // 4 (float) or 8 (double)
    uint32_t subwords;           // 1: the tokens are §5.1 subwords (another program cuts text)
    TransformerConfig config;    // its 7 ints and 3 floats
    uint64_t vocab_bytes;        // the vocabulary's bytes
    uint64_t model_bytes;        // the model's, header to checksum
} CheckpointHeader;

#ifndef __cplusplus   // (a C11 assertion; nvcc reads this header as C++ for the CUDA companion)
_Static_assert(sizeof(CheckpointHeader) == 72, "the header's fields, one after another");
#endif

// ----------------------------------------------------------------------------
// Where a faster program plugs in (the other seam is transformer_training, above).

// The products that take nearly all of a training step's time, and §6.1's decoder. Each product
// is called in place of transformer.c's function of the same name when it is set; so is
// decoder_begin, and the other three in place of theirs for a decoding decoder_begin began.
typedef struct {
    void (*linear_forward)(real *out, const real *inp, const real *weight, const real *bias,
                           int N, int IC, int OC);
    void (*linear_backward)(real *dinp, real *dweight, real *dbias, const real *dout,
                            const real *inp, const real *weight, int N, int IC, int OC);
    void (*attention_forward)(real *out, real *att, const real *q, const real *k, const real *v,
                              const int *key_len, int causal, AttentionShape shape);
    void (*attention_backward)(real *dq, real *dk, real *dv, const real *dout, const real *att,
                               const real *q, const real *k, const real *v,
                               AttentionShape shape);
    // decoding with a key/value cache: the weights stay as they are from begin to end, so the
    // fast path may use copies of them arranged its way. decoder_begin chooses; a decoding
    // that began with the cache (decoder.cache set) goes on with it, a decoding without one
    // without it, whatever the hooks are set to in between
    void (*decoder_begin)(Decoder *decoder, Transformer *model, const int *src,
                          const int *src_len, int B, int S, int rows, int max_T);
    void (*decoder_step)(Decoder *decoder, Transformer *model, const int *tokens, int t,
                         int rows);
    void (*decoder_reorder)(Decoder *decoder, const int *parent, int rows, int positions);
    void (*decoder_end)(Decoder *decoder);
} FastPath;

// ----------------------------------------------------------------------------
// The command line: transformer_main runs transformer.c's commands, train and decode (it is
// main unless compiled with -DTRANSFORMER_NO_MAIN), and returns the exit status.
int transformer_main(int argc, char **argv);

#endif // TRANSFORMER_H
