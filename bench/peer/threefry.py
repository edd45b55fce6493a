"""Threefry-2x32-20 and JAX's key handling (SPEC section 3), in plain Python integers, and the
validation windows that s3r's DataLoader serves (its Fisher-Yates order on Threefry words).

Run as a script it checks the known answers of tests/known_answers/ (Random123's published
Threefry-2x32 vectors, JAX's bits and uniforms), the same files the C++ tests read, and the
window orders that s3r's DataLoader served (below)."""

import hashlib
import os
import struct

M32 = 0xFFFFFFFF
_ROT = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA


def threefry2x32(key, c0, c1, rounds=20):
    """(y0, y1) = Threefry-2x32 with `rounds` rounds (20: s3r's) of `key` = (k0, k1) on counter
    (c0, c1)."""
    k0, k1 = key
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0 = (c0 + ks[0]) & M32
    x1 = (c1 + ks[1]) & M32
    for r in range(rounds):
        x0 = (x0 + x1) & M32
        rot = _ROT[r % 8]
        x1 = ((x1 << rot) | (x1 >> (32 - rot))) & M32
        x1 ^= x0
        if r % 4 == 3:
            s = r // 4 + 1
            x0 = (x0 + ks[s % 3]) & M32
            x1 = (x1 + ks[(s + 1) % 3] + s) & M32
    return x0, x1


def key_from_seed(seed):
    return (0, seed & M32)


def fold_in(key, data):
    return threefry2x32(key, 0, data & M32)


def random_bits32(key, index):
    """jax.random.bits element `index` in the partitionable layout: y0 ^ y1 of (hi32, lo32)."""
    y0, y1 = threefry2x32(key, (index >> 32) & M32, index & M32)
    return y0 ^ y1


def window_order(windows, seed, epoch):
    """The permutation of window indices of one epoch: identity, then Fisher-Yates from the top
    with j = (bits32(fold_in(key(seed), epoch), i) * (i + 1)) >> 32 (s3r/data/dataloader.hpp)."""
    order = list(range(windows))
    key = fold_in(key_from_seed(seed), epoch)
    for i in range(windows - 1, 0, -1):
        j = (random_bits32(key, i) * (i + 1)) >> 32
        order[i], order[j] = order[j], order[i]
    return order


def loader_batches(tokens, seq_len, seed, batch, count):
    """`count` batches of (inputs, targets), each a list of `batch` windows (start offsets), as a
    fresh DataLoader(shard, seq_len, seed) serves them: windows of S + 1 tokens at multiples of S,
    a new permutation (epoch + 1) when one runs out. Returns a list of lists of window starts."""
    windows = (len(tokens) - 1) // seq_len
    if windows < 1:
        raise ValueError(f"the shard holds {len(tokens)} tokens, fewer than one window of S + 1 = {seq_len + 1}")
    epoch, cursor = 0, 0
    order = window_order(windows, seed, epoch)
    out = []
    for _ in range(count):
        starts = []
        for _ in range(batch):
            if cursor == windows:
                epoch += 1
                cursor = 0
                order = window_order(windows, seed, epoch)
            starts.append(order[cursor] * seq_len)
            cursor += 1
        out.append(starts)
    return out


