"""A Hydra app that trains with DDP, in the shape Hydra's documentation shows (tests/test_torchrun_fidelity.py).

    hydra_app.py out=DIR [key=value ...]

Its configuration is hydra_conf/config.yaml beside it, overridden on the command line. Each rank writes
DIR/seen-RANK.json (what Hydra made of its start: job name, overrides, working and output folders, the
resolved config); rank 0 also DIR/result.json (the final parameters, as the other scripts here write it).
"""

import json
import os

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf


@hydra.main(version_base=None, config_path="hydra_conf", config_name="config")
def main(cfg: DictConfig) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(cfg.seed)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    data = torch.Generator().manual_seed(cfg.seed + rank)
    for _ in range(cfg.steps):
        x = torch.randn(16, 8, generator=data)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hydra_cfg = HydraConfig.get()
    seen = {"job_name": hydra_cfg.job.name, "overrides": list(hydra_cfg.overrides.task), "cwd": os.getcwd(),
            "output_dir": hydra_cfg.runtime.output_dir, "config": OmegaConf.to_container(cfg)}
    with open(os.path.join(cfg.out, f"seen-{rank}.json"), "w") as f:
        json.dump(seen, f)
    if rank == 0:
        params = {name: p.detach().flatten().tolist() for name, p in model.module.named_parameters()}
        checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
        with open(os.path.join(cfg.out, "result.json"), "w") as f:
            json.dump({"checksum": checksum, "params": params}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
