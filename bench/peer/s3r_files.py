"""Readers of s3r's files, written from docs/FORMATS.md (not from s3r's code): safetensors,
token shards, a run folder's checkpoint/meta.json and metrics.jsonl. Standard library and numpy
only, so that the PyTorch peer shares no code with s3r."""
import json
import os
import struct

import numpy as np


class FormatError(Exception):
    """A file that does not hold what docs/FORMATS.md says; the message names the file."""


def read_safetensors(path):
    """{name: float32 numpy array of its stored shape} of an F32 safetensors file (8-byte
    little-endian header length, JSON header, data). s3r checkpoints of version 3 store each
    tensor with its shape (matrices (in, out)); versions 1 and 2 stored them flat."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError(f"{path}: {len(blob)} bytes, too short for a safetensors header")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise FormatError(f"{path}: header length {header_len} beyond the file ({len(blob)} bytes)")
    header = json.loads(blob[8:8 + header_len])
    data = memoryview(blob)[8 + header_len:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info.get("dtype") != "F32":
            raise FormatError(f"{path}: tensor '{name}' has dtype {info.get('dtype')}, expected F32")
        begin, end = info["data_offsets"]
        count = 1
        for d in info["shape"]:
            count *= d
        if end - begin != 4 * count or end > len(data):
            raise FormatError(f"{path}: tensor '{name}' offsets {begin}..{end} do not match shape {info['shape']}")
        out[name] = np.frombuffer(data[begin:end], dtype="<f4").astype(np.float32).reshape(info["shape"])
    return out


def read_shard(path):
    """(tokens as int64 numpy array, vocabulary) of a token shard (docs/FORMATS.md)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 32 or blob[:8] != b"S3RTOKS\0":
        raise FormatError(f"{path}: not a token shard (magic {blob[:8]!r})")
    version, width, count, vocab, _ = struct.unpack("<IIQII", blob[8:32])
    if version != 1 or width not in (2, 4):
        raise FormatError(f"{path}: version {version}, bytes per token {width}; expected 1 and 2 or 4")
    if len(blob) != 32 + count * width:
        raise FormatError(f"{path}: {len(blob)} bytes, expected 32 + {count} * {width}")
    tokens = np.frombuffer(blob, dtype="<u2" if width == 2 else "<u4", offset=32, count=count).astype(np.int64)
    if count and int(tokens.max()) >= vocab:
        raise FormatError(f"{path}: token {int(tokens.max())} >= vocabulary {vocab}")
    return tokens, vocab


def read_meta(run_dir):
    """checkpoint/meta.json of a run folder as a dict."""
    path = os.path.join(run_dir, "checkpoint", "meta.json")
    with open(path) as f:
        meta = json.load(f)
    if meta.get("format") != "s3r-checkpoint":
        raise FormatError(f"{path}: format {meta.get('format')!r}, expected 's3r-checkpoint'")
    version = meta.get("version")
    if version not in (1, 2, 3):
        raise FormatError(f"{path}: version {version!r}; this reader knows versions 1 to 3")
    if version >= 3:  # the forward's conventions are recorded: they must be the ones computed here
        arch = meta.get("architecture", {})
        if arch.get("rope", {}).get("layout") != "adjacent-pairs" or arch.get("matrix_orientation") != "in_out":
            raise FormatError(f"{path}: architecture {arch.get('rope')}, {arch.get('matrix_orientation')}: "
                              "expected adjacent-pairs RoPE and (in, out) matrices")
        # `not <=`: a NaN eps (JSON readers accept NaN) must not pass as equal
        if not abs(arch["norm"]["eps"] - meta["config"].get("norm_eps", 1e-5)) <= 1e-12 or \
                arch["rope"]["theta"] != meta["config"].get("rope_theta", 10000.0):
            raise FormatError(f"{path}: architecture and config disagree on norm eps or RoPE theta")
        # config has "kv_heads" only with grouped-query attention (absent: = heads); the
        # architecture always states it
        kv = meta["config"].get("kv_heads", meta["config"].get("heads"))
        if "kv_heads" in arch and arch["kv_heads"] != kv:
            raise FormatError(f"{path}: architecture kv_heads {arch['kv_heads']} and config kv_heads {kv} disagree")
    return meta


def logged_val_loss(run_dir, step):
    """The last val_loss logged for `step` in metrics.jsonl (None when there is none; NaN for null)."""
    found = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            j = json.loads(line)
            if j.get("step") == step and "val_loss" in j:
                found = float("nan") if j["val_loss"] is None else float(j["val_loss"])
    return found
