"""The Boolean matrix composition task (2-hop) of the IHA paper's appendix D, at small scale.

Each example holds two random Boolean n x n matrices A and B, given entry by entry, followed
by one query token per entry of C = A o B (the Boolean product: C[i][k] = OR_j A[i][j] AND
B[j][k]). The model predicts every C[i][k] at its query token. Sequence, n*n tokens each:
A's entries, B's entries, the queries (row-major). A token's embedding is its value's
(0, 1, or "query") plus its position's (learned). The model is one IHA layer
(iha.torch.InterleavedHeadAttention, causal, H heads, P pseudo-heads; P = 1 is multi-head
attention) with a residual connection, a LayerNorm and a linear readout of two logits.
Trained with AdamW on fresh examples every step; evaluated on a fixed held-out set.

    python python/reproduction/composition.py --pseudo 1 2 4 8 --seeds 0 1 2 --out results.json

prints one line per evaluation and, at the end, a Markdown table of per-position and
exact-match accuracy (mean and standard deviation over seeds) per P.
"""

import argparse
import json
import os
import statistics
import sys
import time

import iha.torch
import torch


def density_for_half_ones(n):
    """The entry density p that makes P(C[i][k] = 1) = 1 - (1 - p^2)^n one half."""
    return (1.0 - 0.5 ** (1.0 / n)) ** 0.5


def examples(count, n, generator):
    """Tokens [count, 3n^2] (0, 1 for entries, 2 for queries) and targets [count, n^2]."""
    p = density_for_half_ones(n)
    a = (torch.rand(count, n, n, generator=generator) < p).long()
    b = (torch.rand(count, n, n, generator=generator) < p).long()
    c = ((a.float() @ b.float()) > 0).long()
    queries = torch.full((count, n * n), 2, dtype=torch.long)
    return torch.cat((a.flatten(1), b.flatten(1), queries), dim=1), c.flatten(1)


class Model(torch.nn.Module):
    def __init__(self, n, model_dim, heads, head_dim, pseudo):
        super().__init__()
        self.n = n
        self.values = torch.nn.Embedding(3, model_dim)
        self.positions = torch.nn.Parameter(torch.randn(3 * n * n, model_dim) * 0.5)
        self.attention = iha.torch.InterleavedHeadAttention(model_dim, heads, head_dim, pseudo, mask="causal")
        self.norm = torch.nn.LayerNorm(model_dim)
        self.readout = torch.nn.Linear(model_dim, 2)

    def forward(self, tokens):
        h = self.values(tokens) + self.positions
        h = h + self.attention(h)
        return self.readout(self.norm(h[:, -self.n * self.n:]))


def evaluate(model, tokens, targets):
    with torch.no_grad():
        predicted = model(tokens).argmax(-1)
    correct = predicted == targets
    return correct.float().mean().item(), correct.all(dim=1).float().mean().item()


def train(args, pseudo, seed, log):
    torch.manual_seed(seed)
    model = Model(args.n, args.model_dim, args.heads, args.head_dim, pseudo)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps,
                                                   pct_start=0.1)
    data = torch.Generator().manual_seed(1000 + seed)
    held_out = examples(args.eval_examples, args.n, torch.Generator().manual_seed(10 ** 6))
    start = time.time()
    for step in range(1, args.steps + 1):
        tokens, targets = examples(args.batch, args.n, data)
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % args.eval_every == 0 or step == args.steps:
            position, exact = evaluate(model, *held_out)
            log(f"P={pseudo} seed={seed} step={step} loss={loss.item():.4f} position_acc={position:.4f} "
                f"exact_match={exact:.4f} elapsed={time.time() - start:.0f}s")
    position, exact = evaluate(model, *held_out)
    return {"pseudo": pseudo, "seed": seed, "position_acc": position, "exact_match": exact,
            "seconds": time.time() - start, "final_loss": loss.item()}


def mean_and_spread(values):
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {spread:.3f}"


def summary(runs):
    lines = ["| P | seeds | per-position accuracy | exact-match accuracy | seconds per run |",
             "| --- | --- | --- | --- | --- |"]
    for pseudo in sorted({r["pseudo"] for r in runs}):
        mine = [r for r in runs if r["pseudo"] == pseudo]

        def cell(key, mine=mine):
            return mean_and_spread([r[key] for r in mine])

        seconds = statistics.mean(r["seconds"] for r in mine)
        lines.append(f"| {pseudo} | {len(mine)} | {cell('position_acc')} | {cell('exact_match')} | {seconds:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4, help="matrix size")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=8)
    parser.add_argument("--model-dim", type=int, default=64)
    parser.add_argument("--pseudo", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--eval-examples", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads (the layer runs on OpenCL)")
    parser.add_argument("--out", help="write every run and the table as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    def log(line):
        print(line, flush=True)

    log(f"composition: {vars(args)}")
    runs = []
    # Seed by seed, every P for each, and the results written after each run: a run cut short
    # leaves whole seeds behind.
    for seed in args.seeds:
        for pseudo in args.pseudo:
            runs.append(train(args, pseudo, seed, log))
            table = summary(runs)
            if args.out:
                with open(args.out + ".tmp", "w") as f:
                    json.dump({"args": vars(args), "runs": runs, "table": table}, f, indent=1)
                os.replace(args.out + ".tmp", args.out)
    log(table)
    return runs


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
