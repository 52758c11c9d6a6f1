"""gpt.py - the GPT of examples/gpt_model.h in mixprec and in PyTorch, from
the same weights on the same tokens (tests/torch_peer/peer.c's `gpt`
mode writes them, float32):

  (a) mixprec's initial weights, exported as safetensors in the PyTorch
      layout, load into the GPT rebuilt below by name
      (load_state_dict(strict=True));
  (b) one forward and backward: the logits, the loss (the mean sparse
      categorical crossentropy, F.cross_entropy) and every weight's gradient
      agree with mixprec's (its gradients saved as the weights of a GPT, so
      in the PyTorch layout under the same names). The bounds, TOL_LOGITS
      and TOL_GRAD (absolute), are 100 times tighter than llm.c's
      test_gpt2.c (1e-2 on the logits, 2e-2 on the gradients);
  (c) ten AdamW steps on that batch as mixprec's compile gives them (lr
      1e-3, betas 0.9 and 0.999, epsilon 1e-7, weight_decay 0.1 except on
      the biases, LayerNorm's weights and the embeddings, global_clipnorm
      1): each step's loss within TOL_STEP relative of mixprec's, and the
      weights after the last step (but the key biases, see there) within
      TOL_TRAINED absolute.

    python gpt.py BUILD/torch_peer WORKDIR

tests/matrix.sh runs it after interop.py where MIXPREC_TORCH_PYTHON names a
python with torch and safetensors."""
import math
import subprocess

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from peer_files import check, done, path, peer, values, work

VOCAB, CONTEXT, LAYERS, HEADS, CHANNELS, BATCH, STEPS = 64, 16, 2, 2, 32, 4, 10  # as peer.c
LR, BETAS, EPS, DECAY, CLIPNORM = 1e-3, (0.9, 0.999), 1e-7, 0.1, 1.0
TOL_LOGITS, TOL_GRAD, TOL_STEP, TOL_TRAINED = 1e-4, 2e-4, 1e-5, 1e-5


class Heads(nn.Module):
    """MultiHeadAttention's query, key or value projection in the PyTorch
    layout of docs/safetensors.md: weight (heads, key_dim, in), bias
    (heads, key_dim); x (B, T, in) -> (B, heads, T, key_dim)."""

    def __init__(self, heads, key_dim, cin):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(heads, key_dim, cin))
        self.bias = nn.Parameter(torch.empty(heads, key_dim))

    def forward(self, x):
        return torch.einsum("btc,hkc->bhtk", x, self.weight) + self.bias[None, :, None, :]


class Attention(nn.Module):
    """Keras's causal MultiHeadAttention (query = key = value = x; scores
    scaled by 1 / sqrt(key_dim)); attention_output's weight is (out, heads,
    key_dim)."""

    def __init__(self, heads, channels):
        super().__init__()
        k = channels // heads
        self.query, self.key, self.value = Heads(heads, k, channels), Heads(heads, k, channels), Heads(heads, k, channels)
        self.attention_output = nn.Module()
        self.attention_output.weight = nn.Parameter(torch.empty(channels, heads, k))
        self.attention_output.bias = nn.Parameter(torch.empty(channels))

    def forward(self, x):
        a = F.scaled_dot_product_attention(self.query(x), self.key(x), self.value(x), is_causal=True)
        return torch.einsum("bhtk,chk->btc", a, self.attention_output.weight) + self.attention_output.bias


class GPT(nn.Module):
    """gpt_model.h's layers, made in its order under Keras's automatic
    names (dense, dense_1, ...; layer_normalization, ...), so that
    mixprec's file loads by name."""

    def __init__(self):
        super().__init__()
        self.count = {}
        tok = self.named("embedding", nn.Embedding(VOCAB, CHANNELS))
        pos = self.named("position_embedding", nn.Embedding(CONTEXT, CHANNELS))
        self.blocks = []  # plain lists and tuples: the layers are registered once, under their names
        for _ in range(LAYERS):
            ln1, att = self.layer_norm(), self.named("multi_head_attention", Attention(HEADS, CHANNELS))
            ln2 = self.layer_norm()
            fc, proj = self.named("dense", nn.Linear(CHANNELS, 4 * CHANNELS)), self.named("dense", nn.Linear(4 * CHANNELS, CHANNELS))
            self.blocks.append((ln1, att, ln2, fc, proj))
        self.ends = (tok, pos, self.layer_norm(), self.named("dense", nn.Linear(CHANNELS, VOCAB)))

    def named(self, kind, layer):
        n = self.count.get(kind, 0)
        self.count[kind] = n + 1
        setattr(self, kind if n == 0 else "%s_%d" % (kind, n), layer)
        return layer

    def layer_norm(self):
        return self.named("layer_normalization", nn.LayerNorm(CHANNELS, eps=1e-5))

    def forward(self, idx):
        tok, pos, ln_f, logits = self.ends
        x = tok(idx) + pos.weight[: idx.shape[1]]
        for ln1, att, ln2, fc, proj in self.blocks:
            r = x + att(ln1(x))
            x = r + proj(F.gelu(fc(ln2(r)), approximate="tanh"))
        return logits(ln_f(x))


