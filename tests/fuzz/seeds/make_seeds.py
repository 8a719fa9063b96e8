#!/usr/bin/python3
"""Writes the committed seeds that the tree has no small file for (tests/fuzz/README.md):
.npy arrays, safetensors files, the replay's packed inputs, tokenizer.json files, GNMR norm
streams, format / scheme / policy names. Deterministic; run from anywhere:
    /usr/bin/python3 tests/fuzz/seeds/make_seeds.py   (Debian's: python3-numpy)
The seeds of the small checkpoints (seeds/safetensors/tiny-*, seeds/hf_config/hf-*,
seeds/hf_index/*, seeds/cell/mu-sweep-0.json) are written by the library itself: see the README."""
import hashlib
import io
import json
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    os.makedirs(os.path.join(HERE, target), exist_ok=True)
    with open(os.path.join(HERE, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def npy(a, version=None):
    b = io.BytesIO()
    if version is None:
        np.save(b, a)
    else:
        np.lib.format.write_array(b, a, version=version)
    return b.getvalue()


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] laid out in order."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def f32(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype("<f4")


# ---- .npy: every dtype the readers take, both header versions, and a few they refuse
put("npy", "f4-vector.npy", npy(np.arange(5, dtype="<f4")))
put("npy", "f8-matrix.npy", npy(np.arange(6, dtype="<f8").reshape(2, 3) / 3))
put("npy", "f4-v2.npy", npy(np.ones((2, 2), dtype="<f4"), version=(2, 0)))
put("npy", "f4-scalar.npy", npy(np.float32(1.5)))
put("npy", "f4-fortran.npy", npy(np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3))))
put("npy", "f4-big-endian.npy", npy(np.arange(3, dtype=">f4")))
for dt in ["<i4", "<i8", "<u2", "<u4", "|u1"]:
    put("npy", f"{dt[1:]}-tokens.npy", npy(np.array([0, 1, 255, 2 ** (8 * np.dtype(dt).itemsize - 1) - 1], dtype=dt)))
put("npy", "f2-vector.npy", npy(np.array([0.5, -2, 65504], dtype="<f2")))

# ---- safetensors: F32 with metadata, the 16-bit floats, other dtypes, empty and 0-d tensors
put("safetensors", "f32-metadata.safetensors",
    safetensors([("w", "F32", (2, 3), f32((2, 3), 1).tobytes()), ("b", "F32", (3,), f32((3,), 2).tobytes())],
                {"format": "pt"}))
put("safetensors", "bf16-f16.safetensors",
    safetensors([("a", "BF16", (4,), (f32((4,), 3).view("<u4") >> 16).astype("<u2").tobytes()),
                 ("h", "F16", (2, 2), np.arange(4, dtype="<f2").tobytes())]))
put("safetensors", "mixed.safetensors",
    safetensors([("i", "I64", (2,), np.array([1, -1], dtype="<i8").tobytes()), ("u", "U8", (3,), b"\x01\x02\x03"),
                 ("e", "F32", (0, 4), b""), ("s", "F32", (), struct.pack("<f", 2.5)),
                 ("d", "F64", (1,), struct.pack("<d", 0.1)), ("f8", "F8_E4M3", (2,), b"\x38\x40")]))

# ---- replay: byte 0 the optimizer's index (every registered one), bytes 1..4 len(P), P, G
P = safetensors([("w", "F32", (4, 8), f32((4, 8), 4).tobytes()), ("b", "F32", (8,), f32((8,), 5).tobytes())])
G = safetensors([(f"t.{t}.{n}", "F32", s, (f32(s, 10 + 2 * t + i) * 1e-2).tobytes())
                 for t in range(2) for i, (n, s) in enumerate([("w", (4, 8)), ("b", (8,))])])
for k in range(16):  # more than the registry holds: the index is taken mod its size
    put("replay", f"optimizer-{k:02d}", bytes([k]) + struct.pack("<I", len(P)) + P + G)

