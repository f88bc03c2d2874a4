#!/usr/bin/env python3
"""Write a CTranslate2 model directory from a checkpoint of ours, so that the field's CPU
inference engine can serve a model trained here.

    make ctranslate2-setup            # once: dev/.venv-ct2 with ctranslate2==4.8.5 from PyPI
    dev/.venv-ct2/bin/python dev/export_ctranslate2.py runs/translate/de/average.ckpt \\
        --out runs/translate/de/ctranslate2

The model (dev/FORMATS.md, "Checkpoint format, version 4": the model part; the run part only
for the §5.1 merges) becomes CTranslate2's TransformerSpec as its Python spec API builds one:

- `TransformerSpec.from_config((L, L), heads, pre_norm=False)`: the paper's post-norm layers,
  LayerNorm(x + Sublayer(x)), ReLU, no final layer norm;
- the one shared embedding (§3.4) as the source embedding, the target embedding and the
  output projection (no bias), `scale_embeddings` (E[token] * sqrt(d_model));
- the positions: our table set explicitly (CTranslate2's own sinusoids put all the sines
  first; ours interleave sin and cos as the paper writes them, computed here in double as
  transformer.c computes them; a learned table, Table 3 row E, as it is);
- W^Q, W^K, W^V stacked as our rows are (self-attention: one fused linear; encoder-decoder
  attention: the queries, then keys and values fused), W^O, the biases;
- the layer norm's epsilon from the checkpoint (1e-5 by default);
- the vocabulary, shared, in our ids: `<pad> <s> </s> <unk>` are ids 0-3, `<s>` the decoder's
  start, `</s>` its end; `add_source_eos` (our sources end with `</s>`, no `<s>`).

The §5.1 merges stay outside the model, as CTranslate2 expects of any tokenizer: the
directory also gets `merges.txt` (the merges in the order learned, a pair a line), and a
sentence is cut into subwords with `./transformer bpe --checkpoint CKPT` (the tokens it
prints, space-separated, are what translate_batch takes); the output joins back into words
by dropping each `</w>` and starting a new word after it (join_subwords below).

Our decoding rules, which a server must give CTranslate2 to translate as `./transformer
decode` does (README, "Serve it"): a sentence's output is at most its source subwords + 1 +
50 tokens, capped at the model's max_len (`max_decoding_length`, per sentence); `</s>` is
never the first token (`min_decoding_length=1`); `<pad>` and `<s>` are never output
(`suppress_sequences=[["<pad>"], ["<s>"]]`). decoding_rules() below returns them.
Greedy decoding (beam_size=1) then gives our tokens exactly (make ctranslate2-check); beam
search differs in its length penalty (CTranslate2 divides by length^alpha, we by
((5 + length) / 6)^alpha counting </s>) and keeps beam_size hypotheses alive after one ends.

Needs numpy and ctranslate2 only (not PyTorch): the checkpoint reader below is its own.
"""
import argparse
import math
import os
import shutil
import struct
import sys

import numpy as np

MODEL_HEADER = struct.Struct("<4s3I7i3f2Q")   # CheckpointHeader, 72 bytes (dev/FORMATS.md)
RUN_HEADER = struct.Struct("<4sI10Q")         # RunHeader, 88 bytes
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
END_OF_WORD = "</w>"
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def fail(path, reason):
    sys.exit(f"error: {path}: {reason}")


def fnv1a(data):
    """FNV-1a 64 of data, as transformer.c computes it, byte by byte."""
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def tensor_shapes(L, C, F, V, max_len, learned):
    """ParameterTensors' 32 tensors in the file's order (transformer.h), name and shape."""
    attention = lambda p: [(p + "qkv_w", (L, 3 * C, C)), (p + "qkv_b", (L, 3 * C)),   # noqa: E731
                           (p + "out_w", (L, C, C)), (p + "out_b", (L, C))]
    norm = lambda p: [(p + "_g", (L, C)), (p + "_b", (L, C))]                          # noqa: E731
    ffn = lambda p: [(p + "ff1_w", (L, F, C)), (p + "ff1_b", (L, F)),                  # noqa: E731
                     (p + "ff2_w", (L, C, F)), (p + "ff2_b", (L, C))]
    shapes = [("embedding", (V, C)), ("position_embedding", (max_len if learned else 0, C))]
    shapes += attention("enc_") + norm("enc_ln1") + ffn("enc_") + norm("enc_ln2")
    shapes += attention("dec_self_") + norm("dec_ln1") + attention("dec_cross_") + norm("dec_ln2")
    shapes += ffn("dec_") + norm("dec_ln3")
    assert len(shapes) == 32
    return shapes


