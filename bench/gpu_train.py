#!/usr/bin/env python3
"""bench/gpu_train.py - the PyTorch peer of bench/gpu_train.c, on the GPU,
under the same four policies as mixprec:

    float32         true float32 (TF32 off for matmuls and cuDNN)
    float32_tf32    float32 with TF32 matmuls and convolutions
    mixed_float16   torch.autocast(float16) with torch.amp.GradScaler
    mixed_bfloat16  torch.autocast(bfloat16), no scaler

1. The TensorFlow guide's MLP (784-U-U-10, ReLU, a float32 softmax inside
   the crossentropy), RMSprop with Keras's defaults (lr 1e-3, rho 0.9, eps
   1e-7), synthetic data. Each step reads the loss back (loss.item()), as
   mixprec's steps do. data=host sends the batch from pageable host memory
   every step, as mixprec's custom loop does; data=device keeps it on the GPU.
2. The blog's conv net (Conv2d(3, 128, 2), Conv2d(128, 128, 1) twice,
   Flatten, Linear(., 1), the sigmoid inside a float32 binary crossentropy),
   RMSprop, random images sent from the host each step, with the peak
   memory PyTorch's allocator held (max_memory_allocated). cuDNN as a user
   gets it (torch.backends.cudnn.benchmark left off).
3. With --fashion DIR (the IDX files of Fashion-MNIST): the guide's whole
   fit, as a PyTorch loop: the data sent to the GPU once, the last 20% kept
   to validate (Keras's validation_split), each epoch shuffled on the GPU and
   trained in batches, then validated; the loss summed on the GPU and read
   once an epoch. Timed whole from a new model (the upload, the epochs and
   their validation), then the test accuracy; the median of --fashion-reps.

One key=value line per run; without torch or a GPU:
`bench=gpu_train impl=torch available=0 reason=...`.

    python3 bench/gpu_train.py [--batch 8192] [--units 4096] [--min-seconds 2]
        [--conv-size 256] [--conv-batch 50] [--fashion DIR] [--fashion-epochs 5]
        [--fashion-reps 3] [--fashion-limit N] [--device cpu]

--device cpu runs the same code on the CPU, small, to check the script on a
machine without a GPU (its figures mean nothing).
"""
import argparse
import math
import time

POLICIES = ("float32", "float32_tf32", "mixed_float16", "mixed_bfloat16")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--units", type=int, default=4096)
    ap.add_argument("--min-seconds", type=float, default=2.0)
    ap.add_argument("--conv-size", type=int, default=256)
    ap.add_argument("--conv-batch", type=int, default=50)
    ap.add_argument("--fashion", default=None)
    ap.add_argument("--fashion-epochs", type=int, default=5)
    ap.add_argument("--fashion-reps", type=int, default=3)
    ap.add_argument("--fashion-limit", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"bench=gpu_train impl=torch available=0 reason=\"{e}\"")
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench=gpu_train impl=torch available=0 reason=\"torch.cuda.is_available() is False\"")
        return
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    print(f"bench=gpu_train impl=torch available=1 torch={torch.__version__} cuda={torch.version.cuda} "
          f"device=\"{name}\"", flush=True)
    gen = torch.Generator().manual_seed(0)
    x_host = torch.rand(args.batch, 784, generator=gen)
    y_host = torch.randint(0, 10, (args.batch,), generator=gen)
    for policy in POLICIES:
        for data in ("host", "device"):
            run_mlp(torch, dev, policy, data, x_host, y_host, args)
    for policy in POLICIES:
        run_conv(torch, dev, policy, args)
    if args.fashion:
        train, test = load_fashion(torch, args.fashion, args.fashion_limit)
        for policy in POLICIES:
            run_fashion(torch, dev, policy, train, test, args)


# ---- what the runs share --------------------------------------------------
def set_policy(torch, policy):
    """TF32 on or off; returns the autocast dtype (None: float32)."""
    tf32 = policy == "float32_tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return {"mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16}.get(policy)


def make_scaler(torch, dev, policy):
    try:
        return torch.amp.GradScaler(dev.type, enabled=policy == "mixed_float16")
    except (AttributeError, TypeError):  # torch before 2.3
        return torch.cuda.amp.GradScaler(enabled=policy == "mixed_float16")


