#!/usr/bin/env python3
"""Real training scripts nobody here wrote, ported to Ashlar by their imports and launcher:
the PyTorch examples' mnist/main.py (Adadelta, StepLR, its own DataLoader) and Horovod's
examples/pytorch/pytorch_mnist.py. Give the paths of your copies of them (they are not in
this tree); this writes the ported copies (each edit printed: at most 10 lines changed),
runs each under `ashlar launch --workers N` and the one-process run of the same semantics
(N x the batch, the learning rate as the script scales it), on Fashion-MNIST through
torchvision (Debian's files, ashlar.data), and prints the final test accuracies.

    python3 ops/bench/port_scripts.py --examples-mnist main.py --horovod-mnist pytorch_mnist.py \\
        --workers 4 --epochs 2 --out /tmp/ports

The ported scripts read Fashion-MNIST where they read MNIST (`datasets.MNIST` becomes
`datasets.FashionMNIST`): Debian has no MNIST package.
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
PY = "/usr/bin/python3"


def port(text, edits):
    """Applies (pattern, replacement) line edits; returns the new text and the changed lines."""
    lines = text.split("\n")
    changed = []
    for pattern, repl in edits:
        hits = [i for i, l in enumerate(lines) if re.search(pattern, l)]
        if not hits:
            raise SystemExit(f"port_scripts: no line matches {pattern!r}: is this the script the bench expects?")
        for i in hits:
            new = re.sub(pattern, repl, lines[i])
            if new != lines[i]:
                changed.append((i + 1, lines[i], new))
                lines[i] = new
    return "\n".join(lines), changed


def examples_mnist(text):
    """pytorch/examples mnist/main.py: a one-process script; the port adds Horovod's
    four calls (init, the sampler, the optimizer's wrapper, rank 0's prints)."""
    return port(text, [
        (r"^import torch$", "import torch\nimport ashlar.torch as hvd; hvd.init()"),
        (r"datasets\.MNIST\('../data'", "datasets.FashionMNIST(DATA"),
        (r"^from torch\.optim\.lr_scheduler import StepLR$",
         "from torch.optim.lr_scheduler import StepLR\nimport ashlar.data; DATA = ashlar.data.fashion_mnist()"),
        (r"train_loader = torch\.utils\.data\.DataLoader\(dataset1,\*\*train_kwargs\)",
         "train_loader = torch.utils.data.DataLoader(dataset1, sampler=torch.utils.data.distributed."
         "DistributedSampler(dataset1, hvd.size(), hvd.rank(), shuffle=False), **train_kwargs)"),
        (r"optimizer = optim\.Adadelta\(model\.parameters\(\), lr=args\.lr\)",
         "optimizer = hvd.DistributedOptimizer(optim.Adadelta(model.parameters(), lr=args.lr), "
         "named_parameters=model.named_parameters())"),
    ])


def horovod_mnist(text):
    """horovod examples/pytorch/pytorch_mnist.py: the import lines and the data set."""
    return port(text, [
        (r"^import horovod$", ""),
        (r"^import horovod\.torch as hvd$", "import ashlar.torch as hvd"),
        (r"^from filelock import FileLock$", "import contextlib"),
        (r"FileLock\(os\.path\.expanduser\(\"~/\.horovod_lock\"\)\)", "contextlib.nullcontext()"),
        (r"datasets\.MNIST\(", "datasets.FashionMNIST("),
    ])


ACCURACY = re.compile(r"Accuracy: (?:(\d+)/(\d+) \((\d+)%\)|([\d.]+)%)")


def last_accuracy(out):
    found = None
    for m in ACCURACY.finditer(out):
        found = int(m.group(1)) / int(m.group(2)) if m.group(1) else float(m.group(4)) / 100
    return found


def run(cmd, log):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "build/python")))
    log.write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"port_scripts: {' '.join(cmd)} failed (exit {p.returncode}); see {log}")
    return last_accuracy(p.stdout + p.stderr), time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples-mnist", help="your copy of pytorch/examples mnist/main.py")
    ap.add_argument("--horovod-mnist", help="your copy of horovod examples/pytorch/pytorch_mnist.py")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--policy", default="bsp")
    ap.add_argument("--out", default="/tmp/ashlar-ports")
    ap.add_argument("--ashlar", default=str(ROOT / "build/apps/ashlar"))
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = subprocess.run([PY, "-m", "ashlar.data"], capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "build/python"))).stdout.strip()
    rows = []
    for name, path, porter, batch, lr_flag in [
            ("pytorch/examples mnist/main.py", a.examples_mnist, examples_mnist, 64, None),
            ("horovod pytorch_mnist.py", a.horovod_mnist, horovod_mnist, 64, ("--lr", 0.01))]:
        if not path:
            continue
        text, changed = porter(pathlib.Path(path).read_text())
        ported = out / ("ported_" + pathlib.Path(path).name)
        ported.write_text(text)
        print(f"{name}: {len(changed)} lines changed")
        for line, old, new in changed:
            print(f"  {line}: {old.strip()}\n   -> {new.strip()}")
        common = ["--epochs", str(a.epochs)] + (["--data-dir", data] if "horovod" in name else [])
        acc, secs = run([a.ashlar, "launch", "--workers", str(a.workers), "--servers", "1", "--policy", a.policy,
                         "--set", "run.log_level=warn", "--python", str(ported), "--", *common],
                        out / f"{ported.stem}.ashlar.log")
        # One process: the workers' batches as one, the rate as the script scales it (the
        # Horovod example multiplies its lr by hvd.size(); the examples' script does not).
        one = [PY, str(ported), "--batch-size", str(batch * a.workers), *common]
        if lr_flag:
            one += [lr_flag[0], str(lr_flag[1] * a.workers)]
        ref, ref_secs = run(one, out / f"{ported.stem}.one.log")
        rows.append((name, acc, secs, ref, ref_secs))
    print(f"\n| script | ashlar launch --workers {a.workers} ({a.policy}) | one process, batch x{a.workers} | difference |")
    print("|---|---|---|---|")
    for name, acc, secs, ref, ref_secs in rows:
        print(f"| {name} | {acc:.4f} ({secs:.0f} s) | {ref:.4f} ({ref_secs:.0f} s) | {100 * (acc - ref):+.2f} points |")


if __name__ == "__main__":
    sys.exit(main())
