#!/usr/bin/python3
"""Time the training step of transformer.c's model in PyTorch, for `make bench`.

The same model, batch and step as `./transformer bench` (dev/PERFORMANCE.md,
"Method"): PyTorch's own nn.TransformerEncoderLayer / DecoderLayer
(batch_first, post-norm, ReLU) called layer by layer, as dev/make_reference.py
builds them, with one shared embedding matrix (source, target and the tied
output projection), embeddings x sqrt(d_model) + sinusoidal positions,
F.cross_entropy with label smoothing and ignore_index=0, and Adam with betas
(0.9, 0.98), eps 1e-9 under the paper's learning-rate schedule.

Dropout is where the paper (and transformer.c) put it and nowhere else: on the
sum of embeddings and positions in both stacks, and on every sub-layer's output
before the residual add. PyTorch's layers also drop attention probabilities and
the FFN's hidden activations; both are switched off here (the attention
modules' `dropout` set to 0, the layers' inner `dropout` replaced by Identity).

    OMP_NUM_THREADS=2 dev/.venv/bin/python dev/bench_pytorch.py --layers 2 --d-model 128 \
        --d-ff 512 --heads 4 --vocab 1000 --batch 32 --src-len 32 --tgt-len 32 --threads 2 [--compile]

prints the same fields as `./transformer bench`; --json prints them as one line.
Run it with the interpreter whose PyTorch is to be timed: dev/.venv/bin/python
(PyTorch 2.x from PyPI, `make bench-setup`) or Debian's /usr/bin/python3 with
python3-torch (1.13). `--check-setup` only checks that PyTorch imports and that
torch.compile runs a small function forward and backward (make bench-setup).

--compile times the step with torch.compile (default inductor backend): the
forward pass and the loss are one compiled function (AOTAutograd compiles its
backward with it); loss.backward() runs that compiled backward, zero_grad and
Adam's step stay eager, as in PyTorch's own tutorials. Compilation happens in
the first warm-up step; the JSON's "first_step_s" is that step's time
(inductor keeps compiled kernels on disk, /tmp/torchinductor_$USER, so a
second process compiles faster). With --decode --kv-cache, --compile compiles
the encoder (with the memory's keys and values) and the decoding of one
position over a key/value cache of fixed length T (the positions not yet
decoded masked out), so that one graph serves every position; it checks that
it chooses the same tokens as the eager cached decoding (in 90% of the
sentences at least: the compiled kernels round differently, and a near tie
between two words can go the other way; "sentences_as_eager" in the JSON). --decode without
--kv-cache cannot be compiled usefully (every prefix length is a new shape)
and is refused.

--decode times greedy decoding of the batch's sources instead, T tokens each,
in eval mode under no_grad: the encoder once, then one token per position,
the most likely (never <pad> or <s>). The </s> row of the embedding is
zeroed, as `./transformer bench --decode` does, though here no sentence stops
early. Two ways:
  --decode             as PyTorch's layers allow it: at every position the
                       decoder layers run over the whole prefix (they keep no
                       key/value cache) and the last position's logits are used;
  --decode --kv-cache  the same layers' weights applied one position at a time,
                       with each layer's keys and values kept (self-attention)
                       or computed once (cross-attention), as transformer.c
                       decodes. Before timing, the script checks that both ways
                       choose the same tokens.

The BLAS: PyPI's PyTorch 2.x for x86_64 carries MKL (its float products) and
oneDNN inside; the JSON field "blas" gives what torch.__config__.show() says.
Debian's PyTorch's products go through the system's libblas.so.3, OpenBLAS
with libopenblas0-openmp; for that one only, the following applies. OpenBLAS picks its kernels from the CPU's model
number, and a release older than the CPU falls back to plain SSE3 kernels
("Prescott"): Debian 12's OpenBLAS 0.3.21 does so on Intel's Emerald Rapids,
where its products then run 3.5x slower. An OPENBLAS_CORETYPE inherited from
the environment can do the same: one machine here set Haswell (AVX2) for every
process on an AMD Zen 5 with AVX-512, where OpenBLAS's products then run at
half their speed. So the script asks OpenBLAS, in a child process that
inherits the environment, before PyTorch loads it, which kernels it uses, and
if they use narrower vectors than the CPU's flags allow (older than AVX2,
AVX2, AVX-512), sets OPENBLAS_CORETYPE to the widest; kernels whose name it
does not know are kept. The JSON field "blas" says what was used and why.

The FLOP count (training_step_flops, the same as lab/lab.c's) is in
dev/BENCH.md; --count-flops prints it beside the count of PyTorch's
torch.utils.flop_counter.FlopCounterMode for one forward and backward pass.
"""
import argparse
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

