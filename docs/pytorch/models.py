"""The PyTorch twins of ch_nn_preset's models: the same layers in the same
order, so that their state_dict names are the names Chorus saves.

resnet and gpt follow torchvision's ResNet (CIFAR variant of He et al. 2016)
and nanoGPT's model.py; state_tensors and load_state save and load them by
name with safetensors' rules for tied weights (the GPT's lm_head.weight is
transformer.wte.weight, stored once under that name)."""
import math
import os
import tempfile

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    def __init__(self, depth, width=16, in_channels=1, classes=10):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"resnet depth must be 6n+2 with n >= 1 (8, 14, 20, ...), "
                             f"got {depth}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.layer1 = self._stage(width, width, n, 1)
        self.layer2 = self._stage(width, 2 * width, n, 2)
        self.layer3 = self._stage(2 * width, 4 * width, n, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, classes)
        # torchvision's initialisation; the Linear keeps PyTorch's default.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    @staticmethod
    def _stage(inplanes, planes, blocks, stride):
        return nn.Sequential(*[BasicBlock(inplanes if i == 0 else planes, planes,
                                          stride if i == 0 else 1) for i in range(blocks)])

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout, sdpa=False):
        super().__init__()
        # sdpa: PyTorch's fused scaled_dot_product_attention (what nanoGPT
        # uses where it exists) instead of the ops written out below; the
        # benchmark's rival, never the fixtures'.
        self.sdpa = sdpa
        self.dropout = dropout
        if dim % heads:
            raise ValueError(f"gpt dim {dim} is not a multiple of heads {heads}")
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        # Written out op by op (no scaled_dot_product_attention) so that the
        # order of operations is the one Chorus reproduces.
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.heads, hd).transpose(1, 2)
        k = k.view(B, T, self.heads, hd).transpose(1, 2)
        v = v.view(B, T, self.heads, hd).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
            return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        # The mask is made here rather than kept as a buffer, so that the
        # state_dict holds parameters only, as Chorus saves it.
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, dim, dropout):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, dim, heads, dropout, sdpa=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = CausalSelfAttention(dim, heads, dropout, sdpa)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = MLP(dim, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers, heads, dim, context, vocab, dropout=0.0, sdpa=False):
        super().__init__()
        self.context = context
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, dim),
            wpe=nn.Embedding(context, dim),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(dim, heads, dropout, sdpa) for _ in range(layers)]),
            ln_f=nn.LayerNorm(dim, eps=1e-5)))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        # nanoGPT's initialisation, in its order (the tied weight is drawn
        # twice, as there; the second draw stays).
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        T = idx.shape[1]
        if T > self.context:
            raise ValueError(f"sequence of {T} tokens is longer than the context {self.context}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def resnet(depth, width=16, in_channels=1, classes=10):
    return ResNet(depth, width, in_channels, classes)


def gpt(layers, heads, dim, context, vocab, dropout=0.0, sdpa=False):
    return GPT(layers, heads, dim, context, vocab, dropout, sdpa)


def preset(kind, **config):
    """The model ch_nn_preset(kind) builds; resnet and gpt take their
    configuration as keywords (resnet: depth, width, in_channels, classes;
    gpt: layers, heads, dim, context, vocab, dropout, sdpa)."""
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(),
                             nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    if kind == "resnet":
        return resnet(**config)
    if kind == "gpt":
        return gpt(**config)
    raise ValueError(f"no preset named {kind!r} (mlp, cnn, resnet or gpt)")


def state_tensors(model):
    """The state_dict with every tied tensor once, under its first name in
    the model's order (transformer.wte.weight, not lm_head.weight): the
    tensors Chorus saves."""
    seen, out = set(), {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            out[name] = t
    return out


def load_state(model, tensors):
    """Load `tensors` (name -> tensor) into `model` by name, with
    safetensors.torch.load_model(strict=True)'s rules: no missing and no
    unexpected name, a tied weight given once under either of its names."""
    # Imported here, not at the top: the models alone (the benchmarks, the
    # GPU check's PyTorch runs) need no safetensors, which a machine with
    # PyTorch may lack.
    from safetensors.torch import load_model, save_file
    fd, path = tempfile.mkstemp(suffix=".safetensors")
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)
        load_model(model, path, strict=True)
    finally:
        os.unlink(path)
