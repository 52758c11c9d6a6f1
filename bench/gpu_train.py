#!/usr/bin/env python3
"""bench/gpu_train.py - the PyTorch peer of bench/gpu_train.c: the TensorFlow
guide's MLP (784-U-U-10, ReLU, a float32 softmax inside the crossentropy),
RMSprop with Keras's defaults (lr 1e-3, rho 0.9, eps 1e-7), synthetic data,
on the GPU, under the same four policies as mixprec:

    float32         true float32 (TF32 off for matmuls and cuDNN)
    float32_tf32    float32 with TF32 matmuls
    mixed_float16   torch.autocast(float16) with torch.amp.GradScaler
    mixed_bfloat16  torch.autocast(bfloat16), no scaler

Each step reads the loss back (loss.item()), as mixprec's steps do. data=host
sends the batch from pageable host memory every step, as mixprec does;
data=device keeps it on the GPU. One key=value line per run; without torch
or a GPU: `bench=gpu_train impl=torch available=0 reason=...`.

    python3 bench/gpu_train.py [--batch 8192] [--units 4096] [--min-seconds 2]
"""
import argparse
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--units", type=int, default=4096)
    ap.add_argument("--min-seconds", type=float, default=2.0)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"bench=gpu_train impl=torch available=0 reason=\"{e}\"")
        return
    if not torch.cuda.is_available():
        print("bench=gpu_train impl=torch available=0 reason=\"torch.cuda.is_available() is False\"")
        return
    dev = torch.device("cuda")
    print(f"bench=gpu_train impl=torch available=1 torch={torch.__version__} cuda={torch.version.cuda} "
          f"device=\"{torch.cuda.get_device_name(0)}\"", flush=True)
    gen = torch.Generator().manual_seed(0)
    x_host = torch.rand(args.batch, 784, generator=gen)
    y_host = torch.randint(0, 10, (args.batch,), generator=gen)
    for policy in ("float32", "float32_tf32", "mixed_float16", "mixed_bfloat16"):
        for data in ("host", "device"):
            run(torch, dev, policy, data, x_host, y_host, args)


def run(torch, dev, policy, data, x_host, y_host, args):
    tf32 = policy == "float32_tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    u = args.units
    model = torch.nn.Sequential(torch.nn.Linear(784, u), torch.nn.ReLU(), torch.nn.Linear(u, u), torch.nn.ReLU(),
                                torch.nn.Linear(u, 10)).to(dev)
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, alpha=0.9, eps=1e-7)
    half = {"mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16}.get(policy)
    try:
        scaler = torch.amp.GradScaler("cuda", enabled=policy == "mixed_float16")
    except (AttributeError, TypeError):  # torch before 2.3
        scaler = torch.cuda.amp.GradScaler(enabled=policy == "mixed_float16")
    x_dev, y_dev = x_host.to(dev), y_host.to(dev)

    def step():
        x, y = (x_host.to(dev), y_host.to(dev)) if data == "host" else (x_dev, y_dev)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)  # the float32 softmax
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    steps, t0 = 0, time.perf_counter()
    while steps < 5 or time.perf_counter() - t0 < args.min_seconds:
        step()
        steps += 1
    torch.cuda.synchronize()
    s = (time.perf_counter() - t0) / steps
    print(f"bench=gpu_train impl=torch what=mlp policy={policy} data={data} units={u} batch={args.batch} "
          f"steps={steps} ms_per_step={s * 1e3:.2f} images_per_s={args.batch / s:.0f} "
          f"peak_mib={torch.cuda.max_memory_allocated() / 2**20:.0f}", flush=True)
    torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
