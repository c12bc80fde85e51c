"""PyTorch DistributedDataParallel as a towerq command job, one process per GPU:

    towerq run --gpus 2 --per-gpu -- python torch_ddp.py --steps 200

Each process sees only its own GPU (cuda:0), and towerq gives it RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT: `init_method="env://"` reads them. NCCL on GPUs, gloo on CPUs.
Rank 0 reports the job's metrics and writes its checkpoints. Started by torchrun instead,

    towerq run --gpus 2 -- torchrun --nproc_per_node=2 torch_ddp.py --steps 200

the job's one process sees both GPUs, torchrun sets the same variables, and each rank takes
the GPU of its LOCAL_RANK.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import towerq

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
steps = parser.parse_args().steps

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ.get("LOCAL_RANK", "0")) if cuda and torch.cuda.device_count() > 1 else 0
device = torch.device(f"cuda:{local}" if cuda else "cpu")  # this process's GPU (per_gpu: its only one)
print(f"rank {rank} of {world} on GPU {os.environ['CUDA_VISIBLE_DEVICES']}", flush=True)

torch.manual_seed(0)  # the same start on every rank; DDP keeps them equal
model = DistributedDataParallel(torch.nn.Linear(16, 1).to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(rank)  # each rank its own slice of the data
truth = torch.arange(16, dtype=torch.float32) / 16

checkpoint = os.path.join(os.environ.get("TOWERQ_CHECKPOINT_DIR", "."), "model.pt")
start = 0
if os.path.exists(checkpoint):
    saved = torch.load(checkpoint, map_location=device)
    model.module.load_state_dict(saved["model"])
    start = saved["step"]

for step in range(start + 1, steps + 1):
    x = torch.randn(64, 16, generator=generator)
    y = x @ truth
    loss = torch.nn.functional.mse_loss(model(x.to(device)).squeeze(1), y.to(device))
    optimizer.zero_grad()
    loss.backward()  # gradients averaged over the ranks
    optimizer.step()
    averaged = loss.detach().clone()
    dist.all_reduce(averaged)
    if rank == 0:
        towerq.report(step=step, loss=averaged.item() / world, total_steps=steps)
        if step % 50 == 0 or step == steps:
            torch.save({"model": model.module.state_dict(), "step": step}, checkpoint)

weights = model.module.weight.detach().clone()
gathered = [torch.zeros_like(weights) for _ in range(world)]
dist.all_gather(gathered, weights)
if rank == 0:
    print("the ranks' weights agree:", all(torch.equal(gathered[0], w) for w in gathered), flush=True)
dist.barrier()  # no rank closes its connections while another still uses them (gloo can abort then)
dist.destroy_process_group()