def autocast(torch, dev, half):
    """The policy's autocast context (half None: float32, autocast off)."""
    return torch.autocast(dev.type, dtype=half or torch.float32, enabled=half is not None)


def rmsprop(torch, model):
    return torch.optim.RMSprop(model.parameters(), lr=1e-3, alpha=0.9, eps=1e-7)


def guide_mlp(torch, units):
    nn = torch.nn
    return nn.Sequential(nn.Linear(784, units), nn.ReLU(), nn.Linear(units, units), nn.ReLU(), nn.Linear(units, 10))


def train_step(torch, dev, model, opt, scaler, half, loss_fn, x, y):
    """One step: the forward under autocast, the loss in float32 from the
    float32 logits, the scaled backward and the optimizer; the loss stays on
    the device."""
    opt.zero_grad(set_to_none=True)
    with autocast(torch, dev, half):
        logits = model(x)
    loss = loss_fn(logits.float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return loss


def sync(torch, dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def reset_peak(torch, dev):
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_mib(torch, dev):
    return torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else 0


def time_steps(torch, dev, step, min_seconds, warmups=2, min_steps=5):
    """Seconds per step of step(): warmups first, then at least min_steps and
    min_seconds."""
    for _ in range(warmups):
        step()
    sync(torch, dev)
    steps, t0 = 0, time.perf_counter()
    while steps < min_steps or time.perf_counter() - t0 < min_seconds:
        step()
        steps += 1
    sync(torch, dev)
    return (time.perf_counter() - t0) / steps, steps


# ---- 1. the guide's MLP -----------------------------------------------------
def run_mlp(torch, dev, policy, data, x_host, y_host, args):
    half = set_policy(torch, policy)
    torch.manual_seed(0)
    reset_peak(torch, dev)
    model = guide_mlp(torch, args.units).to(dev)
    opt, scaler = rmsprop(torch, model), make_scaler(torch, dev, policy)
    x_dev, y_dev = x_host.to(dev), y_host.to(dev)
    ce = torch.nn.functional.cross_entropy

    def step():
        x, y = (x_host.to(dev), y_host.to(dev)) if data == "host" else (x_dev, y_dev)
        return train_step(torch, dev, model, opt, scaler, half, ce, x, y).item()

    s, steps = time_steps(torch, dev, step, args.min_seconds)
    print(f"bench=gpu_train impl=torch what=mlp policy={policy} data={data} units={args.units} batch={args.batch} "
          f"steps={steps} ms_per_step={s * 1e3:.2f} images_per_s={args.batch / s:.0f} "
          f"peak_mib={peak_mib(torch, dev):.0f}", flush=True)


# ---- 2. the blog's conv net -------------------------------------------------
def run_conv(torch, dev, policy, args):
    nn, size, batch = torch.nn, args.conv_size, args.conv_batch
    half = set_policy(torch, policy)
    torch.manual_seed(0)
    reset_peak(torch, dev)
    model = nn.Sequential(nn.Conv2d(3, 128, 2), nn.Conv2d(128, 128, 1), nn.Conv2d(128, 128, 1), nn.Flatten(),
                          nn.Linear(128 * (size - 1) * (size - 1), 1)).to(dev)
    opt, scaler = rmsprop(torch, model), make_scaler(torch, dev, policy)
    gen = torch.Generator().manual_seed(3)
    x_host = torch.rand(batch, 3, size, size, generator=gen)
    y_host = (torch.arange(batch) % 2).float()
    bce = torch.nn.functional.binary_cross_entropy_with_logits

    def loss_fn(logits, y):
        return bce(logits.squeeze(1), y)

    def step():
        return train_step(torch, dev, model, opt, scaler, half, loss_fn, x_host.to(dev), y_host.to(dev)).item()

    s, steps = time_steps(torch, dev, step, args.min_seconds / 2, warmups=1)
    print(f"bench=gpu_train impl=torch what=conv policy={policy} image={size}x{size}x3 batch={batch} steps={steps} "
          f"ms_per_step={s * 1e3:.1f} peak_mib={peak_mib(torch, dev):.0f}", flush=True)


# ---- 3. the guide's fit over Fashion-MNIST -----------------------------------
def load_fashion(torch, folder, limit):
    """(x, labels) of the train and test splits: [n, 784] float32 pixels in
    [0, 1] (as mp_load_idx gives them) and int64 labels."""
    def split(prefix, n_max):
        with open(f"{folder}/{prefix}-images-idx3-ubyte", "rb") as f:
            images = f.read()
        with open(f"{folder}/{prefix}-labels-idx1-ubyte", "rb") as f:
            labels = f.read()
        n = int.from_bytes(labels[4:8], "big")
        if n_max:
            n = min(n, n_max)
        x = torch.frombuffer(bytearray(images[16:16 + n * 784]), dtype=torch.uint8).reshape(n, 784)
        return x.float() / 255, torch.frombuffer(bytearray(labels[8:8 + n]), dtype=torch.uint8).long()
    return split("train", limit), split("t10k", 0)


def run_fashion(torch, dev, policy, train, test, args):
    half = set_policy(torch, policy)
    ce = torch.nn.functional.cross_entropy
    times, setup, first, later = [], [], [], []
    for rep in range(args.fashion_reps):
        torch.manual_seed(rep)
        model = guide_mlp(torch, args.units).to(dev)
        opt, scaler = rmsprop(torch, model), make_scaler(torch, dev, policy)
        sync(torch, dev)
        t0 = time.perf_counter()
        x, y = train[0].to(dev), train[1].to(dev)
        n_train = len(y) - math.ceil(len(y) * 0.2)  # Keras: the last part validates
        batches = math.ceil(n_train / args.batch)
        sync(torch, dev)
        epoch_ends = [time.perf_counter()]
        for _ in range(args.fashion_epochs):
            model.train()
            total = torch.zeros((), device=dev)
            for idx in torch.randperm(n_train, device=dev).split(args.batch):
                total += train_step(torch, dev, model, opt, scaler, half, ce, x[idx], y[idx]).detach()
            loss = total.item() / batches  # read once an epoch, for the epoch's line
            val_loss, val_accuracy = evaluate(torch, dev, model, half, x[n_train:], y[n_train:], args.batch)
            epoch_ends.append(time.perf_counter())
        sync(torch, dev)
        times.append(time.perf_counter() - t0)
        setup.append(epoch_ends[0] - t0)
        first.append(epoch_ends[1] - epoch_ends[0])
        later.append((epoch_ends[-1] - epoch_ends[1]) / max(1, args.fashion_epochs - 1))
        accuracy = evaluate(torch, dev, model, half, test[0].to(dev), test[1].to(dev), args.batch)[1]
    fit_s, setup_s, first_s, later_s = (sorted(v)[len(v) // 2] for v in (times, setup, first, later))
    steps = args.fashion_epochs * batches
    print(f"bench=gpu_train impl=torch what=fashion_fit policy={policy} units={args.units} batch={args.batch} "
          f"epochs={args.fashion_epochs} steps={steps} reps={args.fashion_reps} fit_s={fit_s:.3f} "
          f"before_epochs_s={setup_s:.4f} first_epoch_s={first_s:.4f} later_epoch_s={later_s:.4f} "
          f"loss={loss:.4f} val_loss={val_loss:.4f} val_accuracy={val_accuracy:.4f} test_accuracy={accuracy:.4f}",
          flush=True)


def evaluate(torch, dev, model, half, x, y, batch):
    """(loss, accuracy) over x in batches, read back once."""
    model.eval()
    loss, correct = torch.zeros((), device=dev), torch.zeros((), device=dev, dtype=torch.long)
    with torch.no_grad(), autocast(torch, dev, half):
        for xb, yb in zip(x.split(batch), y.split(batch)):
            logits = model(xb).float()
            loss += torch.nn.functional.cross_entropy(logits, yb, reduction="sum")
            correct += (logits.argmax(1) == yb).sum()
    return loss.item() / len(y), correct.item() / len(y)


if __name__ == "__main__":
    main()
