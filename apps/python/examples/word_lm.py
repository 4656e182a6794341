"""A word-level LSTM language model on WikiText-2, in the shape of the PyTorch examples'
word_language_model: a hand-written SGD update with gradient clipping, the hidden state
carried across batches (detached at each), the learning rate divided by 4 when the
evaluation stops improving, and perplexity as the metric. Run on Ashlar by its import line:

    ashlar launch --workers 4 --python apps/python/examples/word_lm.py -- --epochs 2
    ashlar launch --workers 4 --policy ashl --set train.speeds=1,1,2,4 \\
        --set 'run.target=val_ppl <= 400' --python apps/python/examples/word_lm.py -- --epochs 20

and alone (`/usr/bin/python3 apps/python/examples/word_lm.py --batch-size 40`) it is the
same training with every worker's sequences in one batch.

The text is batchified once into batch-size x workers columns (token streams); rank r
trains columns r*b .. (r+1)*b - 1, so the workers together train what one process of all
the columns trains. Each epoch it evaluates the test text (cut into the same
columns on any number of workers, each evaluating its share, summed with allreduce) and reports val_loss and val_ppl (hvd.report): the job's
progress lines, report and run.target see them. The data: ../shared/data/wikitext-2
(valid.txt to train on, test.txt to evaluate; --data DIR for another copy).
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import ashlar.torch as hvd

here = os.path.dirname(os.path.abspath(__file__))
default_data = os.path.normpath(os.path.join(here, "..", "..", "..", "..", "shared", "data", "wikitext-2"))
parser = argparse.ArgumentParser(description="WikiText-2 word-level LSTM language model")
parser.add_argument("--data", default=default_data, help="a directory with valid.txt and test.txt")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=10, help="token streams (columns) per worker")
parser.add_argument("--bptt", type=int, default=35, help="sequence length of a step")
parser.add_argument("--emsize", type=int, default=128, help="embedding and hidden size (weights tied)")
parser.add_argument("--lr", type=float, default=20.0)
parser.add_argument("--clip", type=float, default=0.25, help="clip the gradient's norm")
parser.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: whole)")
parser.add_argument("--eval-columns", type=int, default=40, help="token streams the test text is cut into")
parser.add_argument("--seed", type=int, default=1111)
parser.add_argument("--out", default=None, help="write the perplexity per epoch and the seconds here (JSON)")
args = parser.parse_args()


def tokens(path, vocab):
    ids = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            for w in line.split() + ["<eos>"]:
                ids.append(vocab.setdefault(w, len(vocab)))
    return torch.tensor(ids, dtype=torch.long)


def batchify(data, columns):
    n = data.size(0) // columns
    return data[:n * columns].view(columns, n).t().contiguous()  # [tokens, columns]


class LM(nn.Module):
    def __init__(self, ntoken, size):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, size)
        self.rnn = nn.LSTM(size, size)
        self.decoder = nn.Linear(size, ntoken)
        self.decoder.weight = self.encoder.weight  # tied
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out), hidden

    def init_hidden(self, b):
        z = self.encoder.weight.new_zeros(1, b, self.rnn.hidden_size)
        return (z, z.clone())


hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(1)
vocab = {}
train_ids = tokens(os.path.join(args.data, "valid.txt"), vocab)
test_ids = tokens(os.path.join(args.data, "test.txt"), vocab)
b, k, r = args.batch_size, hvd.size(), hvd.rank()
train = batchify(train_ids, b * k)[:, r * b:(r + 1) * b]
# The test text in --eval-columns streams whatever the workers (each evaluates its share):
# the same perplexity for the same model, on any number of workers.
cut = [round(args.eval_columns * i / k) for i in range(k + 1)]
test = batchify(test_ids, args.eval_columns)[:, cut[r]:cut[r + 1]]

model = LM(len(vocab), args.emsize)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
# The hand-written update goes between synchronize() and step(): ManualOptimizer's step
# changes nothing itself.
opt = hvd.DistributedOptimizer(hvd.ManualOptimizer(model.parameters()), named_parameters=model.named_parameters())
opt.batch_size = b * args.bptt  # a step's samples: its tokens (the input is sequence-first)


def evaluate():
    model.eval()
    total, count = 0.0, 0
    hidden = model.init_hidden(test.size(1))
    with torch.no_grad():
        for i in range(0, test.size(0) - 1 if test.size(1) else 0, args.bptt):  # (more workers than columns: none)
            n = min(args.bptt, test.size(0) - 1 - i)
            out, hidden = model(test[i:i + n], hidden)
            total += F.cross_entropy(out.view(-1, out.size(-1)), test[i + 1:i + 1 + n].reshape(-1),
                                     reduction="sum").item()
            count += n * test.size(1)
    model.train()
    sums = hvd.allreduce(torch.tensor([total, float(count)], dtype=torch.float64), op=hvd.Sum)
    return (sums[0] / sums[1]).item()


lr, best, history, start = args.lr, None, [], time.time()
for epoch in range(1, args.epochs + 1):
    hidden = model.init_hidden(b)
    for step, i in enumerate(range(0, train.size(0) - 1, args.bptt)):
        if args.max_steps and step >= args.max_steps:
            break
        n = min(args.bptt, train.size(0) - 1 - i)
        hidden = tuple(h.detach() for h in hidden)  # carried across batches, not backpropagated through
        model.zero_grad()
        out, hidden = model(train[i:i + n], hidden)
        loss = F.cross_entropy(out.view(-1, out.size(-1)), train[i + 1:i + 1 + n].reshape(-1))
        loss.backward()
        opt.synchronize()  # lockstep policies: .grad is now the workers' mean gradient
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)
        opt.step()  # local policies: the step's parameter delta goes to the shards
    val = evaluate()
    hvd.report(val_loss=val, val_ppl=math.exp(val), epoch=epoch, lr=lr)
    history.append({"epoch": epoch, "val_ppl": math.exp(val), "seconds": time.time() - start})
    if r == 0:
        print(f"epoch {epoch}: valid ppl {math.exp(val):.2f}, lr {lr:g} ({time.time() - start:.1f} s)", flush=True)
    if best is None or val < best:
        best = val
    else:
        lr /= 4.0  # as the PyTorch example anneals

if args.out and r == 0:
    import json
    with open(args.out, "w") as f:
        json.dump({"history": history, "workers": k, "batch_size": b, "policy": hvd.policy()}, f)
