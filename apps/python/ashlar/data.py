"""Real data for PyTorch scripts from Debian's packages, where torchvision looks for it.

    root = ashlar.data.fashion_mnist()       # ~/.cache/ashlar/torchvision (or ROOT)
    train = torchvision.datasets.FashionMNIST(root, train=True, transform=...)

torchvision reads FashionMNIST/raw/*-ubyte under its root and would download them; Debian's
dataset-fashion-mnist has the same files gzipped in /usr/share/datasets/fashion-mnist.
fashion_mnist() unpacks them there once (written aside and renamed: scripts started side by
side do not read a half-written file). `python3 -m ashlar.data [ROOT]` does it from a shell.
"""
import gzip
import os
import shutil
import sys

__all__ = ["fashion_mnist"]

DEBIAN = "/usr/share/datasets/fashion-mnist"
FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def fashion_mnist(root=None, source=DEBIAN):
    """Unpacks Fashion-MNIST's IDX files into ROOT/FashionMNIST/raw (ROOT defaults to
    $XDG_CACHE_HOME/ashlar/torchvision or ~/.cache/ashlar/torchvision) and returns ROOT."""
    if root is None:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(cache, "ashlar", "torchvision")
    raw = os.path.join(root, "FashionMNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for name in FILES:
        out = os.path.join(raw, name)
        if os.path.exists(out):
            continue
        src = os.path.join(source, name + ".gz")
        if not os.path.exists(src):
            raise FileNotFoundError(f"ashlar.data.fashion_mnist: {src} is missing (apt-get install dataset-fashion-mnist)")
        tmp = f"{out}.tmp{os.getpid()}"
        with gzip.open(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout)
        os.replace(tmp, out)
    return root


if __name__ == "__main__":
    print(fashion_mnist(sys.argv[1] if len(sys.argv) > 1 else None))
