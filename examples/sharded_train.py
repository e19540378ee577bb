"""Sharded training with hyper_ac: tensor parallel (DTensor) × FSDP2 on a 2-D mesh.

    torchrun --standalone --nproc-per-node 2 examples/sharded_train.py [--mode selective] [--compiler eager]

Each rank builds the same tiny HF Llama (hyper_ac.models, no download), shards it with
torchtitan's plan (`hyper_ac.models.parallelize`: q/k/v and gate/up colwise, o and down
rowwise, FSDP2 per layer over the "dp" mesh dimension), compiles it with hyper_ac's
backend and trains a few steps. `--dp` sets the data-parallel degree (the rest of the
world is tensor parallel); `--sequence-parallel` shards the residual stream along the
sequence too. gloo on CPU; NCCL when CUDA is there.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import hyper_ac
from hyper_ac import models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="selective", choices=["off", "full", "selective", "auto", "budget"])
    parser.add_argument("--compiler", default="eager", choices=["eager", "inductor"])
    parser.add_argument("--dp", type=int, default=1, help="data-parallel (FSDP2) degree; tensor parallel = world / dp")
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % args.dp:
        raise SystemExit(f"--dp {args.dp} does not divide the world size {world}")
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (args.dp, world // args.dp), mesh_dim_names=("dp", "tp"))

    model = models.build("llama", 2).to(device)
    models.parallelize(model, mesh["tp"], sequence_parallel=args.sequence_parallel, dp_mesh=mesh["dp"])
    config = {"ac_mode": args.mode, **({"ac_memory_budget": 0.5} if args.mode == "budget" else {})}
    compiled = torch.compile(model, backend=hyper_ac.backend(config, model=model, compiler=args.compiler))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = {k: v.to(device) for k, v in models.example_batch("llama", batch=2, seq=32).items()}
    for step in range(args.steps):
        loss = compiled(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f} (mode {args.mode}, {args.compiler}, "
                  f"mesh dp={args.dp} x tp={world // args.dp})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
