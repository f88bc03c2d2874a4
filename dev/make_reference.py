#!/usr/bin/python3
"""Write a reference file (tiny_data/*.ref) for transformer.c from PyTorch.

The model is built from PyTorch's own layers (nn.TransformerEncoderLayer /
nn.TransformerDecoderLayer, post-norm, ReLU, dropout 0), called one by one in
a plain loop, plus one shared embedding matrix used for the source embedding,
the target embedding and the tied output projection; the positions are
sinusoids (paper section 3.5) or, with --positional learned, one learned table
for source and target (Table 3, row E), stored after the embedding.  The exact
binary layout and model definition are in dev/FORMATS.md, "Reference files".

Format version 2 (the default): the weights are drawn in float32 and stored
as float32; everything is then computed in float64 from exactly those weights
(positional encoding unrounded), and the results are stored as float64,
including the parameters after every Adam step.  --version 1 writes the old
format: everything computed and stored in float32, parameters after the last
step only.

    dev/.venv/bin/python dev/make_reference.py --out tiny_data/x.ref [options]

(the committed files were made with PyTorch 2.15 on the CPU).  Deterministic:
one thread, deterministic algorithms; the same options and PyTorch version
give a byte-identical file on the same machine.  On another CPU the float64
results can differ in their last bits (MKL picks its kernels by CPU): the
batch and the initial weights stay the same (drawn in float32 from the seed),
and the tests' tolerances are far above such differences.
"""
import argparse
import math
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC = b"TREF"
VERSION = 2   # the default; 1 is still written with --version 1
PAD, BOS, EOS, UNK = 0, 1, 2, 3
POSITIONAL = {"sinusoid": 0, "learned": 1}   # the header's int32 at offset 52

# Parameter tensors in file order: (name, stack, attribute path inside a layer).
# stack is None for the shared embedding and the learned positions (no
# numbers with sinusoids: the file then holds the other 31).
PARAM_SPEC = [
    ("embedding", None, None),
    ("position_embedding", None, None),
    ("enc_qkv_w", "enc", "self_attn.in_proj_weight"),
    ("enc_qkv_b", "enc", "self_attn.in_proj_bias"),
    ("enc_out_w", "enc", "self_attn.out_proj.weight"),
    ("enc_out_b", "enc", "self_attn.out_proj.bias"),
    ("enc_ln1_g", "enc", "norm1.weight"),
    ("enc_ln1_b", "enc", "norm1.bias"),
    ("enc_ff1_w", "enc", "linear1.weight"),
    ("enc_ff1_b", "enc", "linear1.bias"),
    ("enc_ff2_w", "enc", "linear2.weight"),
    ("enc_ff2_b", "enc", "linear2.bias"),
    ("enc_ln2_g", "enc", "norm2.weight"),
    ("enc_ln2_b", "enc", "norm2.bias"),
    ("dec_self_qkv_w", "dec", "self_attn.in_proj_weight"),
    ("dec_self_qkv_b", "dec", "self_attn.in_proj_bias"),
    ("dec_self_out_w", "dec", "self_attn.out_proj.weight"),
    ("dec_self_out_b", "dec", "self_attn.out_proj.bias"),
    ("dec_ln1_g", "dec", "norm1.weight"),
    ("dec_ln1_b", "dec", "norm1.bias"),
    ("dec_cross_qkv_w", "dec", "multihead_attn.in_proj_weight"),
    ("dec_cross_qkv_b", "dec", "multihead_attn.in_proj_bias"),
    ("dec_cross_out_w", "dec", "multihead_attn.out_proj.weight"),
    ("dec_cross_out_b", "dec", "multihead_attn.out_proj.bias"),
    ("dec_ln2_g", "dec", "norm2.weight"),
    ("dec_ln2_b", "dec", "norm2.bias"),
    ("dec_ff1_w", "dec", "linear1.weight"),
    ("dec_ff1_b", "dec", "linear1.bias"),
    ("dec_ff2_w", "dec", "linear2.weight"),
    ("dec_ff2_b", "dec", "linear2.bias"),
    ("dec_ln3_g", "dec", "norm3.weight"),
    ("dec_ln3_b", "dec", "norm3.bias"),
]
assert len(PARAM_SPEC) == 32