def read_merges(section, path):
    """The merges section of the run part: a u32 count, then per merge two symbols, each a
    u32 length and its bytes."""
    (count,) = struct.unpack_from("<I", section, 0)
    at, merges = 4, []
    for _ in range(count):
        pair = []
        for _ in range(2):
            (n,) = struct.unpack_from("<I", section, at)
            pair.append(section[at + 4:at + 4 + n].decode("utf-8", "surrogateescape"))
            at += 4 + n
        merges.append(tuple(pair))
    if at != len(section):
        fail(path, f"the merges take {at} of their section's {len(section)} bytes")
    return merges


def read_checkpoint(path, check_sums=True):
    """(config dict, vocabulary, {tensor name: float32 array}, merges or None) of a version-4
    checkpoint, with the checks of dev/FORMATS.md that matter here (the checksums too)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(path, f"cannot open: {e.strerror}")
    if len(data) < MODEL_HEADER.size or data[:4] != b"TCKP":
        fail(path, "not a checkpoint of ours (expected the magic TCKP and a 72-byte header)")
    (_, version, real_bytes, subwords, L, C, F, H, V, max_len, positional, _dropout, _smoothing,
     eps, vocab_bytes, model_bytes) = MODEL_HEADER.unpack_from(data, 0)
    if version != 4:
        fail(path, f"version {version}; this script reads version 4 (`./transformer average --out "
                   f"NEW.ckpt {path}` writes a version-4 copy)")
    if real_bytes not in (4, 8) or positional not in (0, 1) or C % H:
        fail(path, f"header: {real_bytes}-byte numbers, positional {positional}, d_model {C}, "
                   f"{H} heads: not a model this script takes")
    shapes = tensor_shapes(L, C, F, V, max_len, positional == 1)
    P = sum(int(np.prod(s)) for _, s in shapes)
    if model_bytes != MODEL_HEADER.size + vocab_bytes + P * real_bytes + 8 or len(data) < model_bytes:
        fail(path, f"header: a model of {model_bytes} bytes, but its sizes give "
                   f"{MODEL_HEADER.size + vocab_bytes + P * real_bytes + 8} (file: {len(data)})")
    (stored,) = struct.unpack_from("<Q", data, model_bytes - 8)
    if check_sums and fnv1a(data[:model_bytes - 8]) != stored:
        fail(path, "checksum mismatch in the model: the file is damaged")
    words = data[MODEL_HEADER.size:MODEL_HEADER.size + vocab_bytes].decode("utf-8").split("\n")
    if words[-1] != "" or len(words) != V + 1 or words[:4] != SPECIALS:
        fail(path, f"the vocabulary does not hold {V} tokens, <pad> <s> </s> <unk> first")
    words = words[:-1]
    dtype = "<f4" if real_bytes == 4 else "<f8"
    offset = MODEL_HEADER.size + vocab_bytes
    tensors = {}
    for name, shape in shapes:
        n = int(np.prod(shape))
        tensors[name] = np.frombuffer(data, dtype, n, offset).astype(np.float32).reshape(shape)
        offset += n * real_bytes
    merges = None
    if len(data) > model_bytes:
        (magic, run_version, _rb, _step, _d, _e, _ep, _eb, _h, options_bytes, merges_bytes,
         run_bytes) = RUN_HEADER.unpack_from(data, model_bytes)
        if magic != b"TRUN" or run_version != 1 or model_bytes + run_bytes != len(data):
            fail(path, "the bytes after the model are not a run part of ours")
        (stored,) = struct.unpack_from("<Q", data, len(data) - 8)
        if check_sums and fnv1a(data[model_bytes:-8]) != stored:
            fail(path, "checksum mismatch in the run after the model: the file is damaged")
        at = model_bytes + RUN_HEADER.size + options_bytes
        if merges_bytes:
            merges = read_merges(data[at:at + merges_bytes], path)
    if subwords and merges is None:
        fail(path, "its tokens are §5.1 subwords, but it holds no merges")
    config = dict(layers=L, d_model=C, d_ff=F, heads=H, vocab_size=V, max_len=max_len,
                  positional="learned" if positional == 1 else "sinusoid", layer_norm_eps=eps)
    return config, words, tensors, merges


def sinusoids(max_len, C):
    """§3.5's table as transformer.c's positional_encoding_init computes it: in double with
    libm's sin, cos and pow (Python's math is libm), rounded to float once; interleaved."""
    pe = np.zeros((max_len, C), dtype=np.float32)
    for pos in range(max_len):
        for i in range(0, (C + 1) // 2):
            angle = pos / math.pow(10000.0, (2.0 * i) / C)
            pe[pos, 2 * i] = math.sin(angle)
            if 2 * i + 1 < C:
                pe[pos, 2 * i + 1] = math.cos(angle)
    return pe


def build_spec(config, words, tensors):
    """The CTranslate2 TransformerSpec of the model (the mapping in the module's comment)."""
    from ctranslate2.specs import transformer_spec

    L, C = config["layers"], config["d_model"]
    spec = transformer_spec.TransformerSpec.from_config((L, L), config["heads"], pre_norm=False)
    embedding = tensors["embedding"]
    if config["positional"] == "learned":
        positions = tensors["position_embedding"]
    else:
        positions = sinusoids(config["max_len"], C)

    def linear(target, weight, bias=None):
        target.weight = np.ascontiguousarray(weight)
        if bias is not None:
            target.bias = np.ascontiguousarray(bias)

    def norm(target, prefix, layer):
        target.gamma = tensors[prefix + "_g"][layer]
        target.beta = tensors[prefix + "_b"][layer]

    encoder, decoder = spec.encoder, spec.decoder
    encoder.embeddings[0].weight = embedding
    encoder.scale_embeddings = True
    encoder.position_encodings.encodings = positions
    decoder.embeddings.weight = embedding
    decoder.scale_embeddings = True
    decoder.position_encodings.encodings = positions
    decoder.projection.weight = embedding   # §3.4: the pre-softmax projection, no bias
    for layer, s in enumerate(encoder.layer):
        linear(s.self_attention.linear[0], tensors["enc_qkv_w"][layer], tensors["enc_qkv_b"][layer])
        linear(s.self_attention.linear[1], tensors["enc_out_w"][layer], tensors["enc_out_b"][layer])
        norm(s.self_attention.layer_norm, "enc_ln1", layer)
        linear(s.ffn.linear_0, tensors["enc_ff1_w"][layer], tensors["enc_ff1_b"][layer])
        linear(s.ffn.linear_1, tensors["enc_ff2_w"][layer], tensors["enc_ff2_b"][layer])
        norm(s.ffn.layer_norm, "enc_ln2", layer)
    for layer, s in enumerate(decoder.layer):
        linear(s.self_attention.linear[0], tensors["dec_self_qkv_w"][layer],
               tensors["dec_self_qkv_b"][layer])
        linear(s.self_attention.linear[1], tensors["dec_self_out_w"][layer],
               tensors["dec_self_out_b"][layer])
        norm(s.self_attention.layer_norm, "dec_ln1", layer)
        cross_w, cross_b = tensors["dec_cross_qkv_w"][layer], tensors["dec_cross_qkv_b"][layer]
        linear(s.attention.linear[0], cross_w[:C], cross_b[:C])     # queries, from the decoder
        linear(s.attention.linear[1], cross_w[C:], cross_b[C:])     # keys | values, the memory's
        linear(s.attention.linear[2], tensors["dec_cross_out_w"][layer],
               tensors["dec_cross_out_b"][layer])
        norm(s.attention.layer_norm, "dec_ln2", layer)
        linear(s.ffn.linear_0, tensors["dec_ff1_w"][layer], tensors["dec_ff1_b"][layer])
        linear(s.ffn.linear_1, tensors["dec_ff2_w"][layer], tensors["dec_ff2_b"][layer])
        norm(s.ffn.layer_norm, "dec_ln3", layer)
    spec.config.layer_norm_epsilon = float(config["layer_norm_eps"])
    spec.config.add_source_eos = True       # our sources end with </s> (batch_fill)
    spec.config.add_source_bos = False
    spec.config.decoder_start_token = "<s>"
    spec.register_source_vocabulary(words)
    spec.register_target_vocabulary(words)
    return spec


def decoding_rules(source_subwords, max_len):
    """translate_batch's arguments that make CTranslate2 decode as ./transformer decode does,
    for one sentence of source_subwords tokens (without </s>)."""
    return dict(max_decoding_length=min(source_subwords + 1 + 50, max_len),
                min_decoding_length=1,
                suppress_sequences=[["<pad>"], ["<s>"]])


def join_subwords(tokens):
    """The words of an output of §5.1 subwords, as ./transformer prints them (bpe_join_tokens):
    each token appended; after one ending in </w>, the marker dropped and a new word begun."""
    text, word_open = [], False
    for token in tokens:
        ends = token.endswith(END_OF_WORD)
        subword = ends or token not in SPECIALS
        if text and not word_open:
            text.append(" ")
        text.append(token[:-len(END_OF_WORD)] if subword and ends else token)
        word_open = subword and not ends
    return "".join(text)


def sums_checked_by(binary, checkpoint):
    """Whether ./transformer (binary) loads the checkpoint, which checks its checksums in C: the
    FNV-1a of a 54 MB file byte by byte in Python takes most of a minute."""
    import subprocess
    if not binary or not os.access(binary, os.X_OK):
        return False
    p = subprocess.run([binary, "decode", "--checkpoint", checkpoint], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True)
    if p.returncode != 0:
        fail(checkpoint, f"{binary} does not load it: {p.stderr.strip()}")
    return True


def export(checkpoint, out, force=False, quiet=False, binary="./transformer"):
    """Writes the CTranslate2 directory `out` from `checkpoint`; returns the config."""
    from ctranslate2.converters.converter import Converter

    config, words, tensors, merges = read_checkpoint(
        checkpoint, check_sums=not sums_checked_by(binary, checkpoint))

    class CheckpointConverter(Converter):
        def _load(self):
            return build_spec(config, words, tensors)

    if os.path.exists(out):
        ours = os.path.isdir(out) and os.path.exists(os.path.join(out, "model.bin"))
        if not force or not ours:
            sys.exit(f"error: {out} exists; --force replaces a CTranslate2 model directory "
                     f"(one with a model.bin), and nothing else")
        shutil.rmtree(out)
    CheckpointConverter().convert(out)
    if merges is not None:
        with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8",
                  errors="surrogateescape") as f:
            f.write("# §5.1 merges of %s, in the order learned; cut text with "
                    "./transformer bpe --checkpoint CKPT\n" % os.path.basename(checkpoint))
            for left, right in merges:
                f.write(f"{left} {right}\n")
    if not quiet:
        print(f"wrote {out}: CTranslate2 TransformerSpec, {config['layers']}+{config['layers']} "
              f"post-norm layers, d_model {config['d_model']}, d_ff {config['d_ff']}, "
              f"{config['heads']} heads, vocabulary {config['vocab_size']} (shared), "
              f"{config['positional']} positions, max_len {config['max_len']}"
              f"{', %d merges in merges.txt' % len(merges) if merges else ''}")
    return config


