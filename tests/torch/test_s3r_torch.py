"""Tests of s3r_torch (python/s3r_torch): the forward pass against an int8 reference written here
from SPEC section 1, the backward pass against s3r's own layer (tests/torch/linear_golden.cpp) bit
for bit, thread counts, gradient accumulation, unbiasedness over threshold keys and the effect of
S3R-EC's correction (statistical, fixed seeds, tolerances from the sample size), bad input, and
convert() with an optimizer.

Run by ctest (tests/torch/CMakeLists.txt) with PYTHONPATH at the build's python/ folder and
S3R_LINEAR_GOLDEN naming the golden program:
    /usr/bin/python3 tests/torch/test_s3r_torch.py -v
"""
import math
import os
import statistics
import subprocess
import tempfile
import unittest

import torch
from torch import nn

import s3r_torch

F32, F64 = torch.float32, torch.float64
INT8_RECIPES = ("rtne", "sr", "s3r", "s3r+dx", "s3r+two-way", "s3r-bcast", "s3r-bcast+dx")


def quantize(x, dim):
    """SPEC section 1, written independently of s3r: scale = absmax / 127 (f32; 1 for an all-zero
    row), codes = rne(x / scale) (the division in f32)."""
    scale = x.abs().amax(dim=dim, keepdim=True) / torch.tensor(127.0, dtype=F32)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.clamp(torch.round(x / scale), -127, 127), scale


def int8_forward(x, weight, scale_divisor=127.0):
    """Y = sx sw (Xq Wq) for x (T, K), weight (N, K): the integer sums exact in float64, rounded to
    f32 once, then times sw and times sx (s3r's epilogue order)."""
    xq, sx = quantize(x, 1)                       # (T, K), (T, 1)
    wq, sw = quantize(weight.t().contiguous(), 0)  # (K, N), (1, N)
    if scale_divisor != 127.0:  # a deliberate bug, to show the comparison's resolution
        wq, sw = [torch.clamp(torch.round(weight.t() / (weight.t().abs().amax(0, keepdim=True) / scale_divisor)),
                              -127, 127), weight.t().abs().amax(0, keepdim=True) / scale_divisor]
    acc = (xq.to(F64) @ wq.to(F64)).to(F32)
    return (acc * sw) * sx, (xq, sx, wq, sw)


def golden(recipe, x, weight, g, S, seed, step, layer, first_token):
    """(y, dx, dweight) of s3r's own layer (tests/torch/linear_golden.cpp)."""
    T, K = x.shape
    N = weight.shape[0]
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        with open(src, "wb") as f:
            for t in (x, weight.t(), g):
                f.write(t.detach().contiguous().numpy().tobytes())
        subprocess.run([os.environ["S3R_LINEAR_GOLDEN"], recipe, str(T), str(K), str(N), str(S), str(seed),
                        str(step), str(layer), str(first_token), src, dst], check=True)
        out = torch.frombuffer(bytearray(open(dst, "rb").read()), dtype=F32)
    y, dx, dw = torch.split(out, [T * N, T * K, K * N])
    return y.view(T, N), dx.view(T, K), dw.view(K, N).t()


def layer_run(layer, x, g):
    """(y, dx, dweight) of one forward and backward of `layer` on a fresh leaf x."""
    x = x.clone().requires_grad_(True)
    layer.weight.grad = None
    y = layer(x)
    y.backward(g.view_as(y))
    return y.detach(), x.grad, layer.weight.grad.clone()


