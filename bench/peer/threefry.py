"""Threefry-2x32-20 and JAX's key handling (SPEC section 3), in plain Python integers, and the
validation windows that s3r's DataLoader serves (its Fisher-Yates order on Threefry words).

Run as a script it checks the SPEC's known answers."""

M32 = 0xFFFFFFFF
_ROT = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA


def threefry2x32(key, c0, c1):
    """(y0, y1) = Threefry-2x32 with 20 rounds of `key` = (k0, k1) on counter (c0, c1)."""
    k0, k1 = key
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0 = (c0 + ks[0]) & M32
    x1 = (c1 + ks[1]) & M32
    for r in range(20):
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


def _self_test():
    # SPEC section 3's known answers (Random123 / JAX).
    assert threefry2x32((0, 0), 0, 0) == (0x6B200159, 0x99BA4EFE), "threefry known answer 1"
    assert threefry2x32((0x13198A2E, 0x03707344), 0x243F6A88, 0x85A308D3) == (0xC4923A9C, 0x483DF7A0), \
        "threefry known answer 2"
    order = window_order(1000, 0x5EED, 0)
    assert sorted(order) == list(range(1000))
    print("threefry: known answers ok")


if __name__ == "__main__":
    _self_test()