def check(checkpoint, source, binary, out):
    """make ctranslate2-check: CTranslate2's greedy fp32 outputs of the lines of `source` against
    ./transformer decode's, token for token (the §5.1 subwords both write). Returns 0 when all
    are equal."""
    import subprocess
    import ctranslate2

    config = export(checkpoint, out, force=True, binary=binary)
    with open(source, "rb") as f:
        cut = subprocess.run([binary, "bpe", "--checkpoint", checkpoint], stdin=f,
                             capture_output=True, check=True)
        f.seek(0)
        ours = subprocess.run([binary, "decode", "--checkpoint", checkpoint, "--subwords"],
                              stdin=f, capture_output=True, check=True)
    sources = [line.split() for line in cut.stdout.decode("utf-8", "surrogateescape").split("\n")]
    expected = [line.split() for line in ours.stdout.decode("utf-8", "surrogateescape").split("\n")]
    sources, expected = sources[:-1], expected[:-1]   # after the last line end
    if len(sources) != len(expected):
        fail(source, f"bpe gave {len(sources)} lines, decode {len(expected)}")
    translator = ctranslate2.Translator(out, device="cpu", compute_type="float32")
    by_limit = {}   # translate_batch takes one length limit: the sentences grouped by theirs
    for i, tokens in enumerate(sources):
        by_limit.setdefault(len(tokens), []).append(i)
    outputs = [None] * len(sources)
    for n, indices in by_limit.items():
        results = translator.translate_batch([sources[i] for i in indices], beam_size=1,
                                             max_batch_size=32,
                                             **decoding_rules(n, config["max_len"]))
        for i, r in zip(indices, results):
            outputs[i] = r.hypotheses[0]
    same = sum(outputs[i] == expected[i] for i in range(len(sources)))
    first = next((i for i in range(len(sources)) if outputs[i] != expected[i]), None)
    print(f"ctranslate2-check: CTranslate2 {ctranslate2.__version__} greedy fp32 against "
          f"./transformer decode on {source}: {same} of {len(sources)} outputs identical, "
          f"token for token")
    if first is not None:
        print(f"  first difference, line {first + 1}:\n    ours        {' '.join(expected[first])}"
              f"\n    CTranslate2 {' '.join(outputs[first])}")
    return 0 if same == len(sources) and sources else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="a version-4 checkpoint of ours")
    ap.add_argument("--out", required=True, help="the CTranslate2 model directory to write")
    ap.add_argument("--force", action="store_true",
                    help="replace --out when it is a CTranslate2 model directory")
    ap.add_argument("--check", metavar="SOURCE",
                    help="then compare CTranslate2's greedy fp32 outputs of SOURCE's lines with "
                         "./transformer decode's (exit 1 unless all are equal)")
    ap.add_argument("--binary", default="./transformer",
                    help="./transformer: checks the checkpoint's sums (else Python does, slowly) "
                         "and, for --check, decodes")
    a = ap.parse_args()
    if a.check:
        return check(a.checkpoint, a.check, a.binary, a.out)
    export(a.checkpoint, a.out, a.force, binary=a.binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