def get_attr(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def param_shapes(L, C, F_, V, positions=0):
    """Shape of each of the 32 tensors, in file order; positions: the rows of
    the learned table (max_len), 0 with sinusoids (the table is then (0, C))."""
    per_layer = {
        "qkv_w": (3 * C, C), "qkv_b": (3 * C,), "out_w": (C, C), "out_b": (C,),
        "ln": (C,), "ff1_w": (F_, C), "ff1_b": (F_,), "ff2_w": (C, F_), "ff2_b": (C,),
    }
    shapes = []
    for name, stack, _ in PARAM_SPEC:
        if stack is None:
            shapes.append((V, C) if name == "embedding" else (positions, C))
            continue
        key = name.split("_", 1)[1]            # e.g. "self_qkv_w", "ln1_g"
        for suffix in ("qkv_w", "qkv_b", "out_w", "out_b", "ff1_w", "ff1_b", "ff2_w", "ff2_b"):
            if key.endswith(suffix):
                shapes.append((L,) + per_layer[suffix])
                break
        else:
            assert key[:2] == "ln", name
            shapes.append((L, C))
    return shapes


def n_params(L, C, F_, V, positions=0):
    return sum(int(np.prod(s)) for s in param_shapes(L, C, F_, V, positions))


def header_positions(h):
    """The learned table's rows for header dict h: max_len if learned, else 0."""
    return h["max_len"] if h.get("positional", 0) == POSITIONAL["learned"] else 0


def file_size(h, version=VERSION):
    """Size in bytes that the format implies for header dict h."""
    P = n_params(h["n_layers"], h["d_model"], h["d_ff"], h["vocab_size"], header_positions(h))
    B, S, T, V, K = h["B"], h["S"], h["T"], h["vocab_size"], h["adam_steps"]
    n_int = B * S + B + 2 * B * T + B
    if version == 1:
        return 72 + 4 * (n_int + P + B * T * V + 1 + P + K + P)
    # version 2: initial parameters f32; logits, loss, gradients, step losses
    # and the parameters after each of the K steps f64
    return 72 + 4 * (n_int + P) + 8 * (B * T * V + 1 + P + K + K * P)


def positional_encoding(n_pos, C, dtype=torch.float32):
    """Interleaved sin/cos (paper §3.5), computed in float64, rounded to dtype.
    PE[pos, 2i] = sin(pos / 10000^(2i/C)), PE[pos, 2i+1] = cos(same angle)."""
    pe = np.zeros((n_pos, C), dtype=np.float64)
    pos = np.arange(n_pos, dtype=np.float64)[:, None]
    two_i = np.arange(0, C, 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, two_i / C)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : C // 2])
    return torch.from_numpy(pe).to(dtype)


class RefModel(nn.Module):
    def __init__(self, L, C, F_, H, V, max_len, eps, pe_dtype=torch.float32, learned=False):
        super().__init__()
        self.C = C
        self.embedding = nn.Parameter(torch.empty(V, C))
        # Table 3, row E: one (max_len, C) table for source and target
        self.position_embedding = nn.Parameter(torch.empty(max_len, C)) if learned else None
        self.enc = nn.ModuleList([
            nn.TransformerEncoderLayer(C, H, F_, dropout=0.0, activation="relu",
                                       layer_norm_eps=eps, batch_first=True, norm_first=False)
            for _ in range(L)])
        self.dec = nn.ModuleList([
            nn.TransformerDecoderLayer(C, H, F_, dropout=0.0, activation="relu",
                                       layer_norm_eps=eps, batch_first=True, norm_first=False)
            for _ in range(L)])
        if not learned:
            self.register_buffer("pe", positional_encoding(max_len, C, pe_dtype),
                                 persistent=False)

    def init_params(self):
        """Embedding N(0, C^-0.5); PyTorch's default init for the weight
        matrices; biases and layer-norm gains/biases perturbed so that their
        gradients are exercised; learned positions N(0, C^-0.5), drawn last
        (a seed gives the same other weights with either kind)."""
        with torch.no_grad():
            self.embedding.normal_(0.0, self.C ** -0.5)
            for layer in list(self.enc) + list(self.dec):
                for name, p in layer.named_parameters():
                    if name.startswith("norm"):
                        if name.endswith("weight"):
                            p.copy_(1.0 + 0.1 * torch.randn_like(p))
                        else:
                            p.copy_(0.1 * torch.randn_like(p))
                    elif name.endswith("bias"):
                        p.copy_(0.05 * torch.randn_like(p))
            if self.position_embedding is not None:
                self.position_embedding.normal_(0.0, self.C ** -0.5)

    def ordered_params(self):
        """The parameters in file order, per stored tensor a list of per-layer tensors."""
        out = []
        for name, stack, path in PARAM_SPEC:
            if name == "position_embedding":
                out.append([] if self.position_embedding is None else [self.position_embedding])
            elif stack is None:
                out.append([self.embedding])
            else:
                out.append([get_attr(layer, path) for layer in getattr(self, stack)])
        return out

    def embed(self, tokens):
        n = tokens.shape[1]
        # embedding * sqrt(C) (sqrt(C) is rounded to float32 by the multiply)
        # + PE, or + the learned table's first n rows (unscaled)
        pe = self.pe if self.position_embedding is None else self.position_embedding
        return self.embedding[tokens] * math.sqrt(self.C) + pe[:n]

    def forward(self, src, src_len, tgt_in, tgt_len):
        B, S = src.shape
        T = tgt_in.shape[1]
        # Boolean masks, True = masked (not attended to).
        src_pad = torch.arange(S)[None, :] >= src_len[:, None]            # (B,S)
        tgt_pad = torch.arange(T)[None, :] >= tgt_len[:, None]            # (B,T)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # (T,T)
        x = self.embed(src)
        for layer in self.enc:
            x = layer(x, src_key_padding_mask=src_pad)
        memory = x
        y = self.embed(tgt_in)
        for layer in self.dec:
            y = layer(y, memory, tgt_mask=causal, tgt_key_padding_mask=tgt_pad,
                      memory_key_padding_mask=src_pad)
        return y @ self.embedding.t()                                       # (B,T,V)


def loss_fn(logits, tgt_out, ls):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), tgt_out.reshape(-1),
                           ignore_index=PAD, label_smoothing=ls)


