#!/usr/bin/env python3
"""Checks of load_checkpoint.py on checkpoints laid out as ch_checkpoint_save
writes them: the state_dict (the tied weight once, every tensor F32 as
Chorus stores it), the optimizer's state under "optimizer.<name>.<state>",
and the training state and configuration as string metadata.

    python3 test_load_checkpoint.py [-v]

Needs PyTorch; reads /usr/share/datasets/fashion-mnist when it is there
(that check is skipped otherwise). Run by hand, not in CI.
"""
import os
import tempfile
import unittest

import torch
from safetensors.torch import save_file
from torch.nn import functional as F

import load_checkpoint
from models import gpt, resnet, state_tensors

FASHION = "/usr/share/datasets/fashion-mnist"
RESNET = {"depth": 8, "width": 4, "in_channels": 1, "classes": 10}
GPT = {"layers": 2, "heads": 2, "dim": 32, "context": 16, "vocab": 256}
WRONG = {"depth": 14, "width": 8, "in_channels": 3, "classes": 7, "layers": 1, "heads": 4,
         "dim": 64, "context": 8, "vocab": 64}


def trained(model, batches):
    """A model after a few AdamW steps (running statistics moved, optimizer
    state present), and that optimizer."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    model.train()
    for x, y in batches:
        opt.zero_grad()
        logits = model(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        opt.step()
    model.eval()
    return opt


def chorus_layout(model, opt, meta):
    """The tensors and metadata of ch_checkpoint_save: every tensor F32."""
    tensors = {k: v.float().contiguous() for k, v in state_tensors(model).items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            for key in ("exp_avg", "exp_avg_sq"):
                tensors[f"optimizer.{names[id(p)]}.{key}"] = opt.state[p][key].contiguous()
    meta = {"format": "chorus-checkpoint-1", "epoch": "1", "batch": "0", "step": "3",
            "seed": "1", "optimizer": "adamw", "optimizer_steps": "3", **meta}
    return tensors, {k: str(v) for k, v in meta.items()}


class LoadCheckpoint(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(7)
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "model.safetensors")

    def tearDown(self):
        self.dir.cleanup()

    def resnet_checkpoint(self, with_config=True, counter_shape=()):
        model = resnet(**RESNET)
        opt = trained(model, [(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,)))
                              for _ in range(3)])
        meta = {"input_mean": 0.2860, "input_std": 0.3530}
        tensors, meta = chorus_layout(model, opt, {**meta, **(RESNET if with_config else {})})
        for k in tensors:
            if k.endswith("num_batches_tracked"):
                tensors[k] = tensors[k].reshape(counter_shape)
        save_file(tensors, self.path, metadata=meta)
        return model, tensors

    def gpt_checkpoint(self):
        model = gpt(**GPT)
        opt = trained(model, [(torch.randint(0, 256, (4, 16)), torch.randint(0, 256, (4, 16)))
                              for _ in range(3)])
        tensors, meta = chorus_layout(model, opt, GPT)
        save_file(tensors, self.path, metadata=meta)
        return model, tensors

    def assert_same_state(self, loaded, original):
        want, got = original.state_dict(), loaded.state_dict()
        self.assertEqual(sorted(want), sorted(got))
        for k in want:
            self.assertTrue(torch.equal(want[k], got[k]), f"{k} differs after loading")

    def test_resnet_config_from_metadata(self):
        model, tensors = self.resnet_checkpoint()
        self.assertIn("optimizer.conv1.weight.exp_avg", tensors)
        loaded, _, count = load_checkpoint.load(self.path, "resnet", WRONG)
        self.assertEqual(count, len(model.state_dict()))
        self.assert_same_state(loaded, model)
        self.assertFalse(loaded.training)
        self.assertEqual(loaded.bn1.num_batches_tracked.item(), 3)

    def test_resnet_counter_of_shape_1(self):
        model, _ = self.resnet_checkpoint(counter_shape=(1,))
        loaded, _, _ = load_checkpoint.load(self.path, "resnet", {})
        self.assert_same_state(loaded, model)

    def test_resnet_config_from_options(self):
        model, _ = self.resnet_checkpoint(with_config=False)
        loaded, _, _ = load_checkpoint.load(self.path, "resnet", RESNET)
        self.assert_same_state(loaded, model)
        with self.assertRaises(RuntimeError):
            load_checkpoint.load(self.path, "resnet", WRONG)

    @unittest.skipUnless(os.path.isdir(FASHION), f"no Fashion-MNIST at {FASHION}")
    def test_resnet_accuracy_uses_running_statistics(self):
        model, _ = self.resnet_checkpoint()
        loaded, meta, _ = load_checkpoint.load(self.path, "resnet", {})
        mean, std = float(meta["input_mean"]), float(meta["input_std"])
        got = load_checkpoint.test_accuracy(loaded, FASHION, mean, std)
        self.assertEqual(got, load_checkpoint.test_accuracy(model, FASHION, mean, std))
        # Evaluation mode: the running statistics, not the batch's.
        x = torch.randn(16, 1, 28, 28)
        with torch.no_grad():
            self.assertTrue(torch.equal(loaded(x), model(x)))
            self.assertGreater((loaded(x) - loaded.train()(x)).abs().max().item(), 1e-3)

    def test_gpt_tied_weight_and_val_loss(self):
        model, tensors = self.gpt_checkpoint()
        self.assertNotIn("lm_head.weight", tensors)
        loaded, _, _ = load_checkpoint.load(self.path, "gpt", WRONG)
        self.assert_same_state(loaded, model)
        self.assertIs(loaded.lm_head.weight, loaded.transformer.wte.weight)
        text = os.path.join(self.dir.name, "text")
        with open(text, "wb") as f:
            f.write(bytes(range(32, 127)) * 40)
        got = load_checkpoint.text_val_loss(loaded, text)
        val = torch.tensor(list((bytes(range(32, 127)) * 40)[-(95 * 40 // 10):]))
        windows = torch.stack([val[i * 16:i * 16 + 17] for i in range((len(val) - 1) // 16)])
        with torch.no_grad():
            want = F.cross_entropy(model(windows[:, :-1]).reshape(-1, 256),
                                   windows[:, 1:].reshape(-1)).item()
        self.assertAlmostEqual(got, want, places=5)

    def test_missing_and_unexpected_names_are_refused(self):
        _, tensors = self.gpt_checkpoint()
        meta = {k: str(v) for k, v in GPT.items()}
        for change, what in ((lambda t: t.pop("transformer.wpe.weight"), "Missing"),
                             (lambda t: t.update(extra=torch.zeros(1)), "Unexpected")):
            broken = dict(tensors)
            change(broken)
            save_file(broken, self.path, metadata=meta)
            with self.assertRaisesRegex(RuntimeError, what):
                load_checkpoint.load(self.path, "gpt", {})


if __name__ == "__main__":
    unittest.main()