def bits_equal(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


class Forward(unittest.TestCase):
    def test_int8_forward_equals_reference(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 24, 48, generator=g) * torch.rand(2, 24, 1, generator=g) * 3
        x[0, 5] = 0.0  # an all-zero token: scale 1
        for recipe in ("s3r+dx", "sr", "rtne"):
            layer = s3r_torch.Linear(48, 40, bias=True, recipe=recipe)
            with torch.no_grad():
                layer.weight[:, 7] = 0.0
                layer.weight[3] = 0.0  # an all-zero output channel
                layer.bias.normal_(generator=g)
            y = layer(x)
            ref, _ = int8_forward(x.view(-1, 48), layer.weight.detach())
            ref = ref + layer.bias.detach()
            self.assertTrue(bits_equal(y.detach().view(-1, 40), ref), f"{recipe}: forward differs from the reference")
            # the comparison sees a one-code change of scale: absmax / 128 instead of / 127
            bug, _ = int8_forward(x.view(-1, 48), layer.weight.detach(), scale_divisor=128.0)
            self.assertFalse(bits_equal(y.detach().view(-1, 40), bug + layer.bias.detach()))

    def test_float_recipes(self):
        g = torch.Generator().manual_seed(2)
        x = torch.randn(64, 32, generator=g)
        for recipe, tol in (("f32", 1e-6), ("bf16", 1e-2)):
            layer = s3r_torch.Linear(32, 16, recipe=recipe)
            ref = nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
            err = float((layer(x).double() - ref).abs().max() / ref.abs().max())
            self.assertLess(err, tol, recipe)

    def test_no_grad_matches_and_keeps_nothing(self):
        layer = s3r_torch.Linear(32, 16)
        x = torch.randn(4, 8, 32, requires_grad=True)
        with torch.no_grad():
            y0 = layer(x)
        self.assertIsNone(y0.grad_fn)
        self.assertEqual(layer._tokens, (-1, 0))
        self.assertTrue(bits_equal(y0, layer(x).detach()))


class Backward(unittest.TestCase):
    def test_equals_s3r_layer_bit_for_bit(self):
        g = torch.Generator().manual_seed(3)
        B, S, K, N = 3, 16, 40, 56
        for i, recipe in enumerate(INT8_RECIPES + ("bf16", "f32")):
            seed, step, index = 11 + i, 5 + 3 * i, 2 + i
            layer = s3r_torch.Linear(K, N, bias=False, recipe=recipe, seed=seed, layer_index=index)
            x = torch.randn(B, S, K, generator=g)
            dy = torch.randn(B, S, N, generator=g) * 1e-3
            s3r_torch.set_step(step)
            y, dx, dw = layer_run(layer, x, dy)
            gy, gdx, gdw = golden(recipe, x.view(-1, K), layer.weight.detach(), dy.view(-1, N), S, seed, step, index, 0)
            self.assertTrue(bits_equal(y.view(-1, N), gy), f"{recipe}: y")
            self.assertTrue(bits_equal(dx.view(-1, K), gdx), f"{recipe}: dX")
            self.assertTrue(bits_equal(dw, gdw), f"{recipe}: dW")
            if recipe in ("sr", "s3r+dx"):  # another key gives other bits: the key reaches the layer
                _, odx, _ = golden(recipe, x.view(-1, K), layer.weight.detach(), dy.view(-1, N), S, seed, step + 1,
                                   index, 0)
                self.assertFalse(bits_equal(dx.view(-1, K), odx), f"{recipe}: the step does not change dX")
        s3r_torch.set_step(0)

    def test_gradient_accumulation_keeps_micro_batches_apart(self):
        """Two forward calls in one step: the second call's tokens follow the first's (first global
        token T), as s3r's micro-batches; the weight gradient is the sum of the two calls'."""
        g = torch.Generator().manual_seed(4)
        B, S, K, N = 2, 8, 24, 32
        layer = s3r_torch.Linear(K, N, bias=False, recipe="s3r+dx", seed=9, layer_index=4)
        s3r_torch.set_step(7)
        xs = [torch.randn(B, S, K, generator=g) for _ in range(2)]
        dys = [torch.randn(B, S, N, generator=g) for _ in range(2)]
        leaves = [x.clone().requires_grad_(True) for x in xs]
        ys = [layer(x) for x in leaves]
        (ys[0] * dys[0]).sum().backward()
        (ys[1] * dys[1]).sum().backward()
        golds = [golden("s3r+dx", xs[m].view(-1, K), layer.weight.detach(), dys[m].view(-1, N), S, 9, 7, 4,
                        m * B * S) for m in range(2)]
        for m in range(2):
            self.assertTrue(bits_equal(leaves[m].grad.view(-1, K), golds[m][1]), f"micro-batch {m}: dX")
        self.assertTrue(bits_equal(layer.weight.grad, golds[0][2] + golds[1][2]))
        s3r_torch.step()  # a new step starts again at token 0
        x = xs[0].clone().requires_grad_(True)
        layer(x).backward(dys[0])
        gold = golden("s3r+dx", xs[0].view(-1, K), layer.weight.detach(), dys[0].view(-1, N), S, 9, 8, 4, 0)
        self.assertTrue(bits_equal(x.grad.view(-1, K), gold[1]))
        s3r_torch.set_step(0)

    def test_any_thread_count_same_bits(self):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(4, 64, 256, generator=g)
        dy = torch.randn(4, 64, 384, generator=g)
        layer = s3r_torch.Linear(256, 384, recipe="s3r+dx")
        before = torch.get_num_threads()
        runs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            s3r_torch.set_step(0)  # each run is token 0 of step 0
            runs.append(layer_run(layer, x, dy))
        torch.set_num_threads(before)
        for r in runs[1:]:
            for a, b in zip(runs[0], r):
                self.assertTrue(bits_equal(a, b))


def exact_gradients(x, weight, dy):
    """dX and dW (nn.Linear's layout) with the forward's quantized X and W and the gradient not
    rounded: dX = G sw Wq^T, dW = (sx Xq)^T G (float64), and D (SPEC section 1)."""
    _, (xq, sx, wq, sw) = int8_forward(x, weight)
    G = dy.to(F64)
    dx = (G * sw.to(F64)) @ wq.to(F64).t()
    dw = ((xq.to(F64) * sx.to(F64)).t() @ G).t()
    D = float((sx.to(F64) * G * sw.to(F64)).abs().max()) / 127.0
    return dx, dw, D, (xq, sx, wq, sw)


def z_critical(alpha, tests):
    """The two-sided normal critical value at family-wise level alpha over `tests` comparisons
    (Bonferroni)."""
    p = alpha / (2 * tests)
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(mid / math.sqrt(2)) > p:
            lo = mid
        else:
            hi = mid
    return hi


class Statistics(unittest.TestCase):
    """Over n threshold keys (steps 0..n-1) of one fixed layer and gradient."""
    n = 300
    B, S, K, N = 4, 16, 32, 48

    @classmethod
    def setUpClass(cls):
        g = torch.Generator().manual_seed(6)
        cls.x = torch.randn(cls.B * cls.S, cls.K, generator=g)
        cls.dy = torch.randn(cls.B * cls.S, cls.N, generator=g) * torch.rand(cls.B * cls.S, 1, generator=g)
        cls.samples = {}
        for recipe in ("sr", "s3r", "s3r+dx", "s3r+two-way"):
            layer = s3r_torch.Linear(cls.K, cls.N, bias=False, recipe=recipe, seed=3, layer_index=1)
            with torch.no_grad():
                layer.weight.copy_(torch.randn(cls.N, cls.K, generator=torch.Generator().manual_seed(8)) * 0.1)
            dxs, dws = [], []
            for k in range(cls.n):
                s3r_torch.set_step(k)
                _, dx, dw = layer_run(layer, cls.x.view(cls.B, cls.S, cls.K), cls.dy.view(cls.B, cls.S, cls.N))
                dxs.append(dx.view(-1, cls.K).double())
                dws.append(dw.double())
            cls.samples[recipe] = (torch.stack(dxs), torch.stack(dws))
        s3r_torch.set_step(0)
        cls.weight = layer.weight.detach().clone()
        cls.exact_dx, cls.exact_dw, cls.D, cls.q = exact_gradients(cls.x, cls.weight, cls.dy)

    def unbiased(self, samples, exact, bias_bound):
        """Whether every element's mean over the keys is within z * se + bias_bound of `exact`,
        z Bonferroni-corrected over the elements at family-wise level 1e-3."""
        mean, sd = samples.mean(0), samples.std(0)
        z = z_critical(1e-3, exact.numel())
        return bool(((mean - exact).abs() <= z * sd / math.sqrt(samples.shape[0]) + bias_bound + 1e-12).all())

    def bias_bounds(self, recipe):
        """The 7-bit thresholds' bias (SPEC section 2: at most D/256 per rounded element), carried
        through the products, twice for the corrected gradients (the correction subtracts means
        of the same biased errors); 0 for sr (23-bit thresholds: 2^-24, ignored)."""
        if recipe == "sr":
            return 0.0, 0.0
        xq, sx, wq, sw = [t.to(F64) for t in self.q]
        per = (self.D / 256.0) * (2.0 if "+" in recipe else 1.0)
        bx = per / sx * wq.abs().sum(1)[None, :]              # (T, K): sum_n |Wq[k, n]| / sx[t]
        bw = (per / sw.t()) * xq.abs().sum(0)[None, :]        # (N, K): sum_t |Xq[t, k]| / sw[n]
        return bx, bw

    def test_unbiased_over_keys(self):
        for recipe, (dxs, dws) in self.samples.items():
            bx, bw = self.bias_bounds(recipe)
            self.assertTrue(self.unbiased(dxs, self.exact_dx, bx), f"{recipe}: dX biased")
            self.assertTrue(self.unbiased(dws, self.exact_dw, bw), f"{recipe}: dW biased")
            # the test's power: a 2% error of the gradient's scale is rejected
            self.assertFalse(self.unbiased(dxs, self.exact_dx * 1.02, bx), f"{recipe}: a 2% bias in dX passes")
            self.assertFalse(self.unbiased(dws, self.exact_dw * 1.02, bw), f"{recipe}: a 2% bias in dW passes")

    def mse(self, recipe, which):
        dxs, dws = self.samples[recipe]
        s, e = (dxs, self.exact_dx) if which == "dx" else (dws, self.exact_dw)
        per_key = ((s - e) ** 2).mean(dim=tuple(range(1, s.dim())))
        return float(per_key.mean()), float(per_key.std() / math.sqrt(len(per_key)))

    def test_correction_reduces_dx_error(self):
        """SPEC section 5, properties 3-4: one threshold per token moves error variance into dX,
        which the dX correction removes (back to about sr's); dW's error is about sr's in every
        recipe, and two-way lowers it. Margins: 5 standard errors of the ratios' estimates."""
        sr, s3r, dx, two = (self.mse(r, "dx") for r in ("sr", "s3r", "s3r+dx", "s3r+two-way"))
        rel = lambda a: a[1] / a[0]
        margin = lambda a, b: 5 * math.hypot(rel(a), rel(b))
        self.assertGreater(s3r[0] / dx[0], 1.5 + margin(s3r, dx), f"dX mse: s3r {s3r}, s3r+dx {dx}")
        self.assertLess(dx[0] / sr[0], 1.0 + margin(dx, sr), f"dX mse: s3r+dx {dx}, sr {sr}")
        wsr, ws3r, wdx, wtwo = (self.mse(r, "dw") for r in ("sr", "s3r", "s3r+dx", "s3r+two-way"))
        self.assertLess(abs(ws3r[0] / wsr[0] - 1), 0.25 + margin(ws3r, wsr), f"dW mse: s3r {ws3r}, sr {wsr}")
        self.assertLess(wtwo[0], wdx[0], f"dW mse: two-way {wtwo}, dx {wdx}")


class Buffers(unittest.TestCase):
    """Outputs of 1 MiB or more come from a pool of freed ones, and the codes a forward call saves
    are reused after its backward pass: reuse must not change a bit, nor touch a live tensor."""

    def test_reused_buffers_give_the_same_bits(self):
        g = torch.Generator().manual_seed(9)
        B, S, K, N = 4, 128, 512, 640  # y, dx and dweight of 1.25, 1 and 1.25 MiB
        big = s3r_torch.Linear(K, N, bias=False, recipe="s3r+dx", seed=3, layer_index=1)
        other = s3r_torch.Linear(N, K // 2, bias=False, recipe="s3r+dx", seed=3, layer_index=2)
        x = torch.randn(B, S, K, generator=g)
        dy = torch.randn(B, S, N, generator=g) * 1e-3
        s3r_torch.set_step(4)
        want = golden("s3r+dx", x.view(-1, K), big.weight.detach(), dy.view(-1, N), S, 3, 4, 1, 0)
        s3r_torch.release_buffers()
        self.assertEqual(s3r_torch._C.pooled_bytes(), 0)
        for run in range(3):  # fresh buffers, then pooled ones (other sizes in between)
            s3r_torch.set_step(4)
            y, dx, dw = layer_run(big, x, dy)
            for name, got, ref in zip(("y", "dX", "dW"), (y.view(-1, N), dx.view(-1, K), dw), want):
                self.assertTrue(bits_equal(got, ref), f"run {run}: {name}")
            layer_run(other, torch.randn(B, S, N, generator=g), torch.randn(B, S, K // 2, generator=g))
            self.assertGreater(s3r_torch._C.pooled_bytes(), 0)
        s3r_torch.set_step(0)

    def test_a_live_output_keeps_its_values_and_a_freed_one_is_reused(self):
        layer = s3r_torch.Linear(512, 1024, bias=False)
        x1, x2 = torch.randn(512, 512), torch.randn(512, 512)
        with torch.no_grad():
            y1 = layer(x1)
            kept = y1.clone()
            y2 = layer(x2)
            self.assertNotEqual(y1.data_ptr(), y2.data_ptr())
            self.assertTrue(bits_equal(y1, kept))
            ptr = y1.data_ptr()
            del y1
            y3 = layer(x1)
        self.assertEqual(y3.data_ptr(), ptr)  # y1's buffer, back from the pool
        self.assertTrue(bits_equal(y3, kept))
        del y2, y3
        s3r_torch.release_buffers()
        self.assertEqual(s3r_torch._C.pooled_bytes(), 0)

    def test_a_saved_forward_is_used_once(self):
        layer = s3r_torch.Linear(16, 8)
        x = torch.randn(4, 16)
        _, saved = s3r_torch._C.forward(x, layer.weight.detach(), "s3r+dx", 4, True)
        g = torch.randn(4, 8)
        ws = s3r_torch._C.Workspace()
        s3r_torch._C.backward(saved, g, True, 0, 0, 0, 0, ws)
        with self.assertRaises(ValueError) as cm:
            s3r_torch._C.backward(saved, g, True, 0, 0, 0, 0, ws)
        self.assertIn("used by a backward pass already", str(cm.exception))


class BadInput(unittest.TestCase):
    def assertRaisesMsg(self, exc, text, fn):
        with self.assertRaises(exc) as cm:
            fn()
        self.assertIn(text, str(cm.exception))

    def test_messages(self):
        layer = s3r_torch.Linear(16, 8)
        self.assertRaisesMsg(ValueError, "expected (..., 16)", lambda: layer(torch.randn(4, 15)))
        self.assertRaisesMsg(TypeError, "float32", lambda: layer(torch.randn(4, 16, dtype=F64)))
        self.assertRaisesMsg(TypeError, "float32", lambda: layer(torch.randn(4, 16).to(torch.bfloat16)))
        self.assertRaisesMsg(ValueError, "CPU only", lambda: layer(torch.empty(4, 16, device="meta")))
        self.assertRaisesMsg(ValueError, "CPU only", lambda: s3r_torch.Linear(16, 8, device="cuda"))
        self.assertRaisesMsg(ValueError, "unknown recipe 'int4'", lambda: s3r_torch.Linear(16, 8, recipe="int4"))
        self.assertRaisesMsg(ValueError, "unknown recipe", lambda: s3r_torch.convert(nn.Linear(2, 2), recipe="x"))
        self.assertRaisesMsg(TypeError, "must be a torch.Tensor", lambda: layer([1.0] * 16))
        bad = s3r_torch.Linear(16, 8)
        bad.weight = nn.Parameter(torch.randn(16, 8).t())
        self.assertRaisesMsg(ValueError, "not contiguous", lambda: bad(torch.randn(4, 16)))
        bad.weight = nn.Parameter(torch.randn(8, 16, dtype=F64))
        self.assertRaisesMsg(TypeError, "float32", lambda: bad(torch.randn(4, 16)))
        nan = torch.randn(4, 16)
        nan[1, 3] = float("nan")
        self.assertRaises(FloatingPointError, lambda: layer(nan))
        x = torch.randn(4, 16, requires_grad=True)
        y = layer(x)
        self.assertRaises(FloatingPointError, lambda: y.backward(torch.full_like(y, float("inf"))))
        y = layer(x)
        y.sum().backward(retain_graph=True)
        self.assertRaisesMsg(RuntimeError, "retain_graph", lambda: y.sum().backward())
        self.assertRaises(TypeError, lambda: s3r_torch._C.forward(None, None, "s3r", 1, False))
        self.assertRaises(ValueError, lambda: s3r_torch.set_step(-1))
        self.assertRaises(ValueError, lambda: s3r_torch.Linear(16, 8, seed=2 ** 32))

    def test_bf16_only_under_autocast(self):
        layer = s3r_torch.Linear(16, 8)
        x = torch.randn(4, 16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x.to(torch.bfloat16))
        self.assertEqual(y.dtype, F32)
        self.assertTrue(bits_equal(y.detach(), layer(x.to(torch.bfloat16).float()).detach()))

    def test_a_non_contiguous_input_is_fine(self):
        layer = s3r_torch.Linear(16, 8)
        x = torch.randn(16, 4, 6).permute(2, 1, 0)  # (6, 4, 16), not contiguous
        self.assertTrue(bits_equal(layer(x).detach(), layer(x.contiguous()).detach()))


class Machine(unittest.TestCase):
    def test_the_line_names_the_tier_and_threads(self):
        """The capped runs of this file (S3R_MAX_ISA, S3R_ISA) really run capped."""
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        line = s3r_torch.machine()
        torch.set_num_threads(before)
        self.assertIn("2 OpenMP threads", line)
        if os.environ.get("S3R_MAX_ISA"):
            self.assertIn(f"capped at {os.environ['S3R_MAX_ISA']} by S3R_MAX_ISA", line)
        if os.environ.get("S3R_ISA"):
            self.assertIn(f"kernels {os.environ['S3R_ISA']};", line)
        print(f"\n  s3r_torch.machine(): {line}")


class Convert(unittest.TestCase):
    def test_convert_and_train(self):
        torch.manual_seed(0)
        model = nn.ModuleDict({"up": nn.Linear(16, 64), "down": nn.Linear(64, 16), "lm_head": nn.Linear(16, 10)})
        keys = list(model.state_dict())
        params = [id(p) for p in model.parameters()]
        s3r_torch.convert(model, recipe="s3r+dx", seed=5)
        self.assertIsInstance(model["up"], s3r_torch.Linear)
        self.assertIsInstance(model["down"], s3r_torch.Linear)
        self.assertIs(type(model["lm_head"]), nn.Linear)  # the LM head stays
        self.assertEqual([model["up"].layer_index, model["down"].layer_index], [0, 1])
        self.assertEqual(list(model.state_dict()), keys)
        self.assertEqual([id(p) for p in model.parameters()], params)
        opt = s3r_torch.advance_on(torch.optim.AdamW(model.parameters(), lr=1e-2))
        s3r_torch.set_step(0)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(8, 12, 16, generator=g)
        target = torch.randint(0, 10, (8, 12), generator=g)
        losses = []
        for _ in range(30):
            logits = model["lm_head"](torch.relu(model["down"](torch.relu(model["up"](x)))))
            loss = nn.functional.cross_entropy(logits.view(-1, 10), target.view(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        self.assertEqual(s3r_torch.current_step(), 30)
        self.assertLess(losses[-1], 0.5 * losses[0])
        s3r_torch.convert(model, skip=[])
        self.assertIsInstance(model["lm_head"], s3r_torch.Linear)
        self.assertEqual(model["lm_head"].layer_index, 2)  # numbered after the model's s3r layers
        self.assertIn("s3r+dx", s3r_torch.recipes())
        s3r_torch.set_step(0)


if __name__ == "__main__":
    unittest.main()
