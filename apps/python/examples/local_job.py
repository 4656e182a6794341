"""A whole Ashlar job in this Python process whose workers compute with a PyTorch module:

    PYTHONPATH=build/python /usr/bin/python3 apps/python/examples/local_job.py [CONFIG] [POLICY]
"""
import sys

import ashlar
import ashlar.torch
from ashlar import ashlar_torch

config = sys.argv[1] if len(sys.argv) > 1 else "ops/configs/fmnist-mlp.toml"
policy = sys.argv[2] if len(sys.argv) > 2 else "adsp"
model = ashlar_torch.build(ashlar_torch.read_config(config))
report = ashlar.train(config, backend=ashlar.torch.ModelBackend(model),
                      settings={"train.policy": policy, "train.workers": 2, "train.epochs": 1})
print(f"{policy}: test accuracy {report['test_accuracy']:.4f} after {report['epochs_trained']:.2f} epochs, "
      f"{sum(w['steps'] for w in report['per_worker'])} PyTorch steps")
