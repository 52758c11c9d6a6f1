#!/usr/bin/env python3
"""bench/torch_cpu.py - the PyTorch peer of bench/train.c, bench/convnet.c, bench/gpt.c
and bench/gemm.c on the CPU, run by them between their own runs (one job
per process, so that OMP_WAIT_POLICY, which OpenMP reads once, can differ
between jobs):

    probe                       bench=torch available=1 torch=... or available=0 reason=...
    train --units U --batch B --threads T [--min-seconds S]
        the TensorFlow guide's MLP (784-U-U-10, ReLU, the softmax inside a
        float32 crossentropy), RMSprop with Keras's defaults (lr 1e-3,
        rho 0.9, eps 1e-7), synthetic data, under float32 and
        torch.autocast("cpu", bfloat16) (mixprec's mixed_bfloat16: the
        weights stay float32). Each step reads the loss back, as mixprec's
        steps do. One line per policy.
    convnet [--model convnet|resnet] --batch B --threads T [--min-seconds S] [--round R]
        Keras's MNIST convnet (bench/convnet.c: Conv2D 32 and 64 3x3 ReLU,
        each with MaxPool 2, Flatten, Dropout 0.5, Linear 10), or the
        small ResNet of examples/resnet_model.h (resnet_model below), on
        random 28x28x1 images, Adam with Keras's defaults (eps 1e-7),
        float32 and bfloat16 autocast as train's. One line per policy,
        tagged with R.
    gpt --batch B --context T --layers L --heads H --channels C --vocab V --threads T [--min-seconds S] [--round R]
        bench/gpt.c's GPT (examples/gpt_model.h: nn.Embedding and a learned
        position table, pre-LayerNorm blocks with epsilon 1e-5, causal
        scaled_dot_product_attention, GELU tanh MLP of 4C, a final
        LayerNorm, Linear logits) on random tokens, AdamW with Keras's
        defaults (lr 1e-3, weight decay 0.004, eps 1e-7), float32 and
        bfloat16 autocast as train's. One line per policy, tagged with R.
    gemm --m M --n N --k K --trans-a A --trans-b B --threads T [--min-seconds S]
        torch.mm on op(A) and op(B) (transposed views where A or B is),
        float32 and bfloat16 in and out. One line per dtype.

The caller sets OMP_WAIT_POLICY in the environment; the lines say which
(omp_wait_policy=default when unset). Without torch: available=0.
"""
import argparse
import os
import sys
import time
import warnings


def timed(fn, min_seconds, warmup=2):
    """Seconds per call: the best of 3 timings of >= min_seconds / 3 each
    after `warmup` calls (2 timings, 1 warm-up, when a call takes > 1 s)."""
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    reps = 2 if once > 1.0 else 3
    for _ in range(warmup - 1 if once <= 1.0 else 0):
        fn()
    best = float("inf")
    for _ in range(reps):
        calls, t0 = 0, time.perf_counter()
        while calls < 2 or time.perf_counter() - t0 < min_seconds / reps:
            fn()
            calls += 1
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def policies_timed(torch, make_model, make_opt, x, y, min_seconds):
    """(policy, seconds a step) for float32 and mixed_bfloat16: a fresh model
    and optimizer each, trained on x and y (the logits' crossentropy in
    float32, the loss read back each step, as mixprec's steps do)."""
    for policy in ("float32", "mixed_bfloat16"):
        torch.manual_seed(0)
        model = make_model()
        opt = make_opt(model.parameters())
        mixed = policy == "mixed_bfloat16"

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
                logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float(), y)  # the float32 softmax
            loss.backward()
            opt.step()
            return loss.item()

        yield policy, timed(step, min_seconds)


def train(torch, args, head):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, 784, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    u, nn = args.units, torch.nn
    make_model = lambda: nn.Sequential(nn.Linear(784, u), nn.ReLU(), nn.Linear(u, u), nn.ReLU(), nn.Linear(u, 10))
    make_opt = lambda params: torch.optim.RMSprop(params, lr=1e-3, alpha=0.9, eps=1e-7)
    for policy, s in policies_timed(torch, make_model, make_opt, x, y, args.min_seconds):
        print(f"bench=train impl=torch model=mlp units={u} batch={args.batch} policy={policy} {head} "
              f"ms_per_step={s * 1e3:.2f} images_per_s={args.batch / s:.0f}", flush=True)


