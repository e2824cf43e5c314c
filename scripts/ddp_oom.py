"""A real two-rank DDP job that dies of an OOM on one rank, with the client's hooks on.

Run on a GPU machine:  python3 scripts/ddp_oom.py OUTDIR
The parent starts two ranks of this script as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT, TORCHELASTIC_RUN_ID), but without torchrun's agent, which would stop the
surviving rank before its collective fails. Both ranks share GPU 0: DDP with the gloo backend
carries CUDA tensors, and each rank has its own ``set_per_process_memory_fraction`` cap
(CAP_BYTES). Each rank records history (``oomscope_client.record``) and installs
``dump_on_oom`` (prefix ``rank<N>``). Rank 0's batch grows every step, rank 1's stays, so rank 0
runs out of memory first; its process exits, and rank 1's all-reduce then fails with gloo's
error, which the client dumps too (a rank of a multi-rank job dumps on any uncaught error).
OUTDIR gets each rank's snapshot, sidecar and log; the parent prints what it found.
Analyse them as one run: python -m analysis report OUTDIR/rank0-*.pickle.gz OUTDIR/rank1-*.pickle.gz
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN_ID = "ddp-oom-h200"
CAP_BYTES = 2 << 30
WIDTH = 2048
LAYERS = 8
BASE_BATCH = 512
STEPS = 60


def rank_main(outdir: Path) -> None:
    sys.path.insert(0, str(REPO / "client"))
    import oomscope_client as oc
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP_BYTES / total, 0)
    oc.record(max_entries=500_000)
    oc.dump_on_oom(outdir, prefix=f"rank{rank}")
    # A bounded wait: a collective whose peer is gone fails at once, but never hang the machine.
    dist.init_process_group("gloo", timeout=timedelta(seconds=90))
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = DistributedDataParallel(torch.nn.Sequential(*layers).cuda())
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for step in range(STEPS):
        batch = BASE_BATCH * (step + 1) if rank == 0 else BASE_BATCH
        x = torch.randn(batch, WIDTH, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"rank {rank} step {step} batch {batch} reserved {torch.cuda.memory_reserved()}", flush=True)
    dist.destroy_process_group()


def parent_main(outdir: Path) -> int:
    outdir.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in (0, 1):
        env = dict(os.environ)
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29517",
                "TORCHELASTIC_RUN_ID": RUN_ID,
            }
        )
        log = (outdir / f"rank{rank}.log").open("wb")
        procs.append(subprocess.Popen([sys.executable, __file__, str(outdir)], env=env, stdout=log, stderr=log))  # noqa: S603
    started = time.monotonic()
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=240))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    print(f"exit codes {codes} after {time.monotonic() - started:.1f} s")
    for path in sorted(outdir.iterdir()):
        print(f"{path.name}\t{path.stat().st_size}")
    for rank in (0, 1):
        tail = (outdir / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()[-6:]
        print(f"--- rank {rank} log tail ---\n" + "\n".join(tail))
    return 0


if __name__ == "__main__":
    target = Path(sys.argv[1])
    if "RANK" in os.environ:
        rank_main(target)
    else:
        sys.exit(parent_main(target))
