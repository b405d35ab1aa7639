"""The benchmark's training job: a small transformer trained with DDP (gloo) on CPU.

Run it under torchrun (``torchrun --nproc-per-node 2 bench/trainer/train.py --seconds 30``):
each rank trains a model (``--model transformer``: a 2-layer transformer language model on
random tokens; ``--model mlp``: a 4-layer MLP on random vectors, many small steps, so its
threads synchronize often) fed by a DataLoader with ``--workers`` persistent worker processes
(which do a little CPU work per sample, as tokenizers and decoders do; 0: batches made in the
rank), all-reduces gradients over gloo every step, and after ``--warmup`` seconds counts steps for
``--seconds``. Intra-op threads follow ``OMP_NUM_THREADS`` (torchrun sets 1 unless told).
Rank 0 prints one JSON line: ``{"steps": N, "seconds": S, "steps_per_s": R, "step_ms_p50": ..,
"step_ms_p99": ..}`` (and writes it to ``--out`` when given). The job's threads carry the names
a real PyTorch job has (FACTS.md): the launcher ``pt_elastic``, ``gloo_tcp_loop``/
``pt_gloo_runloop`` comm threads, ``pt_data_worker`` processes, OpenMP workers named like the
trainer. Where ``HOSTD_THROUGHPUT_FILE`` is set, rank 0 rewrites it every second with its steps/s
so far (``12.3 steps/s``): the throughput hostd records for the attempt (bench/ab.py).
``--compile`` compiles the model with torch.compile first (a burst of compiler processes below
each rank) and ``--spike AT SECONDS`` makes the workers' per-sample work ``--spike-factor``
times heavier for a while (a data-loader spike): what tools/record_trace.py records.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

VOCAB, SEQ, DIM = 512, 64, 128


class Spiky:
    """Per-sample CPU work, ``factor`` times more between ``spike`` (wall-clock start, end)."""

    def __init__(self, work: int, spike: tuple[float, float] | None, factor: float) -> None:
        self.work, self.spike, self.factor = work, spike, factor

    def cost(self) -> int:
        if self.spike and self.spike[0] <= time.time() < self.spike[1]:
            return int(self.work * self.factor)
        return self.work


class RandomTokens(Spiky, IterableDataset):
    """Endless random token sequences; each sample costs a little CPU, as decoding does."""

    def __iter__(self):
        gen = torch.Generator().manual_seed(os.getpid())
        while True:
            x = torch.randint(0, VOCAB, (SEQ + 1,), generator=gen)
            acc = 0
            for i in range(self.cost()):  # stand-in for tokenization / augmentation
                acc = (acc * 31 + i) % 1_000_003
            yield x[:-1], x[1:]


class RandomVectors(Spiky, IterableDataset):
    """Endless random (input, class) pairs for the MLP, with the same per-sample CPU work."""

    def __iter__(self):
        gen = torch.Generator().manual_seed(os.getpid())
        while True:
            x = torch.randn(MLP_IN, generator=gen)
            acc = 0
            for i in range(self.cost()):
                acc = (acc * 31 + i) % 1_000_003
            yield x, torch.randint(0, MLP_OUT, (), generator=gen)


MLP_IN, MLP_HIDDEN, MLP_OUT = 256, 512, 10


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(MLP_IN, MLP_HIDDEN), nn.ReLU(),
        nn.Linear(MLP_HIDDEN, MLP_HIDDEN), nn.ReLU(),
        nn.Linear(MLP_HIDDEN, MLP_HIDDEN), nn.ReLU(),
        nn.Linear(MLP_HIDDEN, MLP_OUT),
    )  # fmt: skip


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(x)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="measured time")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds before counting")
    ap.add_argument("--model", default="transformer", choices=("transformer", "mlp"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--work", type=int, default=2000, help="CPU work per sample in the workers")
    ap.add_argument("--out", default=None, help="also write rank 0's JSON line here")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model first")
    ap.add_argument(
        "--spike", type=float, nargs=2, metavar=("AT", "SECONDS"), default=None,
        help="from AT seconds after start, for SECONDS, the workers' per-sample work is "
        "--spike-factor times more (a data-loader spike)",
    )  # fmt: skip
    ap.add_argument("--spike-factor", type=float, default=8.0)
    ap.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="cuda: model and batches on the GPU (LOCAL_RANK modulo the GPUs); gradients are "
        "still all-reduced over gloo, which takes CUDA tensors, so several ranks may share a GPU",
    )
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    device = torch.device("cpu")
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    net = TinyLM() if args.model == "transformer" else mlp()
    model = nn.parallel.DistributedDataParallel(net.to(device))
    if args.compile:
        model = torch.compile(model)  # Inductor: compiler processes below the rank
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    began = time.time()
    spike = (began + args.spike[0], began + args.spike[0] + args.spike[1]) if args.spike else None
    kind = RandomTokens if args.model == "transformer" else RandomVectors
    data = kind(args.work, spike, args.spike_factor)
    loader = DataLoader(
        data,
        batch_size=args.batch,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    dist.barrier()  # every rank starts its clock together
    start = time.monotonic()
    counting_from = start + args.warmup
    steps, counted_at, last, step_times = 0, None, None, []
    # What hostd records of each attempt (README "A/B rollout"): rank 0's steps/s so far.
    rate_file = os.environ.get("HOSTD_THROUGHPUT_FILE") if rank == 0 else None
    told = start
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        now = time.monotonic()
        # Every rank decides together when to stop (an all-reduce of "done"), so that no rank
        # waits forever in the next step's gradient all-reduce.
        done = torch.tensor([1.0 if now >= counting_from + args.seconds else 0.0], device=device)
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if counted_at is None and now >= counting_from:
            counted_at, steps = now, 0
        elif counted_at is not None:
            steps += 1
            step_times.append(now - last)
        last = now
        if rate_file and counted_at is not None and now - told >= 1.0 and now > counted_at:
            with open(rate_file + ".tmp", "w", encoding="utf-8") as fh:
                fh.write(f"{steps / (now - counted_at):.3f} steps/s\n")
            os.replace(rate_file + ".tmp", rate_file)
            told = now
        if done.item() > 0:
            break
    began_at = counted_at or start
    elapsed = time.monotonic() - began_at
    if rank == 0:
        step_times.sort()

        def pct(q: float) -> float | None:
            if not step_times:
                return None
            return round(1000 * step_times[min(len(step_times) - 1, int(q * len(step_times)))], 2)

        line = json.dumps(
            {
                "steps": steps,
                "seconds": round(elapsed, 3),
                "steps_per_s": steps / elapsed,
                "step_ms_p50": pct(0.5),
                "step_ms_p99": pct(0.99),
                # the counted window, in CLOCK_MONOTONIC (system-wide): what ran beside it
                "window": [round(began_at, 3), round(began_at + elapsed, 3)],
            }
        )
        print(line, flush=True)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as fh:
                fh.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
