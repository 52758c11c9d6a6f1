"""interop.py - safetensors between mixprec and PyTorch, shown with the
Python `safetensors` package (the reference implementation) and torch:

  (a) mixprec's exports of the TensorFlow mixed precision guide's MLP and of
      the ResNet of examples/resnet_model.h load into the same networks
      rebuilt in torch.nn (by name: load_state_dict(strict=True)) and give
      mixprec's predictions on the same inputs, to 1e-5 relative; the Keras
      layout's file is the PyTorch layout's, transposed; the BF16 export
      holds exactly torch's own round-to-nearest-even of the F32 one, and
      gives the predictions mixprec computes from it, to 1e-5 too;
  (b) the same networks trained a few steps in PyTorch (the ResNet's
      BatchNorm2d running statistics and num_batches_tracked with them),
      their state dicts written by the Python package, load into mixprec
      and give PyTorch's predictions, to 1e-5 relative;
  (c) bytes: each mixprec file, read and written again by the Python
      package, is byte-identical; PyTorch's MLP file, loaded and saved again
      by mixprec, is byte-identical.

    python interop.py BUILD/torch_peer WORKDIR

tests/matrix.sh runs it, and then gpt.py (the GPT's logits, gradients and
AdamW steps against PyTorch's), where MIXPREC_TORCH_PYTHON names a python
with torch and safetensors. The relative error of a prediction is
max |mixprec - torch| / max |torch| over its classes, the largest over the
inputs. It needs no numpy: tensors go to the package through TensorSpec."""
import subprocess

import torch
import torch.nn as nn
import torch.nn.functional as F
import safetensors
from safetensors import TensorSpec, safe_open
from safetensors.torch import load_file

from peer_files import check, done, path, peer, values, work

N, UNITS, WIDTH, CLASSES = 16, 256, 8, 10  # as tests/torch_peer/peer.c
TOL = 1e-5
torch.manual_seed(0)


def rel_err(a, b):
    a, b = a.reshape(N, -1).double(), b.reshape(N, -1).double()
    return ((a - b).abs().amax(1) / b.abs().amax(1)).max().item()