# OpenBLAS kernels (the names openblas_get_corename returns; OPENBLAS_CORETYPE
# takes them in any case) by their vectors: older than AVX2, AVX2, AVX-512
PRE_AVX2_CORES = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "sandybridge",
                  "katmai", "coppermine", "northwood", "banias", "opteron", "opteron_sse3",
                  "barcelona", "bobcat", "bulldozer", "piledriver", "steamroller", "excavator",
                  "nano", "generic", "unknown"}
AVX2_CORES = {"haswell", "zen"}
AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}
PROBE = ("import ctypes; lib = ctypes.CDLL('libblas.so.3'); f = getattr(lib, 'openblas_get_corename', None); "
         "f is not None and setattr(f, 'restype', ctypes.c_char_p); print(f().decode() if f else 'not OpenBLAS')")


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def kernel_level(name):
    """0: kernels older than AVX2, 1: AVX2, 2: AVX-512; None for a name not listed."""
    name = name.lower()
    if name in PRE_AVX2_CORES:
        return 0
    if name in AVX2_CORES:
        return 1
    if name in AVX512_CORES:
        return 2
    return None


def best_kernels(flags):
    """The OpenBLAS kernels with the widest vectors the CPU's flags allow (None: no AVX2)."""
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"} <= flags:
        return "Cooperlake"
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def choose_openblas_kernels():
    """Sets OPENBLAS_CORETYPE when the kernels OpenBLAS would use (its own choice,
    or the one an OPENBLAS_CORETYPE inherited from the environment makes it take)
    use narrower vectors than the CPU has (see the module's docstring). Returns a
    line for the "blas" field."""
    inherited = os.environ.get("OPENBLAS_CORETYPE")
    how = "its own choice" if inherited is None else f"from OPENBLAS_CORETYPE={inherited} in the environment"
    try:   # the child inherits the environment: it reports the kernels really used
        detected = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                                  timeout=60).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return f"libblas.so.3 (not probed; {how})"
    if detected == "not OpenBLAS":
        return "libblas.so.3 is not OpenBLAS (install libopenblas0-openmp)"
    best, level = best_kernels(cpu_flags()), kernel_level(detected)
    if best is None or level is None or level >= kernel_level(best):
        return f"OpenBLAS {detected} kernels ({how})"
    os.environ["OPENBLAS_CORETYPE"] = best
    return f"OpenBLAS {best} kernels (OPENBLAS_CORETYPE set here: {detected}, {how}, has narrower vectors)"


