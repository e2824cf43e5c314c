"""The two-rank DDP job that made tests/fixtures/runs/ddp_gloo_rank{0,1}: the same job as
scripts/ddp_oom.py, dumping with torch alone (no oomscope_client), as it was run.

It ran on the nvidia-h200 device machine (torch 2.11.0+cu130), 2026-12-02, sent there inline
(``python3 ddp_oom_plain.py OUTDIR``): the device runs a copy of the main checkout, which did not
have this branch's client yet. Two ranks on GPU 0, gloo, each capped at 2 GiB; rank 0's batch
grows by 512 rows a step, rank 1's stays at 512. Each rank dumps RANK.pickle.gz and a sidecar
RANK.json (rank, world_size, error, oom_message, memory_stats) when an exception leaves its loop.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from datetime import timedelta

OUT = sys.argv[1]

if "RANK" not in os.environ:
    os.makedirs(OUT, exist_ok=True)
    procs = []
    for r in (0, 1):
        env = dict(
            os.environ,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="29517",
            TORCHELASTIC_RUN_ID="ddp-oom-h200",
        )
        log = open(f"{OUT}/rank{r}.log", "wb")  # noqa: SIM115 - the child writes it until it exits
        procs.append(subprocess.Popen([sys.executable, __file__, OUT], env=env, stdout=log, stderr=subprocess.STDOUT))  # noqa: S603
    for p in procs:
        try:
            p.wait(timeout=200)
        except subprocess.TimeoutExpired:
            p.kill()
    for name in sorted(os.listdir(OUT)):
        print(name, os.path.getsize(f"{OUT}/{name}"))
    for r in (0, 1):
        print(open(f"{OUT}/rank{r}.log").read()[-700:])  # noqa: SIM115
    sys.exit()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
torch.cuda.set_per_process_memory_fraction((2 << 30) / torch.cuda.get_device_properties(0).total_memory, 0)
torch.cuda.memory._record_memory_history(max_entries=500000)


def dump(error: str | None = None, message: str | None = None) -> None:
    snapshot = torch.cuda.memory._snapshot()
    with gzip.open(f"{OUT}/rank{rank}.pickle.gz", "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    sidecar = {
        "rank": rank,
        "world_size": 2,
        "error": error,
        "oom_message": message,
        "torch": torch.__version__,
        "memory_stats": dict(torch.cuda.memory_stats(0)),
    }
    with open(f"{OUT}/rank{rank}.json", "w") as f:
        json.dump(sidecar, f, indent=1)


dist.init_process_group("gloo", timeout=timedelta(seconds=90))
layers: list[torch.nn.Module] = []
for _ in range(8):
    layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
model = DistributedDataParallel(torch.nn.Sequential(*layers).cuda())
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
try:
    for step in range(60):
        batch = 512 * (step + 1) if rank == 0 else 512
        model(torch.randn(batch, 2048, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print("rank", rank, "step", step, "batch", batch, torch.cuda.memory_reserved(), flush=True)
except torch.cuda.OutOfMemoryError as e:
    dump(message=str(e))
    raise
except Exception as e:
    dump(error=f"{type(e).__name__}: {e}")
    raise
