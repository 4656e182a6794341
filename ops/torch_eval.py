#!/usr/bin/python3
"""Loads an Ashlar checkpoint export (`ashlar checkpoint export DIR --out model.npz`) into
the equivalent PyTorch model and evaluates it on the test set, as Ashlar does.

    /usr/bin/python3 ops/torch_eval.py model.npz                       # Fashion-MNIST
    /usr/bin/python3 ops/torch_eval.py model.npz --npy DIR             # your x_test.npy, y_test.npy
    /usr/bin/python3 ops/torch_eval.py model.npz --save model.pt       # also a state_dict

The state_dict's keys are the export's (LAYER.weight, LAYER.bias): the layers of
ashlar_torch.build(model).mods, which load it with load_state_dict.

Prints one JSON line: the test accuracy and loss PyTorch computes with Ashlar's weights.
"""
import argparse
import gzip
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ashlar_torch  # noqa: E402


def idx(path):
    for p in (path, path + ".gz"):
        if os.path.exists(p):
            with (gzip.open(p) if p.endswith(".gz") else open(p, "rb")) as f:
                return f.read()
    raise FileNotFoundError(path)


def fashion_mnist_test(d):
    img = idx(os.path.join(d, "t10k-images-idx3-ubyte"))
    lbl = idx(os.path.join(d, "t10k-labels-idx1-ubyte"))
    n, rows, cols = (int.from_bytes(img[i:i + 4], "big") for i in (4, 8, 12))
    px = np.frombuffer(img, np.uint8, offset=16).reshape(n, 1, rows, cols)
    # As Ashlar's IDX reader: scaled to [0, 1] and standardized (mean 0.2860, std 0.3530), in float32.
    scale = np.float32(1.0) / (np.float32(255.0) * np.float32(0.3530))
    shift = np.float32(0.2860) / np.float32(0.3530)
    x = px.astype(np.float32) * scale - shift
    y = np.frombuffer(lbl, np.uint8, offset=8).astype(np.int64)
    return x, y


def npy_test(d, shape):
    """As Ashlar's NumPy loader: uint8 standardized per channel with the training statistics."""
    x = np.load(os.path.join(d, "x_test.npy"))
    y = np.load(os.path.join(d, "y_test.npy")).reshape(-1).astype(np.int64)
    c, h, w = shape
    if x.ndim == 4 and x.shape[1:] == (h, w, c) and x.shape[1:] != (c, h, w):
        x = x.transpose(0, 3, 1, 2)
    x = x.reshape(len(x), c, h, w)
    if x.dtype == np.uint8:
        tr = np.load(os.path.join(d, "x_train.npy"))
        if tr.ndim == 4 and tr.shape[1:] == (h, w, c) and tr.shape[1:] != (c, h, w):
            tr = tr.transpose(0, 3, 1, 2)
        tr = tr.reshape(len(tr), c, h, w).astype(np.float64) / 255.0
        mean = tr.mean(axis=(0, 2, 3))
        sd = np.sqrt(np.maximum((tr ** 2).mean(axis=(0, 2, 3)) - mean ** 2, 1e-12))
        x = ((x.astype(np.float32) / np.float32(255.0) - mean[None, :, None, None]) / sd[None, :, None, None])
    return x.astype(np.float32), y


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("npz", help="the export: ashlar checkpoint export DIR --out FILE.npz")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST's IDX files")
    p.add_argument("--npy", default="", help="a directory with x_test.npy and y_test.npy instead")
    p.add_argument("--save", default="", help="also write the PyTorch state_dict here")
    a = p.parse_args()

    how = "make one with `ashlar checkpoint export DIR --out model.npz`"
    try:
        archive = np.load(a.npz)
    except (OSError, ValueError) as e:
        sys.exit(f"torch_eval.py: cannot read {a.npz}: {e}")
    if not hasattr(archive, "files") or "ashlar_model" not in archive.files:
        sys.exit(f"torch_eval.py: {a.npz} is not an Ashlar export (a .npz with the model's layers and "
                 f"ashlar_model); {how}")
    spec = json.loads(bytes(archive["ashlar_model"]).decode())
    model = ashlar_torch.model_of({"input": spec["input"], "classes": spec["classes"], "layers": spec["layers"]})
    net = ashlar_torch.build(model)
    with torch.no_grad():
        for name, mod in net.mods.items():
            for part in ("weight", "bias"):
                key = f"{name}.{part}"
                if key in archive.files:
                    getattr(mod, part).copy_(torch.from_numpy(archive[key]))
    net.eval()
    x, y = npy_test(a.npy, spec["input"]) if a.npy else fashion_mnist_test(a.data_dir)
    correct, loss = 0, 0.0
    with torch.no_grad():
        for lo in range(0, len(x), 1000):
            logits = net(torch.from_numpy(x[lo:lo + 1000]))
            t = torch.from_numpy(y[lo:lo + 1000])
            loss += torch.nn.functional.cross_entropy(logits, t, reduction="sum").item()
            correct += (logits.argmax(1) == t).sum().item()
    if a.save:
        # Keyed as the export is (LAYER.weight, LAYER.bias): ashlar_torch.build(model).mods
        # loads it with load_state_dict.
        torch.save(net.mods.state_dict(), a.save)
    print(json.dumps({"framework": "pytorch " + torch.__version__, "test_accuracy": correct / len(x),
                      "test_loss": loss / len(x), "samples": len(x), "params": spec["params"]}))


if __name__ == "__main__":
    main()
