"""Ashlar's model descriptions as PyTorch modules.

build(config) turns the [model] of an Ashlar config (a TOML file, or the model block of
a checkpoint export) into a torch.nn.Module that computes the same function with the same
parameter layout: Ashlar's flat parameter vector is the concatenation, in layer order, of
each layer's weight and then bias, exactly as PyTorch's Conv2d, Linear and GroupNorm
store theirs. So load_flat(module, flat) copies Ashlar's parameters into the module.

    import ashlar_torch
    model = ashlar_torch.build(ashlar_torch.read_config("ops/configs/fmnist-cnn.toml"))
"""
import tomllib

import torch
from torch import nn

KINDS = {"dense", "linear", "conv2d", "conv", "maxpool", "avgpool", "relu", "flatten", "dropout",
         "groupnorm", "layernorm", "add", "external"}


def read_config(path):
    """The [model] table of an Ashlar TOML config, with defaults filled in."""
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    return model_of(cfg.get("model", {}))


def model_of(m):
    """A model dict: input [C, H, W], classes, layers [dict(kind=..., ...)]."""
    inp = m.get("input", [1, 28, 28])
    if isinstance(inp, int):
        inp = [inp]
    if len(inp) == 1:
        inp = [inp[0], 1, 1]
    classes = int(m.get("classes", 10))
    layers = m.get("layers")
    if isinstance(layers, str):
        layers = [s for s in layers.replace("\n", ";").split(";") if s.strip()]
    if not layers:
        hidden = m.get("hidden", [256, 128])
        layers = ([] if inp[1] == 1 and inp[2] == 1 else ["flatten"])
        for h in hidden:
            layers += [f"dense out={h}", "relu"]
        layers.append(f"dense out={classes}")
    parsed = []
    for item in layers:
        if isinstance(item, dict):
            d = dict(item)
            d["kind"] = d.pop("type")
        else:
            words = item.split()
            d = {"kind": words[0]}
            for kv in words[1:]:
                k, v = kv.split("=", 1)
                d[k] = v
        if d["kind"] not in KINDS:
            raise ValueError(f"unknown layer kind {d['kind']}")
        parsed.append(d)
    for i, d in enumerate(parsed):
        d.setdefault("name", f"{d['kind']}{i}")
    return {"input": [int(x) for x in inp], "classes": classes, "layers": parsed}


class AshlarNet(nn.Module):
    """Runs the layers in order; `input` and `add from` refer to earlier layers by name."""

    def __init__(self, model):
        super().__init__()
        self.spec = model
        c, h, w = model["input"]
        shapes = {}
        shape = (c, h, w)
        self.order = []
        self.mods = nn.ModuleDict()
        prev = None
        for d in model["layers"]:
            kind, name = d["kind"], d["name"]
            src = d.get("input", prev)
            in_shape = shapes[src] if src is not None and src != "input" else (c, h, w)
            ci, hi, wi = in_shape
            if kind in ("dense", "linear"):
                mod = nn.Linear(ci * hi * wi, int(d["out"]))
                out = (int(d["out"]), 1, 1)
            elif kind in ("conv2d", "conv"):
                k, s, p = int(d.get("kernel", 3)), int(d.get("stride", 1)), int(d.get("padding", 0))
                mod = nn.Conv2d(ci, int(d["out"]), k, stride=s, padding=p)
                out = (int(d["out"]), (hi + 2 * p - k) // s + 1, (wi + 2 * p - k) // s + 1)
            elif kind in ("maxpool", "avgpool"):
                k = int(d.get("kernel", 2))
                s = int(d.get("stride", k))
                p = int(d.get("padding", 0))
                mod = nn.MaxPool2d(k, s, p) if kind == "maxpool" else nn.AvgPool2d(k, s, p, count_include_pad=True)
                out = (ci, (hi + 2 * p - k) // s + 1, (wi + 2 * p - k) // s + 1)
            elif kind == "relu":
                mod, out = nn.ReLU(), in_shape
            elif kind == "flatten":
                mod, out = nn.Flatten(), (ci * hi * wi, 1, 1)
            elif kind == "dropout":
                mod, out = nn.Dropout(float(d.get("p", 0.5))), in_shape
            elif kind in ("groupnorm", "layernorm"):
                g = 1 if kind == "layernorm" else int(d.get("groups", 1))
                mod, out = nn.GroupNorm(g, ci, eps=float(d.get("eps", 1e-5))), in_shape
            elif kind == "add":
                mod, out = nn.Identity(), in_shape
            else:
                raise ValueError(f"layer {name}: {kind} has no PyTorch equivalent here")
            self.mods[name] = mod
            self.order.append((name, kind, src, d.get("from")))
            shapes[name] = out
            prev = name
        self.shapes = shapes

    def forward(self, x):
        c, h, w = self.spec["input"]
        x = x.reshape(x.shape[0], c, h, w) if (h, w) != (1, 1) else x.reshape(x.shape[0], c)
        outs = {"input": x}
        y = x
        prev = "input"
        for name, kind, src, frm in self.order:
            t = outs[src] if src is not None else outs[prev]
            if kind in ("dense", "linear") and t.dim() > 2:
                t = t.flatten(1)
            if kind == "add":
                y = t + outs[frm]
            else:
                y = self.mods[name](t)
            outs[name] = y
            prev = name
        return y

    def param_tensors(self):
        """Parameters in Ashlar's flat order: per layer, weight then bias."""
        out = []
        for name, kind, _, _ in self.order:
            m = self.mods[name]
            if isinstance(m, (nn.Linear, nn.Conv2d, nn.GroupNorm)):
                out += [m.weight, m.bias]
        return out


def build(model):
    return AshlarNet(model if "layers" in model and model["layers"] and isinstance(model["layers"][0], dict)
                     and "kind" in model["layers"][0] else model_of(model))


def load_flat(net, flat):
    """Copies Ashlar's flat parameter vector (a float32 sequence) into `net`."""
    flat = torch.as_tensor(flat, dtype=torch.float32)
    pos = 0
    with torch.no_grad():
        for t in net.param_tensors():
            n = t.numel()
            t.copy_(flat[pos:pos + n].view_as(t))
            pos += n
    if pos != flat.numel():
        raise ValueError(f"the model takes {pos} parameters, the vector has {flat.numel()}")