# Known answers of s3r's DataLoader (src/data/dataloader.cpp), printed by a small C++ program
# linked with libs3r: a shard whose tokens count 0, 1, 2, ..., so that each window served is its
# first input token / S. (windows, S, seed, B, batches, window indices in the order served):
_LOADER_KNOWN_ANSWERS = [
    # two epochs of 25 windows
    (25, 8, 42, 5, 10, [
        9, 13, 4, 2, 10, 15, 22, 1, 23, 21, 11, 6, 17, 19, 7, 18, 8, 12, 3, 16, 0, 24, 5, 20,
        14, 15, 13, 14, 5, 22, 1, 21, 0, 10, 17, 19, 4, 24, 20, 9, 18, 2, 12, 6, 3, 8, 23, 7,
        16, 11]),
    # cli.train_smoke's val.bin as check_checkpoint.py reads it (95 windows of S = 32, seed 0x5eed,
    # 30 batches of 4 windows: into the second epoch)
    (95, 32, 0x5EED, 4, 30, [
        31, 89, 14, 76, 75, 17, 18, 72, 35, 85, 13, 78, 62, 8, 29, 59, 67, 86, 48, 33, 91, 83,
        10, 71, 40, 15, 55, 60, 6, 16, 36, 56, 42, 34, 66, 32, 57, 63, 82, 49, 25, 24, 19, 3,
        20, 94, 61, 43, 23, 73, 77, 64, 65, 50, 44, 47, 4, 5, 52, 37, 0, 12, 58, 2, 93, 39, 7,
        80, 84, 1, 90, 9, 26, 68, 88, 21, 70, 51, 69, 30, 11, 74, 81, 41, 38, 87, 28, 22, 53,
        92, 79, 46, 45, 27, 54, 10, 54, 74, 37, 52, 19, 5, 28, 27, 62, 50, 18, 17, 31, 36, 43,
        47, 77, 32, 51, 22, 39, 55, 49, 42]),
]
# The same loader's epoch 7 of 1000 windows with seed 0x5eed (set_position({7, 0})): its first
# and last 12 windows, and the SHA-256 of all 1000 written as "143,847,...".
_ORDER_1000_EPOCH_7 = ([143, 847, 288, 437, 626, 137, 870, 574, 823, 269, 805, 602],
                       [682, 761, 825, 791, 438, 616, 418, 614, 175, 181, 646, 388],
                       "5355fce0f9069bafa282875452defde073ae9f9f846de9e170c93876af5eb6df")

_KNOWN_ANSWERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                              "known_answers")


def _data_lines(name):
    with open(os.path.join(_KNOWN_ANSWERS, name)) as f:
        return [line.split() for line in f if line.strip() and not line.startswith("#")]


def _self_test():
    # Random123's Threefry-2x32 vectors (13 and 20 rounds).
    threefry = 0
    for name, rounds, *words in _data_lines("random123_kat.txt"):
        if name != "threefry2x32":
            continue
        c0, c1, k0, k1, y0, y1 = (int(w, 16) for w in words)
        got = threefry2x32((k0, k1), c0, c1, int(rounds))
        assert got == (y0, y1), f"threefry2x32 {rounds} rounds, counter {c0:08x} {c1:08x}: {got}"
        threefry += 1
    assert threefry == 6, f"expected 6 threefry2x32 vectors in random123_kat.txt, found {threefry}"
    # JAX's bits and uniforms (partitionable layout); a uniform is float32((bits >> 9) * 2^-23).
    jax = 0
    for kind, seed, index, expected in _data_lines("jax_threefry.txt"):
        bits = random_bits32(key_from_seed(int(seed)), int(index))
        if kind == "bits32":
            assert bits == int(expected), f"bits32 seed {seed} index {index}: {bits}"
        else:
            assert kind == "uniform", f"unknown kind {kind} in jax_threefry.txt"
            f32 = struct.unpack("f", struct.pack("f", float(expected)))[0]
            assert (bits >> 9) * 2.0 ** -23 == f32, f"uniform seed {seed} index {index}"
        jax += 1
    assert jax == 20, f"expected 20 vectors in jax_threefry.txt, found {jax}"
    # The loader's window order: the exact windows s3r serves, not just some permutation.
    for windows, seq_len, seed, batch, count, expected in _LOADER_KNOWN_ANSWERS:
        starts = loader_batches(list(range(windows * seq_len + 1)), seq_len, seed, batch, count)
        got = [start // seq_len for b in starts for start in b]
        if got != expected:
            i = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e)
            raise AssertionError(f"loader order, {windows} windows of S = {seq_len}, seed {seed:#x}: windows "
                                 f"{i}.. served {got[i:i + 8]}, s3r serves {expected[i:i + 8]}")
    head, tail, digest = _ORDER_1000_EPOCH_7
    order = window_order(1000, 0x5EED, 7)
    assert order[:12] == head and order[-12:] == tail and \
        hashlib.sha256(",".join(map(str, order)).encode()).hexdigest() == digest, \
        f"window order of 1000 windows, epoch 7: {order[:12]}...{order[-12:]}, s3r {head}...{tail}"
    print(f"threefry: known answers ok ({threefry} Random123, {jax} JAX, "
          f"{len(_LOADER_KNOWN_ANSWERS) + 1} loader orders of s3r)")


if __name__ == "__main__":
    _self_test()