# ---- tokenizer.json: a small byte-level BPE with the GPT-2 pre-tokenizer, and one with LLaMA-3's
def byte_char(b):
    printable = lambda c: ord("!") <= c <= ord("~") or 0xA1 <= c <= 0xAC or 0xAE <= c <= 0xFF
    return chr(b if printable(b) else 256 + sum(not printable(c) for c in range(b)))


vocab = {byte_char(b): b for b in range(256)}
G_ = byte_char(ord(" "))
for i, t in enumerate([G_ + "t", "he", G_ + "the", "34", "12", "hello"]):
    vocab[t] = 256 + i
merges = [[G_, "t"], ["h", "e"], [G_ + "t", "he"], ["3", "4"], ["1", "2"]]
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
put("tokenizer_json", "gpt2-style.json", json.dumps({
    "version": "1.0", "added_tokens": [{"id": 262, "content": "<|endoftext|>", "special": True}],
    "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True},
    "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
              "merges": [" ".join(m) for m in merges]}}, ensure_ascii=False))
put("tokenizer_json", "llama3-style.json", json.dumps({
    "added_tokens": [{"id": 262, "content": "<|begin_of_text|>", "special": True}], "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "post_processor": {"type": "TemplateProcessing"}, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": None, "ignore_merges": True, "byte_fallback": False, "vocab": vocab,
              "merges": merges}}, ensure_ascii=False))

# ---- GNMR norm streams: four units over 40 steps (past the default warm-up), one spiking unit
rng = np.random.default_rng(7)
rows = ["step,unit,grad_norm"]
for s in range(1, 41):
    for u in ["layer.0.attn.qkv", "layer.0.mlp.fc", "layer.1.attn.proj", "lm_head"]:
        rows.append(f"{s},{u},{abs(rng.standard_normal()) * (50 if u == 'lm_head' and s % 9 == 0 else 1):.17g}")
put("gnmr_norms", "four-units.csv", "\n".join(rows) + "\n")
put("gnmr_norms", "crlf-one-unit.csv", "step,unit,grad_norm\r\n1,u,1.5\r\n2,u,0\r\n3,u,1e300\r\n")

# ---- names and specs (format_lookup, scheme_lookup, policy_from_spec)
for n in ["ps7", "e4m3", "E5M2", "int8", "int4tc", "uint8", "p3109_p3", "e8m0", "bfloat16", "float8_e4m3fnuz", "e11m52",
          "ps23"]:
    put("format", n, n)
for n in ["mxfp8_e4m3", "mxfp4", "nvfp4", "mxint8", "deepseek_act", "int8_channel", "uint8_tensor_zp"]:
    put("scheme", n, n)
put("scheme", "minmax-row.toml", 'element = "uint4"\nblock = "row"\nrule = "minmax"\nscale = "bf16"\n')
put("scheme", "two-level.toml",
    'name = "nv"\nelement = "fp4_e2m1"\nblock = [1, 16]\nrule = "absmax"\nscale = "e4m3"\ntwo_level = true\n'
    'division = "reciprocal"\n')
for n in ["native", "lamp:4", "lamp:23"]:
    put("policy", n.replace(":", "-"), n)
put("policy", "lamp-tables.toml",
    '[lamp]\nrule = "strict"\ntau = 0.05\nrecompute = "ps10"\n[lamp_activation]\ntau = 1\n'
    '[site."attn.qk"]\naccumulation = "strict"\naccumulator = "ps4"\n'
    'output = "ps4"\nrounding = "sr"\nsr_bits = 8\nseed = 3\n[site."layer.1.mlp.fc"]\ninput = "bf16"\n'
    'accumulation = "blocked"\naccumulator = "fp16"\nblock = 4\n[site."mlp.fc".dw]\ninput = "e4m3"\n')

# ---- manifest: one that verifies against fuzz_manifest.cpp's set (keep its two files' text in step)
SET = {"results.csv": "model,mu,kl_nats,flips,seconds\nm,4,0.5,3,1.25\nm,7,,0,nan\n",
       "results.json": "{\"results\": []}\n"}
put("manifest", "valid.json", json.dumps({
    "generator": "mantis fuzz", "git_commit": "0", "model": "m", "policy": "native",
    "files": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in SET.items()}}, indent=1) + "\n")
