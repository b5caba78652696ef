"""The PyTorch twins of ch_nn_preset's models: the same layers in the same
order, so that their state_dict names are the names Chorus saves."""
from torch import nn


def preset(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(),
                             nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    raise ValueError(f"no preset named {kind!r} (mlp or cnn)")