class MLP(nn.Module):
    """784 -> 256 relu -> 256 relu -> 10 softmax, Keras's layer names."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(28 * 28, UNITS)
        self.dense_1 = nn.Linear(UNITS, UNITS)
        self.dense_2 = nn.Linear(UNITS, CLASSES)

    def forward(self, x):
        return torch.softmax(self.dense_2(F.relu(self.dense_1(F.relu(self.dense(x))))), -1)


def same_pad(x, k, s):
    """Keras's padding="same": the odd pixel after, as TensorFlow pads."""
    h = x.shape[-1]
    total = max((h + s - 1) // s * s - s + k - h, 0)
    return F.pad(x, (total // 2, total - total // 2, total // 2, total - total // 2))


class ResNet(nn.Module):
    """resnet_model.h's network, its layers made and named in its order
    (conv2d, conv2d_1, ...; batch_normalization, ...), NCHW."""

    def __init__(self, width):
        super().__init__()
        self.count = {}
        self.stem = self.conv_bn(1, width, 3, 1)
        self.blocks = []
        cin = width
        for stage in range(3):
            for block in range(2):
                f, s = width << stage, 2 if stage > 0 and block == 0 else 1
                a, b = self.conv_bn(cin, f, 3, s), self.conv_bn(f, f, 3, 1)
                skip = self.conv_bn(cin, f, 1, s) if s != 1 else None
                self.blocks.append((a, b, skip))
                cin = f
        self.dense = nn.Linear(cin, CLASSES)

    def named(self, kind, layer):
        n = self.count.get(kind, 0)
        self.count[kind] = n + 1
        name = kind if n == 0 else "%s_%d" % (kind, n)
        setattr(self, name, layer)
        return layer

    def conv_bn(self, cin, cout, k, s):
        conv = self.named("conv2d", nn.Conv2d(cin, cout, k, s, bias=False))
        # Keras's epsilon 1e-3; mixprec's momentum 0.9 is torch's 0.1
        return conv, self.named("batch_normalization", nn.BatchNorm2d(cout, eps=1e-3, momentum=0.1)), k, s

    @staticmethod
    def apply(cb, x):
        conv, bn, k, s = cb
        return bn(conv(same_pad(x, k, s)))

    def forward(self, x):
        x = F.relu(self.apply(self.stem, x))
        for a, b, skip in self.blocks:
            y = self.apply(b, F.relu(self.apply(a, x)))
            x = F.relu(y + (self.apply(skip, x) if skip else x))
        return torch.softmax(self.dense(x.mean((2, 3))), -1)


def inputs(name):
    x = values("x.f32").reshape(N, 28 * 28)
    return x if name == "mlp" else x.reshape(N, 28, 28, 1).permute(0, 3, 1, 2).contiguous()


def network(name):
    return (MLP() if name == "mlp" else ResNet(WIDTH)).eval()


def predict(model, name):
    with torch.no_grad():
        return model(inputs(name))


def as_float32(state):
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def save(tensors, name, metadata):
    """The package's writer, given the tensors' bytes (torch.save_file
    wants numpy)."""
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int64: "int64"}
    keep = {k: v.detach().contiguous() for k, v in tensors.items()}
    specs = {k: TensorSpec(dtype=names[v.dtype], shape=list(v.shape), data_ptr=v.data_ptr(),
                           data_len=v.numel() * v.element_size()) for k, v in keep.items()}
    safetensors.serialize_file(specs, path(name), metadata=metadata)


def metadata(name):
    with safe_open(path(name), framework="pt") as f:
        return f.metadata()


def rewrite_identical(name):
    """The file read by the package and written again: the same bytes."""
    with open(path(name), "rb") as f:
        before = f.read()
    save(load_file(path(name)), "again_" + name, metadata(name))
    with open(path("again_" + name), "rb") as f:
        return f.read() == before


subprocess.run([peer, "export", work + "/"], check=True)

# (a) mixprec -> PyTorch
for name in ("mlp", "resnet"):
    f32 = load_file(path(name + "_f32.safetensors"))
    model = network(name)
    model.load_state_dict(f32, strict=False if name == "resnet" else True)  # no num_batches_tracked from mixprec
    missing = set(model.state_dict()) - set(f32)
    check(all(k.endswith("num_batches_tracked") for k in missing) and set(f32) <= set(model.state_dict()),
          "%s: every tensor of mixprec's file is a weight of the torch.nn network, each weight in it" % name)
    err = rel_err(predict(model, name), values(name + "_pred.f32"))
    check(err <= TOL, "%s: float32 export, PyTorch's predictions against mixprec's: relative error %.2e" % (name, err))

    bf16 = load_file(path(name + "_bf16.safetensors"))
    same = all(torch.equal(bf16[k].view(torch.int16), f32[k].to(bf16[k].dtype).view(torch.int16))
               if bf16[k].dtype == torch.bfloat16 else torch.equal(bf16[k], f32[k]) for k in f32)
    check(same and set(bf16) == set(f32) and any(v.dtype == torch.bfloat16 for v in bf16.values()),
          "%s: bfloat16 export = torch's round-to-nearest-even of the float32 one, bit for bit "
          "(moving statistics F32)" % name)
    model.load_state_dict(as_float32(bf16), strict=name == "mlp")
    got = predict(model, name)
    err = rel_err(got, values(name + "_bf16_pred.f32"))
    check(err <= TOL, "%s: bfloat16 export, PyTorch's predictions against mixprec's from the same file: relative "
          "error %.2e (bfloat16's rounding moved them by %.2e)" % (name, err, rel_err(got, values(name + "_pred.f32"))))

keras = load_file(path("mlp_keras.safetensors"))
f32 = load_file(path("mlp_f32.safetensors"))
check(all(torch.equal(keras[k.replace(".weight", "/kernel").replace(".bias", "/bias")].t()
                      if k.endswith(".weight") else keras[k.replace(".", "/")], v) for k, v in f32.items())
      and len(keras) == len(f32), "mlp: the Keras layout's file is the PyTorch layout's, kernels (in, units) transposed")
check(metadata("mlp_keras.safetensors")["mixprec"].startswith("layout=keras dtype=float32 policy=float32 layers=dense:Dense"),
      "mlp: metadata %r" % metadata("mlp_keras.safetensors")["mixprec"][:60])

# (b) PyTorch -> mixprec: a few SGD steps, then the state dicts
want = {}
for name in ("mlp", "resnet"):
    model = network(name).train()
    if name == "resnet":  # BatchNorm2d's weight and bias off 1 and 0 too
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.5, 0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x, y = torch.rand_like(inputs(name)), torch.randint(0, CLASSES, (N,))
        loss = F.nll_loss(torch.log(model(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    want[name] = predict(model, name)
    meta = metadata("mlp_f32.safetensors") if name == "mlp" else {"format": "pt"}
    save(model.state_dict(), "torch_%s.safetensors" % name, meta)
subprocess.run([peer, "import", work + "/"], check=True)
for name in ("mlp", "resnet"):
    err = rel_err(values("mixprec_%s_pred.f32" % name), want[name])
    check(err <= TOL, "%s: PyTorch-trained state dict, mixprec's predictions against PyTorch's: relative error %.2e"
          % (name, err))

# (c) bytes
for name in ("mlp_f32", "mlp_bf16", "mlp_keras", "resnet_f32", "resnet_bf16"):
    check(rewrite_identical(name + ".safetensors"),
          "%s.safetensors: read and written again by the Python package, byte-identical" % name)
with open(path("torch_mlp.safetensors"), "rb") as a, open(path("mlp_again.safetensors"), "rb") as b:
    check(a.read() == b.read(), "torch_mlp.safetensors (PyTorch's, written by the Python package): loaded and saved "
          "again by mixprec, byte-identical")

done("torch_interop")