def noam_lr(step, C, warmup, factor):
    return factor * C ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def make_batch(gen, B, S, T, V):
    """Random word tokens in [4, V); lengths in [1,S] / [1,T]; sentence 0 has a
    full-length source and a short target, sentence B-1 a short source and a
    full-length target, so both sides have padding and a full row."""
    src_len = torch.randint(1, S + 1, (B,), generator=gen)
    tgt_len = torch.randint(1, T + 1, (B,), generator=gen)   # tgt_len = n = words + 1
    src_len[0] = S
    src_len[B - 1] = torch.randint(1, S, (1,), generator=gen)[0]
    tgt_len[B - 1] = T
    tgt_len[0] = torch.randint(1, T, (1,), generator=gen)[0]
    src = torch.zeros(B, S, dtype=torch.long)
    tgt_in = torch.zeros(B, T, dtype=torch.long)
    tgt_out = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        ns, nt = int(src_len[b]), int(tgt_len[b])
        src[b, :ns] = torch.randint(4, V, (ns,), generator=gen)
        words = torch.randint(4, V, (nt - 1,), generator=gen)
        tgt_in[b, 0] = BOS
        tgt_in[b, 1:nt] = words
        tgt_out[b, :nt - 1] = words
        tgt_out[b, nt - 1] = EOS
    return src, src_len.long(), tgt_in, tgt_out, tgt_len.long()


def flat_f32(tensors, fmt="<f4"):
    """Concatenate tensors (tensor-major, layer 0 first) as little-endian f32
    (or, with fmt "<f8", f64) bytes."""
    return b"".join(t.detach().contiguous().numpy().astype(fmt).tobytes() for t in tensors)


def i32(t):
    return t.to(torch.int64).numpy().astype("<i4").tobytes()


def params_bytes(model, fmt="<f4"):
    return b"".join(flat_f32(group, fmt) for group in model.ordered_params())


def grads_bytes(model, fmt="<f4"):
    return b"".join(flat_f32([p.grad for p in group], fmt) for group in model.ordered_params())


