#!/usr/bin/python3
"""`make test-cuda`: ./transformer_cuda against PyTorch at its best on the same GPU, the same training steps.

For each config, runs `./transformer_cuda bench ... --json` and the same
model, batch and step in PyTorch (this script's --torch-worker mode, run with
the interpreter whose PyTorch is timed), each run in its own process, in rounds
(ours, then each PyTorch column, again), and prints Markdown tables: the median
over the rounds of each run's median step time, ours in TFLOP/s beside cuBLAS's
own SGEMM on a large square product measured in the same run (the practical
limit of fp32 products on this GPU), and the fastest PyTorch column's time over
ours (above 1: ours is faster), headed by the GPU's name and the date. Once with
fp32 products on both sides (TF32 off), once with TF32 on both sides (ours
--tf32; PyTorch's allow_tf32 and float32 matmul precision "high"), once in bf16
(ours --bf16: bf16 products with fp32 sums, fp32 master weights and everything
else; PyTorch what a user on an H100 picks: torch.autocast to bf16 around the
forward pass and the loss, fp32 master weights, fused Adam; its yardstick cuBLAS's
GEMM on bf16 A and B with fp32 sums).

Configs (N layers, d_model, d_ff, h, vocabulary, B x S x T):
  tiny, toy, base       ./transformer bench's presets: the batches are small (512 to 1152 target tokens)
  base-25k              the base model (§6, Table 3) at the paper's batch (§5.1: about 25,000 source
                        and 25,000 target tokens): 384 x 64 x 64 = 24,576 + 24,576, vocabulary 37,000
                        (§5.1's shared source-target byte-pair vocabulary)
  big-25k               the big model (Table 3: d_model 1024, d_ff 4096, h 16) at the same batch

PyTorch's columns, the same model (post-norm, ReLU, one shared embedding matrix
for source, target and the output projection, sinusoids, dropout 0.1 on the
embeddings and every sub-layer's output, label smoothing 0.1, Adam with betas
(0.9, 0.98), eps 1e-9 under the paper's learning-rate schedule), at its best:
attention through F.scaled_dot_product_attention with the causal mask as
is_causal and no padding masks (these batches have no padding), Adam
fused=True (each run says which SDPA backend PyTorch picked for its model and
batch: flash, memory-efficient, cuDNN or math, from the operators a profiled
forward pass after the timed steps called; the table lists them); then
  eager             as written
  graph             the whole step (forward, backward, fused Adam with capturable=True and the
                    learning rate a tensor) captured once into a CUDA graph and replayed
  compile           the forward pass and the loss through torch.compile (default mode), backward and
                    Adam after it, as PyTorch's tutorials do
  reduce-overhead   the same with mode="reduce-overhead" (its CUDA graphs)
  max-autotune      the same with mode="max-autotune" (autotuned products, CUDA graphs)
The fastest of them is the one the ratio is taken against. A column that fails
(no Triton, out of memory, a timeout) shows as failed with its first error line,
and the table goes on.

    dev/bench_gpu.py [--binary ./transformer_cuda] [--python PYTHON] [--configs tiny,toy,base,base-25k,big-25k]
                     [--precisions fp32,tf32,bf16] [--columns eager,graph,compile,reduce-overhead,max-autotune]
                     [--rounds 3] [--compiled-rounds 1] [--no-compile] [--sgemm-size 8192]
                     [--timeout 600] [--budget SECONDS] [--log FILE] [--tf32-configs base-25k]
                     [--bf16-configs base-25k] [--dry-run]
                     [--columns-for tiny=eager,graph,reduce-overhead ...]

The configs run in the order given, each in every precision (TF32 only for
--tf32-configs when given, bf16 only for --bf16-configs). --budget: after that many seconds no further run
starts (ours neither; what was not run shows as skipped), so that a short
lease ends with a table within the budget and one run's --timeout; --log keeps
each run's JSON as it ends. PyTorch comes from --python
(make test-cuda passes dev/.venv's interpreter when it imports torch, else the
first python3 on the PATH that does); with none, --python '' prints ours alone
and one line saying why PyTorch is missing. Exits 1 only when ours fails.
--dry-run prints the commands it would run, in order, and runs none: the
script's own paths tried without a GPU (make test-cuda-bench's options included).
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time

SIZES = ("layers", "d_model", "d_ff", "heads", "vocab", "batch", "src_len", "tgt_len")
PAPER_BATCH = ["--batch", "384", "--src-len", "64", "--tgt-len", "64", "--vocab", "37000"]
CONFIGS = {   # ./transformer_cuda bench's arguments for each config
    "tiny": ["--config", "tiny"],
    "toy": ["--config", "toy"],
    "base": ["--config", "base"],
    "base-25k": ["--config", "base"] + PAPER_BATCH,
    "big-25k": ["--config", "base", "--d-model", "1024", "--d-ff", "4096", "--heads", "16"] + PAPER_BATCH,
}
COLUMNS = ("eager", "graph", "compile", "reduce-overhead", "max-autotune")
# --dry-run: the sizes a bench JSON of ours would give (layers, d_model, d_ff, heads, vocab, batch, src_len,
# tgt_len, and the training's settings), for the PyTorch commands it prints
DRY_RUN_SIZES = {name: {**dict(zip(("layers", "d_model", "d_ff", "heads", "vocab", "batch", "src_len", "tgt_len"),
                                   sizes)), "dropout": 0.1, "label_smoothing": 0.1, "warmup": 3, "steps": 10}
                 for name, sizes in (("tiny", (2, 64, 256, 4, 14, 96, 12, 12)),   # lab/lab.c's presets
                                     ("toy", (2, 128, 512, 4, 1000, 32, 32, 32)),
                                     ("base", (6, 512, 2048, 8, 8000, 8, 64, 64)),
                                     ("base-25k", (6, 512, 2048, 8, 37000, 384, 64, 64)),
                                     ("big-25k", (6, 1024, 4096, 16, 37000, 384, 64, 64)))}
COMPILED = ("compile", "reduce-overhead", "max-autotune")
# What issue 33 asks: (config, precision) -> the least ratio fastest PyTorch / ours
GOALS = {("base-25k", "fp32"): 1.05, ("base-25k", "tf32"): 1.15, ("base-25k", "bf16"): 1.0, ("tiny", "fp32"): 2.0,
         ("toy", "fp32"): 2.0}
PRECISIONS = ("fp32", "tf32", "bf16")
# ./transformer_cuda's flag for each precision (bench and sgemm)
PRECISION_FLAGS = {"fp32": [], "tf32": ["--tf32"], "bf16": ["--bf16"]}
# the operators a forward pass calls for each of SDPA's backends (torch.profiler's names)
SDPA_BACKENDS = (("flash", "flash"), ("efficient", "memory-efficient"), ("cudnn", "cuDNN"), ("math", "math"))


# ============================================================================
# The PyTorch side (--torch-worker): imported torch only here
# ============================================================================

def torch_worker(a):
    """Times one PyTorch column; prints one JSON line."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    PAD, BOS, EOS = 0, 1, 2
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
        torch.set_float32_matmul_precision("high" if a.tf32 else "highest")
    torch.manual_seed(1)
    L, C, F_, H, V, B, S, T = a.layers, a.d_model, a.d_ff, a.heads, a.vocab, a.batch, a.src_len, a.tgt_len

    def sinusoids(n, width):   # §3.5, interleaved sin/cos as transformer.c
        pos = torch.arange(n, dtype=torch.float64)[:, None]
        angle = pos / torch.pow(10000.0, torch.arange(0, width, 2, dtype=torch.float64)[None, :] / width)
        pe = torch.zeros(n, width, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(angle)
        pe[:, 1::2] = torch.cos(angle[:, : width // 2])
        return pe.float()

    class Attention(nn.Module):
        """Multi-head attention (§3.2.2): queries from x, keys and values from `memory`
        (x itself in self-attention), through scaled_dot_product_attention."""

        def __init__(self, cross):
            super().__init__()
            self.cross = cross
            if cross:
                self.q = nn.Linear(C, C)
                self.kv = nn.Linear(C, 2 * C)
            else:
                self.qkv = nn.Linear(C, 3 * C)
            self.out = nn.Linear(C, C)

        def forward(self, x, memory=None, causal=False):
            n = x.shape[1]
            if self.cross:
                q = self.q(x)
                k, v = self.kv(memory).split(C, dim=-1)
            else:
                q, k, v = self.qkv(x).split(C, dim=-1)
            heads = [t.view(B, t.shape[1], H, C // H).transpose(1, 2) for t in (q, k, v)]
            y = F.scaled_dot_product_attention(*heads, is_causal=causal)
            return self.out(y.transpose(1, 2).reshape(B, n, C))

    class Layer(nn.Module):
        """An encoder layer, or with `decoder` a decoder layer: post-norm sub-layers (§3.1)."""

        def __init__(self, decoder):
            super().__init__()
            self.decoder = decoder
            self.self_attn = Attention(cross=False)
            self.cross_attn = Attention(cross=True) if decoder else None
            self.ff = nn.Sequential(nn.Linear(C, F_), nn.ReLU(), nn.Linear(F_, C))
            self.norms = nn.ModuleList([nn.LayerNorm(C) for _ in range(3 if decoder else 2)])
            self.drop = nn.Dropout(a.dropout)

        def forward(self, x, memory=None):
            x = self.norms[0](x + self.drop(self.self_attn(x, causal=self.decoder)))
            if self.decoder:
                x = self.norms[1](x + self.drop(self.cross_attn(x, memory)))
            return self.norms[-1](x + self.drop(self.ff(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Parameter(torch.randn(V, C) * C ** -0.5)
            self.enc = nn.ModuleList([Layer(False) for _ in range(L)])
            self.dec = nn.ModuleList([Layer(True) for _ in range(L)])
            self.drop = nn.Dropout(a.dropout)
            self.register_buffer("pe", sinusoids(max(S, T), C), persistent=False)

        def embed(self, tokens):
            return self.drop(self.embedding[tokens] * math.sqrt(C) + self.pe[: tokens.shape[1]])

        def forward(self, src, tgt_in):
            x = self.embed(src)
            for layer in self.enc:
                x = layer(x)
            y = self.embed(tgt_in)
            for layer in self.dec:
                y = layer(y, x)
            return y @ self.embedding.t()   # §3.4: the output projection shares the embedding

    def forward_loss(model, src, tgt_in, tgt_out):
        logits = model(src, tgt_in)
        return F.cross_entropy(logits.reshape(-1, V), tgt_out.reshape(-1), ignore_index=PAD,
                               label_smoothing=a.label_smoothing)

    def noam_lr(step):
        return C ** -0.5 * min(step ** -0.5, step * a.warmup ** -1.5)

    model = Model().to(device)
    model.train()
    parameters = sum(p.numel() for p in model.parameters())
    src = torch.randint(4, V, (B, S), device=device)
    tgt_out = torch.randint(4, V, (B, T), device=device)
    tgt_out[:, -1] = EOS
    tgt_in = torch.cat([torch.full((B, 1), BOS, device=device), tgt_out[:, :-1]], dim=1)
    fused = device.type == "cuda"
    graph = a.column == "graph"
    lr = torch.tensor(0.0, device=device) if graph else 0.0
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9, fused=fused,
                           foreach=None if fused else True, capturable=graph)
    autocast = a.bf16   # torch.autocast to bf16 around the forward pass and the loss; the weights stay fp32

    def autocast_loss(model, src, tgt_in, tgt_out):
        # (a captured step may not keep autocast's cache of the weights' casts: PyTorch's CUDA graphs notes)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=not graph):
            return forward_loss(model, src, tgt_in, tgt_out)

    loss_fn = autocast_loss if autocast else forward_loss
    if a.column in COMPILED:
        loss_fn = torch.compile(loss_fn, mode=None if a.column == "compile" else a.column)

    graphed_compile = a.column in ("reduce-overhead", "max-autotune")   # torch.compile's own CUDA graphs

    def step_once():
        if graphed_compile and hasattr(torch, "compiler") and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
            torch.compiler.cudagraph_mark_step_begin()   # a new step: the last one's outputs may be overwritten
        loss = loss_fn(model, src, tgt_in, tgt_out)
        opt.zero_grad(set_to_none=not graph)
        loss.backward()
        opt.step()
        return loss

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize()

    replay = None
    if graph:
        if device.type != "cuda":
            sys.exit("error: the graph column needs a GPU")
        # warm-up steps on a side stream, as PyTorch's CUDA graphs documentation does, and the
        # capture on that same stream (cuBLAS's handle and workspace are per stream: made before the capture)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for step in range(1, 4):
                opt.param_groups[0]["lr"].fill_(noam_lr(step))
                step_once()
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured, stream=side):
            static_loss = step_once()

        def replay():
            captured.replay()
            return static_loss

    times, first_step, loss = [], 0.0, None
    for step in range(1, a.warmup + a.steps + 1):
        synchronize()
        start = time.perf_counter()
        if graph:
            opt.param_groups[0]["lr"].fill_(noam_lr(step + 3))
            loss = replay()
        else:
            for g in opt.param_groups:
                g["lr"] = noam_lr(step)
            loss = step_once()
        synchronize()
        elapsed = time.perf_counter() - start
        if step == 1:
            first_step = elapsed
        if step > a.warmup:
            times.append(elapsed)
    median = statistics.median(times)
    sdpa = sdpa_backend(torch, lambda: model(src, tgt_in), device, autocast)
    print(f"PyTorch's SDPA backend ({a.column}, {'bf16' if autocast else 'fp32'}): {sdpa}", file=sys.stderr)
    print(json.dumps({
        "impl": "pytorch", "column": a.column, "tf32": a.tf32, "bf16": autocast, "sdpa": sdpa,
        "median_ms": median * 1e3,
        "min_ms": min(times) * 1e3, "first_step_s": first_step, "loss": float(loss.item()),
        "parameters": parameters, "torch": torch.__version__, "device": str(device),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "",
        "peak_gb": torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == "cuda" else 0.0,
    }))
    return 0


def sdpa_backend(torch, forward, device, autocast):
    """Which of scaled_dot_product_attention's backends one eager forward pass runs on this model and
    batch (as the timed steps did: torch.compile calls the operator the same choice picks): the
    operators torch.profiler saw."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        if autocast:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                forward()
        else:
            forward()
    names = [e.key for e in prof.key_averages() if "scaled_dot_product" in e.key or "flash" in e.key]
    for key, backend in SDPA_BACKENDS:
        if any(key in n for n in names):
            return backend
    return "unknown (" + (", ".join(sorted(set(names))) or "no SDPA operator seen") + ")"


# ============================================================================
# The runs and the tables
# ============================================================================

def transformer_parameters(r):
    """transformer.c's parameter count (transformer.h's tensors) for a bench JSON's sizes:
    the PyTorch model must have the same."""
    C, F_, L, V = r["d_model"], r["d_ff"], r["layers"], r["vocab"]
    attention = 3 * C * C + 3 * C + C * C + C
    encoder = attention + 2 * C + (F_ * C + F_) + (C * F_ + C) + 2 * C
    decoder = 2 * attention + 3 * 2 * C + (F_ * C + F_) + (C * F_ + C)
    return V * C + L * (encoder + decoder)


def run_json(cmd, timeout):
    """Runs one benchmark: its last JSON line, or {"error": its first error line}."""
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    errors = [line for line in done.stderr.splitlines() if "Error" in line or "error" in line]
    return {"error": (errors or done.stderr.splitlines() or ["exit status %d" % done.returncode])[-1][:160]}


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             stdout=subprocess.PIPE, text=True, check=True).stdout
        return out.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown GPU (no nvidia-smi)"


def worker_command(a, ours, column, precision):
    cmd = [a.python, os.path.abspath(__file__), "--torch-worker", "--column", column, "--device", a.device,
           "--dropout", str(ours["dropout"]), "--label-smoothing", str(ours["label_smoothing"]),
           "--warmup", str(ours["warmup"]), "--steps", str(ours["steps"])]
    for size in SIZES:
        cmd += ["--" + size.replace("_", "-"), str(ours[size])]
    return cmd + (["--" + precision] if precision != "fp32" else [])


def median_of(results, key):
    values = [r[key] for r in results if key in r]
    return statistics.median(values) if values else None


def measure(a, name, precision, columns, clock, log):
    """Rounds of ours and each PyTorch column for one config and precision: {column: [results]}.
    Each result is also written to `log` (JSON lines) as it ends, so that a cut run leaves them."""
    runs = {"ours": [], **{c: [] for c in columns}}
    ours_cmd = [a.binary, "bench"] + CONFIGS[name] + ["--json"] + PRECISION_FLAGS[precision]
    if a.dry_run:   # the commands, in order; nothing runs
        for c in ["ours"] + columns:
            print("would run: " + " ".join(ours_cmd if c == "ours" else
                                            worker_command(a, DRY_RUN_SIZES[name], c, precision)))
        return runs

    def keep(column, result):
        runs[column].append(result)
        if log:
            log.write(json.dumps({"config": name, "precision": precision, "column": column,
                                  **result}) + "\n")
            log.flush()

    for r in range(a.rounds):
        if a.budget and clock() > a.budget:   # no run starts after the budget, ours neither
            break
        ours = run_json(ours_cmd, a.timeout)
        keep("ours", ours)
        if "error" in ours:
            sys.exit(f"error: {' '.join(ours_cmd)}: {ours['error']}")
        for c in columns:
            if c in COMPILED and r >= a.compiled_rounds:
                continue
            if a.budget and clock() > a.budget:
                keep(c, {"error": f"skipped: the {a.budget} s budget was spent"})
                continue
            result = run_json(worker_command(a, ours, c, precision), a.timeout)
            expected = transformer_parameters(ours)
            if "parameters" in result and result["parameters"] != expected:
                result = {"error": f"PyTorch's model has {result['parameters']} parameters, ours {expected}"}
            keep(c, result)
    return runs


def table(a, precision, rows, columns, sgemm):
    limit = sgemm.get("tflops") or None   # (0 from the emulator's build: no limit to compare with)
    print(f"### {precision}: " + {"tf32": "TF32 products on both sides",
                                   "bf16": "bf16 products with fp32 sums on both sides (ours --bf16; PyTorch "
                                           "autocast to bf16, fp32 master weights)"}.get(
        precision, "fp32 products on both sides (TF32 off)") + "\n")
    if limit:
        what = "GEMM on bf16 A and B, fp32 sums" if precision == "bf16" else f"SGEMM ({precision})"
        print(f"cuBLAS {what}, {sgemm['n']}³, the same run: {limit:.1f} TFLOP/s "
              f"(median {sgemm['median_ms']:.2f} ms of {sgemm['repeats']})\n")
    else:
        print(f"cuBLAS SGEMM: {sgemm.get('error', 'not measured')}\n")
    header = ("| config | tokens (src + tgt) | ours ms | ours TFLOP/s | of SGEMM |" +
              "".join(f" {c} ms |" for c in columns) + " fastest PyTorch / ours | goal |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, runs in rows:
        if not runs["ours"]:
            print(f"| {name} | skipped: the budget was spent before it |" + " |" * (len(columns) + 5))
            continue
        ours = runs["ours"][0]
        ms, gflops = median_of(runs["ours"], "median_ms"), median_of(runs["ours"], "gflops")
        tokens = f"{ours['batch'] * ours['src_len']:,} + {ours['batch'] * ours['tgt_len']:,}"
        cells = [name, tokens, f"{ms:.2f}", f"{gflops / 1e3:.1f}", f"{gflops / 1e3 / limit:.0%}" if limit else "?"]
        fastest = None   # (ms, column)
        for c in columns:
            t = median_of(runs.get(c, []), "median_ms")
            if c not in runs:
                cells.append("")
            elif t is None:
                failed = next((r["error"] for r in runs[c] if "error" in r), "not run")
                cells.append("failed: " + failed.replace("|", "/"))
            else:
                cells.append(f"{t:.2f}")
                if fastest is None or t < fastest[0]:
                    fastest = (t, c)
        goal = GOALS.get((name, precision))
        if fastest:
            ratio = fastest[0] / ms
            cells.append(f"{ratio:.2f} ({fastest[1]})")
            met = goal is None or ratio >= goal
            if name == "tiny" and precision == "fp32":
                met = met and ms <= 0.5
            if name == "base-25k" and precision == "fp32" and limit:
                met = met and gflops / 1e3 / limit >= 0.8
            cells.append("" if goal is None else ("met" if met else "missed") + f" (≥ {goal})")
        else:
            cells += ["no PyTorch run", ""]
        print("| " + " | ".join(cells) + " |")
    print()
    backends = sorted({f"{name} {c}: {r['sdpa']}" for name, runs in rows for c in columns
                       for r in runs.get(c, []) if "sdpa" in r})
    if backends:
        print("PyTorch's SDPA backend: " + "; ".join(backends) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default="./transformer_cuda")
    p.add_argument("--configs", default="tiny,toy,base,base-25k,big-25k")
    p.add_argument("--precisions", default="fp32,tf32,bf16")
    p.add_argument("--columns", default=",".join(COLUMNS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compiled-rounds", type=int, default=1, help="rounds of the torch.compile columns")
    p.add_argument("--python", default="", help="the interpreter whose PyTorch is timed ('': none)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile columns")
    p.add_argument("--sgemm-size", type=int, default=8192)
    p.add_argument("--timeout", type=int, default=600, help="seconds one run may take")
    p.add_argument("--budget", type=int, default=0, help="seconds after which no PyTorch run starts (0: none)")
    p.add_argument("--log", default="", help="a file for each run's JSON, a line as it ends")
    p.add_argument("--tf32-configs", default="", help="the configs timed with TF32 too (default: all)")
    p.add_argument("--bf16-configs", default="", help="the configs timed in bf16 too (default: all)")
    p.add_argument("--dry-run", action="store_true", help="print the commands in order, run none")
    p.add_argument("--columns-for", action="append", default=[], metavar="CONFIG=COLUMNS",
                   help="another choice of columns for one config (repeatable)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)   # cpu: to try the script without a GPU
    # --torch-worker: this script as one PyTorch run (with the interpreter to be timed)
    p.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--column", default="eager", help=argparse.SUPPRESS)
    p.add_argument("--tf32", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    for size, default in zip(SIZES, (2, 128, 512, 4, 1000, 32, 32, 32)):
        p.add_argument("--" + size.replace("_", "-"), type=int, default=default, help=argparse.SUPPRESS)
    p.add_argument("--dropout", type=float, default=0.1, help=argparse.SUPPRESS)
    p.add_argument("--label-smoothing", type=float, default=0.1, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=10, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.torch_worker:
        return torch_worker(a)
    started = time.monotonic()
    def chosen(names):
        return [c for c in names.split(",") if c and not (a.no_compile and c in COMPILED)]
    columns = chosen(a.columns)
    columns_of = {}   # --columns-for CONFIG=COLUMNS
    for spec in a.columns_for:
        name, _, names = spec.partition("=")
        columns_of[name] = chosen(names)
    every = columns + [c for cs in columns_of.values() for c in cs]
    unknown = [c for c in every if c not in COLUMNS] + [n for n in list(columns_of) + a.configs.split(",")
                                                         if n not in CONFIGS]
    unknown += [q for q in a.precisions.split(",") if q not in PRECISIONS]
    if unknown:
        p.error(f"unknown columns, configs or precisions: {', '.join(unknown)}")
    print(f"## Training step on {gpu_name()}, {datetime.date.today().isoformat()}\n")
    if not a.python:
        print("PyTorch: skipped, no python3 here imports torch (make bench-setup builds dev/.venv where PyPI "
              "is reachable)\n")
        columns, columns_of = [], {}
    precisions = a.precisions.split(",")
    log = open(a.log, "w") if a.log else None
    sgemm = {}   # the yardstick first: a second or two each
    for precision in precisions:
        cmd = [a.binary, "sgemm", "--size", str(a.sgemm_size), "--json"] + PRECISION_FLAGS[precision]
        if a.dry_run:
            print("would run: " + " ".join(cmd))
            sgemm[precision] = {"error": "a dry run"}
            continue
        sgemm[precision] = run_json(cmd, a.timeout)
        if log:
            log.write(json.dumps({"precision": precision, "column": "sgemm", **sgemm[precision]}) + "\n")
    others = [q for q in precisions if q != "fp32"]
    if others and not a.dry_run and all("error" in sgemm[q] for q in others):
        # not ./transformer_cuda (./transformer has no sgemm, --tf32 or --bf16)
        print(f"{a.binary} has no sgemm command: it is not the CUDA companion, and has no TF32 or bf16 either; "
              "fp32 alone\n")
        precisions = ["fp32"]
        sgemm.setdefault("fp32", sgemm[others[0]])
    # the configs in the order given, each in every precision, so that a budget spends itself on the first
    configs_of = {"fp32": a.configs, "tf32": a.tf32_configs or a.configs, "bf16": a.bf16_configs or a.configs}
    results = {(name, precision): measure(a, name, precision, columns_of.get(name, columns),
                                          lambda: time.monotonic() - started, log)
               for name in a.configs.split(",") for precision in precisions
               if name in configs_of[precision].split(",")}
    if a.dry_run:
        return 0
    if log:
        log.close()
    shown = [c for c in COLUMNS if c in every]   # a table's columns: every one any config ran
    for precision in precisions:
        rows = [(name, results[(name, precision)]) for name in a.configs.split(",") if (name, precision) in results]
        versions = {r.get("torch") for _, runs in rows for r in sum(runs.values(), []) if "torch" in r}
        if shown:
            print(f"PyTorch {', '.join(sorted(versions)) or '(no run succeeded)'}; medians of {a.rounds} rounds "
                  f"(torch.compile columns: {a.compiled_rounds}); ratio = the fastest PyTorch column's time / ours "
                  "(above 1: ours faster); TFLOP/s count the matrix products (training_step_flops)\n")
        table(a, precision, rows, shown, sgemm[precision])
    print(f"({time.monotonic() - started:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