def resnet_model(torch, width):
    """examples/resnet_model.h's network: a conv-BN-ReLU stem, 3 stages of
    2 basic blocks (width, 2 width, 4 width filters; the first block of
    stages 2 and 3 with strides 2 and a 1x1 conv-BN skip), global average
    pooling, Linear 10. Convolutions without bias; BatchNorm2d with Keras's
    epsilon 1e-3 and momentum 0.9 (0.1 in PyTorch's convention)."""
    nn = torch.nn

    def conv_bn(cin, cout, k, stride, relu):
        layers = [nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.1)]
        return nn.Sequential(*layers, nn.ReLU()) if relu else nn.Sequential(*layers)

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(conv_bn(cin, cout, 3, stride, True), conv_bn(cout, cout, 3, 1, False))
            self.skip = conv_bn(cin, cout, 1, stride, False) if stride != 1 else nn.Identity()

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    layers, cin = [conv_bn(1, width, 3, 1, True)], width
    for stage in range(3):
        for block in range(2):
            layers.append(Block(cin, width << stage, 2 if stage > 0 and block == 0 else 1))
            cin = width << stage
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))


def convnet(torch, args, head):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    nn = torch.nn
    if args.model == "resnet":
        make_model = lambda: resnet_model(torch, 16)
    else:
        make_model = lambda: nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                                           nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.5),
                                           nn.Linear(1600, 10))
    make_opt = lambda params: torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-7)
    for policy, s in policies_timed(torch, make_model, make_opt, x, y, args.min_seconds):
        print(f"bench={args.model} impl=torch round={args.round} policy={policy} {head} "
              f"ms_per_step={s * 1e3:.2f} images_per_s={args.batch / s:.0f}", flush=True)


def gpt_model(torch, args):
    nn, F = torch.nn, torch.nn.functional
    c, h = args.channels, args.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(c, eps=1e-5), nn.LayerNorm(c, eps=1e-5)
            self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
            self.fc, self.fc_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(args.vocab, c), nn.Embedding(args.context, c)
            self.blocks = nn.Sequential(*[Block() for _ in range(args.layers)])
            self.ln_f, self.head = nn.LayerNorm(c, eps=1e-5), nn.Linear(c, args.vocab)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1])
            return self.head(self.ln_f(self.blocks(self.wte(idx) + self.wpe(pos))))

    return GPT()


def gpt(torch, args, head):
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, args.vocab, (args.batch, args.context), generator=gen)
    y = torch.randint(0, args.vocab, (args.batch * args.context,), generator=gen)
    make_opt = lambda params: torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-7, weight_decay=0.004)
    make_model = lambda: torch.nn.Sequential(gpt_model(torch, args), torch.nn.Flatten(0, 1))  # (B*T, V) logits
    for policy, s in policies_timed(torch, make_model, make_opt, x, y, args.min_seconds):
        print(f"bench=gpt impl=torch round={args.round} policy={policy} {head} "
              f"ms_per_step={s * 1e3:.2f} tokens_per_s={args.batch * args.context / s:.0f}", flush=True)


def gemm(torch, args, head):
    m, n, k = args.m, args.n, args.k
    gen = torch.Generator().manual_seed(0)
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        a = (torch.rand(k, m, generator=gen) if args.trans_a else torch.rand(m, k, generator=gen)).to(dt)
        b = (torch.rand(n, k, generator=gen) if args.trans_b else torch.rand(k, n, generator=gen)).to(dt)
        opa, opb = (a.t() if args.trans_a else a), (b.t() if args.trans_b else b)
        c = torch.empty(m, n, dtype=dt)
        s = timed(lambda: torch.mm(opa, opb, out=c), args.min_seconds)
        print(f"bench=gemm impl=torch dtype={name} m={m} n={n} k={k} trans_a={args.trans_a} "
              f"trans_b={args.trans_b} {head} gflops={2.0 * m * n * k / s * 1e-9:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("job", choices=("probe", "train", "convnet", "gpt", "gemm"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", choices=("convnet", "resnet"), default="convnet")
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--units", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=128)
    for dim in ("m", "n", "k"):
        ap.add_argument(f"--{dim}", type=int, default=256)
    ap.add_argument("--trans-a", type=int, default=0)
    ap.add_argument("--trans-b", type=int, default=0)
    ap.add_argument("--round", type=int, default=0)
    for name, default in (("context", 128), ("layers", 4), ("heads", 4), ("channels", 128), ("vocab", 256)):
        ap.add_argument(f"--{name}", type=int, default=default)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")  # torch without numpy warns on import
    try:
        import torch
    except Exception as e:  # ImportError, or a wheel whose libraries are missing
        reason = str(e).replace('"', "'").splitlines()[0] if str(e) else type(e).__name__
        print(f'bench=torch available=0 reason="{reason}"', flush=True)
        return
    if args.job == "probe":
        print(f"bench=torch available=1 torch={torch.__version__} threads_default={torch.get_num_threads()} "
              f"cpu_capability={torch.backends.cpu.get_cpu_capability()}", flush=True)
        return
    torch.set_num_threads(args.threads)
    wait = os.environ.get("OMP_WAIT_POLICY", "default").lower()
    head = f"threads={args.threads} omp_wait_policy={wait}"
    {"train": train, "convnet": convnet, "gpt": gpt, "gemm": gemm}[args.job](torch, args, head)


if __name__ == "__main__":
    sys.exit(main())