def max_abs(a, b):
    return (a.double() - b.double()).abs().max().item()


subprocess.run([peer, "gpt", work + "/"], check=True)
tokens = values("gpt_tokens.i32", torch.int32).long().reshape(BATCH, CONTEXT)
targets = values("gpt_targets.i32", torch.int32).long().reshape(-1)

# (a)
model = GPT()
initial = load_file(path("gpt_f32.safetensors"))
model.load_state_dict(initial, strict=True)
check(set(initial) == set(model.state_dict()),
      "the GPT's %d tensors of mixprec's file are the torch.nn GPT's parameters, by name" % len(initial))

# (b)
logits = model(tokens)
loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets)
loss.backward()
err = max_abs(logits.detach(), values("gpt_logits.f32", torch.float32).reshape(BATCH, CONTEXT, VOCAB))
check(err <= TOL_LOGITS, "logits (%d x %d x %d): max abs difference %.2e" % (BATCH, CONTEXT, VOCAB, err))
losses = values("gpt_losses.f32", torch.float32)
err = abs(loss.item() - losses[0].item())
check(err <= TOL_LOGITS, "loss %.6f against mixprec's %.6f: difference %.2e" % (loss.item(), losses[0].item(), err))
grads = load_file(path("gpt_grads.safetensors"))
worst, worst_name = 0.0, ""
for name, p in model.named_parameters():
    err = max_abs(p.grad, grads[name])
    worst, worst_name = max((worst, worst_name), (err, name))
    check(err <= TOL_GRAD, "gradient of %s %s: max abs difference %.2e (largest |gradient| %.2e)"
          % (name, tuple(p.shape), err, p.grad.abs().max().item()))
print("       worst gradient difference %.2e (%s)" % (worst, worst_name))

# (c) PyTorch's AdamW puts epsilon after the bias correction,
# m_hat / (sqrt(v_hat) + eps); Keras (and mixprec) fold the corrections into
# the step, lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
# (docs/training.md). The two are the same update when torch's epsilon at
# step t is eps / sqrt(1 - b2^t), set before each step. The global norm
# clip is Keras's clip_by_global_norm: g * clip / max(norm, clip).
no_decay = lambda name: name.endswith(".bias") or "layer_normalization" in name or "embedding" in name
params = list(model.named_parameters())
opt = torch.optim.AdamW([{"params": [p for n, p in params if not no_decay(n)], "weight_decay": DECAY},
                         {"params": [p for n, p in params if no_decay(n)], "weight_decay": 0.0}],
                        lr=LR, betas=BETAS, eps=EPS)
norms, worst_step = [], 0.0
for t in range(1, STEPS + 1):
    if t > 1:
        opt.zero_grad()
        loss = F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets)
        loss.backward()
    rel = abs(loss.item() - losses[t - 1].item()) / abs(losses[t - 1].item())
    worst_step = max(worst_step, rel)
    check(rel <= TOL_STEP, "step %2d: loss %.6f, mixprec's %.6f, relative difference %.2e"
          % (t, loss.item(), losses[t - 1].item(), rel))
    with torch.no_grad():
        norm = math.sqrt(sum(p.grad.double().pow(2).sum().item() for _, p in params))
        norms.append(norm)
        for _, p in params:
            p.grad.mul_(CLIPNORM / max(norm, CLIPNORM))
    for group in opt.param_groups:
        group["eps"] = EPS / math.sqrt(1.0 - BETAS[1] ** t)
    opt.step()
print("       worst relative loss difference over the %d steps %.2e; the gradients' global norms %.3f .. %.3f "
      "(clipped above %g)" % (STEPS, worst_step, min(norms), max(norms), CLIPNORM))
# The key projections' biases are left out: their gradient is zero in exact
# arithmetic (q . b_key is the same for every key, which the softmax
# cancels), so both sides hold rounding noise (about 1e-8 above), which
# Adam's m / (sqrt(v) + eps) turns into steps of any sign.
trained = load_file(path("gpt_trained.safetensors"))
err, name = max((max_abs(p.detach(), trained[n]), n) for n, p in params if not n.endswith("key.bias"))
check(err <= TOL_TRAINED, "weights after %d steps but the key biases: max abs difference %.2e (%s)"
      % (STEPS, err, name))

done("torch_gpt")