def system_torch():
    """True when the torch this interpreter would import is Debian's python3-torch,
    whose products go through the system's libblas.so.3."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    return spec is not None and spec.origin is not None and spec.origin.startswith("/usr/lib/python3/")


OPENBLAS = choose_openblas_kernels() if system_torch() else None

try:
    import torch  # noqa: E402  (after OPENBLAS_CORETYPE is set)
except ModuleNotFoundError as e:   # not installed; a PyTorch that is there but fails says why itself
    if e.name != "torch":
        raise
    if sys.executable.startswith("/usr/bin/"):
        sys.exit(f"error: {sys.argv[0]} needs PyTorch for {sys.executable}: "
                 "apt-get install python3-torch libopenblas0-openmp (dev/BENCH.md)")
    sys.exit(f"error: {sys.argv[0]} needs PyTorch for {sys.executable}: run `make bench-setup` (dev/BENCH.md)")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

PAD, BOS, EOS = 0, 1, 2


def describe_kernels():
    """One line: the BLAS PyTorch's float products use, oneDNN, the CPU kernels' vectors
    (from torch.__config__.show())."""
    text = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", text)
    parts = [OPENBLAS if OPENBLAS is not None else f"BLAS {blas.group(1) if blas else 'unknown'}"]
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", text)
    if blas and blas.group(1) == "mkl" and mkl:
        parts[0] = f"MKL {mkl.group(1)}"
    onednn = re.search(r"(?:MKL-DNN|oneDNN)\s+v?([\d.]+)", text)
    if torch.backends.mkldnn.is_available():
        parts.append(f"oneDNN {onednn.group(1)}" if onednn else "oneDNN")
    else:
        parts.append("no oneDNN")
    capability = re.search(r"CPU capability usage: (\w+)", text)
    if capability:
        parts.append(f"{capability.group(1)} kernels")
    return ", ".join(parts)


def rss_kb():
    """The resident set size now, in kB (from /proc/self/status), or -1."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def positional_encoding(n_pos, C):
    """Interleaved sin/cos (paper section 3.5), as transformer.c computes it."""
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, C, 2, dtype=torch.float64)[None, :]
    angle = pos / torch.pow(10000.0, two_i / C)
    pe = torch.zeros(n_pos, C, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : C // 2])
    return pe.float()


class BenchModel(nn.Module):
    def __init__(self, L, C, F_, H, V, max_len, dropout):
        super().__init__()
        self.C = C
        self.embedding = nn.Parameter(torch.randn(V, C) * C ** -0.5)
        self.enc = nn.ModuleList([
            nn.TransformerEncoderLayer(C, H, F_, dropout=dropout, activation="relu",
                                       batch_first=True, norm_first=False)
            for _ in range(L)])
        self.dec = nn.ModuleList([
            nn.TransformerDecoderLayer(C, H, F_, dropout=dropout, activation="relu",
                                       batch_first=True, norm_first=False)
            for _ in range(L)])
        # Only the paper's dropout: none on attention probabilities, none in the FFN.
        for layer in self.enc:
            layer.self_attn.dropout = 0.0
            layer.dropout = nn.Identity()
        for layer in self.dec:
            layer.self_attn.dropout = 0.0
            layer.multihead_attn.dropout = 0.0
            layer.dropout = nn.Identity()
        self.embedding_dropout = nn.Dropout(dropout)
        self.register_buffer("pe", positional_encoding(max_len, C), persistent=False)

    def embed(self, tokens):
        n = tokens.shape[1]
        return self.embedding_dropout(self.embedding[tokens] * math.sqrt(self.C) + self.pe[:n])

    def encode(self, src, src_pad):
        x = self.embed(src)
        for layer in self.enc:
            x = layer(x, src_key_padding_mask=src_pad)
        return x

    def decode(self, tgt_in, tgt_pad, memory, src_pad, causal):
        y = self.embed(tgt_in)
        for layer in self.dec:
            y = layer(y, memory, tgt_mask=causal, tgt_key_padding_mask=tgt_pad,
                      memory_key_padding_mask=src_pad)
        return y @ self.embedding.t()

    def forward(self, src, src_pad, tgt_in, tgt_pad, causal):
        return self.decode(tgt_in, tgt_pad, self.encode(src, src_pad), src_pad, causal)


def most_likely(logits):
    """The next token of every row: the largest logit, never <pad> or <s>."""
    logits[:, PAD] = -math.inf
    logits[:, BOS] = -math.inf
    return logits.argmax(dim=-1)


def greedy_decode(model, src, src_pad, T):
    """T tokens for every sentence of src, each the most likely after the ones before."""
    B = src.shape[0]
    memory = model.encode(src, src_pad)
    ys = torch.full((B, 1), BOS, dtype=torch.long)
    for t in range(T):
        causal = torch.triu(torch.ones(t + 1, t + 1, dtype=torch.bool), diagonal=1)
        no_pad = torch.zeros(B, t + 1, dtype=torch.bool)
        logits = model.decode(ys, no_pad, memory, src_pad, causal)[:, -1]
        ys = torch.cat([ys, most_likely(logits)[:, None]], dim=1)
    return ys[:, 1:]


def cross_attention_and_ffn(layer, y, ck, cv, memory_mask, scale):
    """Sub-layers 2 and 3 of a decoder layer at one position, for every
    sentence: attention over the memory's keys and values ck, cv (B, H, S,
    dk), computed once per batch, then the FFN. y is (B, C)."""
    B, C = y.shape
    H = ck.shape[1]
    ca = layer.multihead_attn
    q = F.linear(y, ca.in_proj_weight[:C], ca.in_proj_bias[:C]).view(B, H, 1, C // H)
    scores = ((q * scale) @ ck.transpose(-1, -2)).masked_fill(memory_mask, -math.inf)
    a = (scores.softmax(dim=-1) @ cv).reshape(B, C)
    y = layer.norm2(y + ca.out_proj(a))
    return layer.norm3(y + layer.linear2(F.relu(layer.linear1(y))))


def greedy_decode_cached(model, src, src_pad, T):
    """The same tokens as greedy_decode, one position at a time: every decoder
    layer keeps the keys and values of the positions before (self-attention)
    and computes those of the memory once (cross-attention). The layers'
    own weights, applied as nn.MultiheadAttention and the layers' forward do
    in eval mode (post-norm, ReLU, no dropout)."""
    B, C = src.shape[0], model.C
    memory = model.encode(src, src_pad)
    H = model.dec[0].self_attn.num_heads
    dk = C // H
    scale = 1.0 / math.sqrt(dk)

    def heads(x):                      # (B, n, C) -> (B, H, n, dk)
        return x.view(B, -1, H, dk).transpose(1, 2)

    cross = []
    for layer in model.dec:
        w, b = layer.multihead_attn.in_proj_weight, layer.multihead_attn.in_proj_bias
        cross.append((heads(F.linear(memory, w[C:2 * C], b[C:2 * C])),
                      heads(F.linear(memory, w[2 * C:], b[2 * C:]))))
    keys = [torch.empty(B, H, T, dk) for _ in model.dec]
    values = [torch.empty(B, H, T, dk) for _ in model.dec]
    memory_mask = src_pad[:, None, None, :]
    token = torch.full((B,), BOS, dtype=torch.long)
    out = torch.empty(B, T, dtype=torch.long)
    for t in range(T):
        y = model.embedding[token] * math.sqrt(C) + model.pe[t]             # (B, C)
        for layer, (ck, cv), k_cache, v_cache in zip(model.dec, cross, keys, values):
            sa = layer.self_attn
            q, k, v = F.linear(y, sa.in_proj_weight, sa.in_proj_bias).split(C, dim=-1)
            k_cache[:, :, t] = k.view(B, H, dk)
            v_cache[:, :, t] = v.view(B, H, dk)
            scores = (q.view(B, H, 1, dk) * scale) @ k_cache[:, :, :t + 1].transpose(-1, -2)
            a = (scores.softmax(dim=-1) @ v_cache[:, :, :t + 1]).reshape(B, C)
            y = layer.norm1(y + sa.out_proj(a))
            y = cross_attention_and_ffn(layer, y, ck, cv, memory_mask, scale)
        token = most_likely(y @ model.embedding.t())
        out[:, t] = token
    return out


def decode_setup(model, src, src_pad):
    """The encoder's output, and each decoder layer's cross-attention keys and
    values of it: (B, H, S, dk) each, computed once per batch."""
    B, C = src.shape[0], model.C
    H = model.dec[0].self_attn.num_heads
    memory = model.encode(src, src_pad)
    cross = []
    for layer in model.dec:
        w, b = layer.multihead_attn.in_proj_weight, layer.multihead_attn.in_proj_bias
        cross.append((F.linear(memory, w[C:2 * C], b[C:2 * C]).view(B, -1, H, C // H).transpose(1, 2),
                      F.linear(memory, w[2 * C:], b[2 * C:]).view(B, -1, H, C // H).transpose(1, 2)))
    return cross


def decode_position(model, token, t, cross, keys, values, src_pad):
    """One position of greedy_decode_cached for every sentence, written for
    torch.compile: the caches have the fixed length T and t is a tensor, so
    that every position runs the same graph; the positions after t are masked
    out of the self-attention (their scores -inf, their weights exactly 0).
    Writes position t's keys and values into the caches; returns the tokens."""
    B, C = token.shape[0], model.C
    H = model.dec[0].self_attn.num_heads
    dk = C // H
    scale = 1.0 / math.sqrt(dk)
    T = keys[0].shape[2]
    at_t = t.view(1)
    later = (torch.arange(T) > t)[None, None, None, :]
    y = model.embedding[token] * math.sqrt(C) + model.pe.index_select(0, at_t)
    memory_mask = src_pad[:, None, None, :]
    for layer, (ck, cv), k_cache, v_cache in zip(model.dec, cross, keys, values):
        sa = layer.self_attn
        q, k, v = F.linear(y, sa.in_proj_weight, sa.in_proj_bias).split(C, dim=-1)
        k_cache.index_copy_(2, at_t, k.view(B, H, 1, dk))
        v_cache.index_copy_(2, at_t, v.view(B, H, 1, dk))
        scores = ((q.view(B, H, 1, dk) * scale) @ k_cache.transpose(-1, -2)).masked_fill(later, -math.inf)
        a = (scores.softmax(dim=-1) @ v_cache).reshape(B, C)
        y = layer.norm1(y + sa.out_proj(a))
        y = cross_attention_and_ffn(layer, y, ck, cv, memory_mask, scale)
    return most_likely(y @ model.embedding.t())


class CompiledDecoder:
    """greedy_decode_cached with torch.compile: decode_setup and decode_position
    compiled (each once: the shapes do not change from one position or batch
    to the next), the loop over positions in Python."""

    def __init__(self, model):
        self.model = model
        self.setup = torch.compile(lambda src, src_pad: decode_setup(model, src, src_pad))
        self.position = torch.compile(
            lambda token, t, cross, keys, values, src_pad: decode_position(model, token, t, cross, keys,
                                                                           values, src_pad))

    def __call__(self, model, src, src_pad, T):
        B, C = src.shape[0], model.C
        H = model.dec[0].self_attn.num_heads
        cross = self.setup(src, src_pad)
        keys = [torch.zeros(B, H, T, C // H) for _ in model.dec]
        values = [torch.zeros(B, H, T, C // H) for _ in model.dec]
        token = torch.full((B,), BOS, dtype=torch.long)
        out = torch.empty(B, T, dtype=torch.long)
        for t in range(T):
            token = self.position(token, torch.tensor(t), cross, keys, values, src_pad)
            out[:, t] = token
        return out


def noam_lr(step, C, warmup=4000, factor=1.0):
    return factor * C ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def training_step_flops(L, C, F_, V, B, S, T):
    """The same count as training_step_flops in lab/lab.c (dev/PERFORMANCE.md)."""
    src, tgt = B * S, B * T
    encoder = 2 * src * (3 * C * C + C * C + 2 * C * F_) + 4 * src * S * C
    decoder = (2 * tgt * (3 * C * C + C * C + 2 * C * F_) + 4 * B * T * (T + 1) / 2 * C
               + 2 * tgt * (2 * C * C) + 2 * src * (2 * C * C) + 4 * tgt * S * C)
    output = 2 * tgt * C * V
    return 3 * (L * (encoder + decoder) + output)


def forward_loss(model, src, src_pad, tgt_in, tgt_pad, causal, tgt_out, label_smoothing):
    """The forward pass and the loss of a training step (torch.compile compiles this)."""
    logits = model(src, src_pad, tgt_in, tgt_pad, causal)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=PAD,
                           label_smoothing=label_smoothing)


def check_setup():
    """For make bench-setup: PyTorch imports, and torch.compile compiles a small
    model's forward and backward on the CPU and agrees with eager."""
    print(f"PyTorch {torch.__version__} in {sys.executable}; {describe_kernels()}; "
          f"CUDA build: {torch.version.cuda or 'no'}, GPU available: {torch.cuda.is_available()}")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 4))
    x = torch.randn(8, 16)

    def grads(fn):
        net.zero_grad(set_to_none=True)
        fn(x).square().mean().backward()
        return [q.grad.clone() for q in net.parameters()]

    start = time.perf_counter()
    compiled = grads(torch.compile(net))
    took = time.perf_counter() - start
    eager = grads(net)
    worst = max(float((c - e).abs().max()) for c, e in zip(compiled, eager))
    if worst > 1e-5:
        sys.exit(f"error: torch.compile's gradients differ from eager ones by {worst:g}")
    cxx = os.environ.get("CXX") or shutil.which("g++") or "no g++ found"
    print(f"torch.compile (inductor, C++ compiler {cxx}): "
          f"a small model's forward and backward compiled and run in {took:.1f} s, gradients as eager's "
          f"(largest difference {worst:.1g})")
    return 0


def count_flops(model, a, src, src_pad, tgt_in, tgt_pad, causal, tgt_out):
    """Prints training_step_flops beside what PyTorch's FlopCounterMode counts for
    one forward and backward pass of the same model and batch, operation by operation."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
        forward_loss(model, src, src_pad, tgt_in, tgt_pad, causal, tgt_out, a.label_smoothing).backward()
    counted = counter.get_total_flops()
    ours = training_step_flops(a.layers, a.d_model, a.d_ff, a.vocab, a.batch, a.src_len, a.tgt_len)
    B, T, C = a.batch, a.tgt_len, a.d_model
    masked = 3 * a.layers * 4 * B * C * (T * T - T * (T + 1) / 2)   # the causal mask's hidden pairs
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    print(f"FlopCounterMode, forward + backward: {counted * 1e-9:.4f} GFLOP "
          + ", ".join(f"{op} {n * 1e-9:.4f}" for op, n in sorted(by_op.items())))
    print(f"training_step_flops:                 {ours * 1e-9:.4f} GFLOP; with the causal mask's hidden "
          f"query-key pairs counted as PyTorch computes them: {(ours + masked) * 1e-9:.4f} GFLOP "
          f"(ratio to FlopCounterMode {(ours + masked) / counted:.6f})")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="custom", help="a name to print")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--tgt-len", type=int, default=32)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=0,
                   help="default: 10 for d_model >= 512, else 20; decoding: 3, else 10")
    p.add_argument("--decode", action="store_true", help="time greedy decoding instead of training")
    p.add_argument("--kv-cache", action="store_true",
                   help="with --decode: one position at a time, keys and values kept (as transformer.c)")
    p.add_argument("--compile", action="store_true", help="torch.compile (inductor): see the module's docstring")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="cpu",
                   help="cpu, or cuda: training on the GPU in fp32, TF32 off (make test-cuda, beside ./transformer_cuda bench)")
    p.add_argument("--foreach", action="store_true",
                   help="Adam's multi-tensor implementation on the CPU too (on a GPU it is PyTorch's default anyway)")
    p.add_argument("--check-setup", action="store_true",
                   help="only check that PyTorch and torch.compile work (make bench-setup)")
    p.add_argument("--count-flops", action="store_true",
                   help="only print the FLOP count beside PyTorch's FlopCounterMode's")
    a = p.parse_args(argv)
    if a.check_setup:
        return check_setup()
    if a.device != "cpu" and a.decode:
        p.error("--device cuda times training steps only")
    if a.device == "cuda":   # fp32 products, as cuda/transformer_cuda.cu's cuBLAS calls
        torch.backends.cuda.matmul.allow_tf32 = False
    if a.kv_cache and not a.decode:
        p.error("--kv-cache needs --decode")
    if a.compile and a.decode and not a.kv_cache:
        p.error("--compile --decode needs --kv-cache (the whole-prefix decoding changes shape at every position)")
    if a.compile and not hasattr(torch, "compile"):
        sys.exit(f"error: PyTorch {torch.__version__} has no torch.compile")
    if a.decode:
        steps = a.steps or (3 if a.d_model >= 512 else 10)
    else:
        steps = a.steps or (10 if a.d_model >= 512 else 20)
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    rss_before = rss_kb()

    L, C, F_, H, V, B, S, T = (a.layers, a.d_model, a.d_ff, a.heads, a.vocab,
                               a.batch, a.src_len, a.tgt_len)
    model = BenchModel(L, C, F_, H, V, max(S, T), a.dropout)
    model.train()
    # Adam as PyTorch runs it by default: on a GPU (foreach=None) its multi-tensor
    # kernels, a few launches for all parameters; on the CPU the loop over tensors
    # (dev/PERFORMANCE.md: --foreach was not faster there)
    foreach = True if a.foreach else (None if a.device == "cuda" else False)
    opt = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, foreach=foreach)
    # The synthetic batch: every sentence at its full length, random words.
    src = torch.randint(4, V, (B, S))
    tgt_out = torch.randint(4, V, (B, T))
    tgt_out[:, -1] = EOS
    tgt_in = torch.cat([torch.full((B, 1), BOS), tgt_out[:, :-1]], dim=1)
    src_pad = torch.zeros(B, S, dtype=torch.bool)    # no padding, but the masks are passed
    tgt_pad = torch.zeros(B, T, dtype=torch.bool)    # as a real batch needs them
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    if a.device != "cpu":
        model.to(a.device)
        src, tgt_in, tgt_out, src_pad, tgt_pad, causal = (x.to(a.device) for x in
                                                           (src, tgt_in, tgt_out, src_pad, tgt_pad, causal))
    if a.count_flops:
        return count_flops(model, a, src, src_pad, tgt_in, tgt_pad, causal, tgt_out)

    decode = greedy_decode_cached if a.kv_cache else greedy_decode
    loss_fn = forward_loss
    if a.compile:
        loss_fn = torch.compile(forward_loss)
        if a.decode:
            decode = CompiledDecoder(model)
    if a.decode:
        model.eval()
        with torch.no_grad():
            model.embedding[EOS].zero_()
            if a.kv_cache:   # the cached decoding must choose what the layers choose
                n, t = min(B, 4), min(T, 8)
                by_layers = greedy_decode(model, src[:n], src_pad[:n], t)
                by_cache = greedy_decode_cached(model, src[:n], src_pad[:n], t)
                if not torch.equal(by_layers, by_cache):
                    sys.exit(f"error: --kv-cache decoded {by_cache.tolist()} where the layers decoded "
                             f"{by_layers.tolist()}")


    if a.compile and a.decode:   # compiled decoding must choose what the eager cached decoding chooses
        with torch.no_grad():
            start = time.perf_counter()
            by_compiled = decode(model, src, src_pad, T)
            compile_s = time.perf_counter() - start
            by_eager = greedy_decode_cached(model, src, src_pad, T)
        # Compiled kernels round differently; a near tie between the two likeliest
        # words can then go the other way and the sentence continues differently.
        # A real difference (a wrong mask, say) changes most sentences.
        differ = int((by_compiled != by_eager).any(dim=1).sum())
        if differ > 0.1 * B:
            sys.exit(f"error: the compiled decoding chose other tokens than the eager one in {differ} of {B} "
                     "sentences")
    times = []
    loss = None
    first_step = 0.0
    cpu_start = 0.0
    for step in range(1, a.warmup + steps + 1):
        if step == a.warmup + 1:
            cpu_start = time.process_time()
        if a.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        if a.decode:
            with torch.no_grad():
                decode(model, src, src_pad, T)
        else:
            for g in opt.param_groups:
                g["lr"] = noam_lr(step, C)
            loss = loss_fn(model, src, src_pad, tgt_in, tgt_pad, causal, tgt_out, a.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if a.device == "cuda":   # the GPU's work done before the clock is read
                torch.cuda.synchronize()
        if step == 1:
            first_step = time.perf_counter() - start
        if step > a.warmup:
            times.append(time.perf_counter() - start)

    cpu_per_step = (time.process_time() - cpu_start) / steps
    median = statistics.median(times)
    flops = 0.0 if a.decode else training_step_flops(L, C, F_, V, B, S, T)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # kB on Linux
    result = {
        "impl": "pytorch", "mode": ("decode_cached" if a.kv_cache else "decode") if a.decode else "train",
        "config": a.config, "layers": L, "d_model": C, "d_ff": F_,
        "heads": H, "vocab": V, "dropout": a.dropout, "label_smoothing": a.label_smoothing,
        "batch": B, "src_len": S, "tgt_len": T, "threads": torch.get_num_threads(),
        "warmup": a.warmup, "steps": steps, "median_ms": median * 1e3, "min_ms": min(times) * 1e3,
        "cpu_ms": cpu_per_step * 1e3,
        "tokens": B * T, "tokens_per_s": B * T / median, "gflop_per_step": flops * 1e-9,
        "gflops": flops / median * 1e-9, "peak_mb": peak_kb / 1024,
        "step_mb": (peak_kb - rss_before) / 1024 if rss_before >= 0 else -1,
        "loss": loss.item() if loss is not None else 0.0, "torch": torch.__version__,
        "blas": describe_kernels(), "python": sys.executable, "compiled": a.compile, "device": a.device,
        "adam": "for-loop" if foreach is False else "foreach",   # None: PyTorch's default, foreach on a GPU
        "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "",
        "first_step_s": compile_s if a.compile and a.decode else first_step,
    }
    if a.compile and a.decode:
        result["sentences_as_eager"] = f"{B - differ} of {B}"
    if a.json:
        print(json.dumps(result))
        return 0
    n_params = sum(q.numel() for q in model.parameters())
    print(f"config {a.config}: N {L}, d_model {C}, d_ff {F_}, h {H}, vocab {V}, dropout {a.dropout:g}, "
          f"label smoothing {a.label_smoothing:g}, {n_params} parameters (PyTorch {torch.__version__}"
          f"{', torch.compile' if a.compile else ', eager'})")
    print(f"batch {B} sentences x {S} source x {T} target tokens, {torch.get_num_threads()} threads; "
          f"{result['blas']}")
    what = ("greedy decoding, key/value cache" if a.kv_cache else "greedy decoding, whole prefix") \
        if a.decode else "training"
    if a.compile:
        print(f"{'the first decoding' if a.decode else 'the first step'}, compilation included: "
              f"{result['first_step_s']:.1f} s"
              + (f"; {result['sentences_as_eager']} sentences decoded as eager decodes them" if a.decode else ""))
    print(f"{what}: median {median * 1e3:.2f} ms per "
          f"{'batch' if a.decode else 'step'} (min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}; "
          f"{steps} after {a.warmup} warm-up); CPU time {cpu_per_step * 1e3:.2f} ms each")
    if a.decode:
        print(f"{B * T / median:.0f} target tokens/s ({B * T} positions decoded per batch)")
    else:
        print(f"{B * T / median:.0f} target tokens/s, {flops / median * 1e-9:.1f} GFLOP/s "
              f"({flops * 1e-9:.3f} GFLOP per step)")
    print(f"peak memory {peak_kb / 1024:.1f} MB ({result['step_mb']:.1f} MB more than after importing torch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