def build(a):
    """The model with its initial weights, drawn in float32; for version 2
    converted to float64 (exactly: every weight stays a float32 number)."""
    torch.manual_seed(a.seed)
    pe_dtype = torch.float32 if a.version == 1 else torch.float64
    model = RefModel(a.layers, a.d_model, a.d_ff, a.heads, a.vocab, a.max_len, a.ln_eps, pe_dtype,
                     a.positional == "learned")
    model.init_params()
    if a.version == 2:
        model.double()
    model.train()   # dropout is 0; train() keeps PyTorch off its inference fast path
    return model


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=24)
    p.add_argument("--d-ff", type=int, default=40)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=19)
    p.add_argument("--max-len", type=int, default=16)
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--src-len", type=int, default=7)
    p.add_argument("--tgt-len", type=int, default=6)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--ln-eps", type=float, default=1e-5)
    p.add_argument("--adam-steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--lr-factor", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--positional", choices=tuple(POSITIONAL), default="sinusoid",
                   help="sinusoids (section 3.5) or a learned table (Table 3, row E)")
    p.add_argument("--version", type=int, choices=(1, 2), default=VERSION)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.d_model % a.heads or a.d_model % 2:
        p.error("d_model must be even and divisible by heads")
    if a.batch < 2 or a.src_len < 2 or a.tgt_len < 2:
        p.error("need batch >= 2, src-len >= 2, tgt-len >= 2 (for padding on both sides)")
    if a.vocab < 5:
        p.error("vocab must be >= 5 (4 special tokens + words)")
    if a.max_len < max(a.src_len, a.tgt_len):
        p.error("max-len must be >= src-len and tgt-len")
    # The file stores these as f32; use exactly the stored values so that the
    # file is consistent with its own header (0.1 -> 0.100000001490116...).
    for k in ("label_smoothing", "ln_eps", "lr_factor"):
        setattr(a, k, float(np.float32(getattr(a, k))))
    return a


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = build(a)
    gen = torch.Generator().manual_seed(a.seed)
    src, src_len, tgt_in, tgt_out, tgt_len = make_batch(
        gen, a.batch, a.src_len, a.tgt_len, a.vocab)
    real = "<f4" if a.version == 1 else "<f8"   # how results are stored

    P = n_params(a.layers, a.d_model, a.d_ff, a.vocab, a.max_len if a.positional == "learned" else 0)
    assert P == sum(p.numel() for p in model.parameters()), "parameter count mismatch"

    header = MAGIC + struct.pack(
        "<13i4f", a.version,
        a.layers, a.d_model, a.d_ff, a.heads, a.vocab, a.max_len,
        a.batch, a.src_len, a.tgt_len,
        a.adam_steps, a.warmup, POSITIONAL[a.positional],
        a.label_smoothing, a.ln_eps, a.lr_factor, 0.0)
    assert len(header) == 72

    chunks = [header, i32(src), i32(src_len), i32(tgt_in), i32(tgt_out), i32(tgt_len)]

    # Forward + backward with the initial parameters (float32 numbers in both
    # versions, so the file's f32 copy of them is exact).
    chunks.append(params_bytes(model))
    assert params_bytes(model, "<f8") == np.frombuffer(params_bytes(model), "<f4").astype("<f8").tobytes()
    model.zero_grad(set_to_none=False)
    logits = model(src, src_len, tgt_in, tgt_len)
    loss = loss_fn(logits, tgt_out, a.label_smoothing)
    loss.backward()
    chunks.append(flat_f32([logits], real))
    chunks.append(flat_f32([loss], real))
    chunks.append(grads_bytes(model, real))
    loss0 = float(loss.detach())

    # Adam steps on the same batch (paper §5.3 schedule). Step s: the learning
    # rate of step s, the loss and gradient at the parameters before the
    # update (step 1's are the ones above), then the update.
    opt = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9,
                           weight_decay=0.0, foreach=False)
    step_losses, after_each_step = [], []
    for s in range(1, a.adam_steps + 1):
        for g in opt.param_groups:
            g["lr"] = noam_lr(s, a.d_model, a.warmup, a.lr_factor)
        opt.zero_grad(set_to_none=False)
        l = loss_fn(model(src, src_len, tgt_in, tgt_len), tgt_out, a.label_smoothing)
        l.backward()
        step_losses.append(l.detach().clone())
        opt.step()
        after_each_step.append(params_bytes(model, real))
    chunks.append(flat_f32(step_losses, real))
    if a.version == 1:
        chunks.append(params_bytes(model))             # after the last step only
    else:
        chunks.extend(after_each_step)

    data = b"".join(chunks)
    hdr = dict(n_layers=a.layers, d_model=a.d_model, d_ff=a.d_ff, vocab_size=a.vocab,
               max_len=a.max_len, positional=POSITIONAL[a.positional], B=a.batch, S=a.src_len, T=a.tgt_len, adam_steps=a.adam_steps)
    assert len(data) == file_size(hdr, a.version), (len(data), file_size(hdr, a.version))
    with open(a.out, "wb") as f:
        f.write(data)

    print(f"wrote {a.out}: {len(data)} bytes, format version {a.version}")
    print(f"  layers={a.layers} d_model={a.d_model} d_ff={a.d_ff} heads={a.heads} "
          f"vocab={a.vocab} max_len={a.max_len} positional={a.positional} B={a.batch} S={a.src_len} T={a.tgt_len}")
    print(f"  label_smoothing={a.label_smoothing:.9g} ln_eps={a.ln_eps:.9g} adam_steps={a.adam_steps} "
          f"warmup={a.warmup} lr_factor={a.lr_factor} seed={a.seed}")
    print(f"  src_len={src_len.tolist()} tgt_len={tgt_len.tolist()} "
          f"target tokens={int((tgt_out != PAD).sum())}")
    print(f"  parameters={P}  loss={loss0:.9g}  "
          f"step losses={[f'{float(x):.9g}' for x in step_losses]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
