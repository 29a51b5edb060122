"""A torchrun-style script whose ranks start processes of their own: a child, a grandchild through a shell, and a
child in a session of its own (as a daemonising tool does); each rank writes their pids to OUT/pids-RANK, then
waits for the job to be killed.  python children.py OUT"""

import os
import subprocess
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
out = sys.argv[1]
child = subprocess.Popen(["sleep", "300"])
shell = subprocess.Popen(["sh", "-c", f"sleep 301 & echo $! > {out}/grandchild-{rank}; wait"])
daemon = subprocess.Popen(["sleep", "302"], start_new_session=True)
while not os.path.exists(f"{out}/grandchild-{rank}") or not open(f"{out}/grandchild-{rank}").read().strip():
    time.sleep(0.05)
grandchild = int(open(f"{out}/grandchild-{rank}").read())
with open(f"{out}/pids-{rank}.tmp", "w") as f:
    f.write(" ".join(map(str, (os.getpid(), child.pid, shell.pid, grandchild, daemon.pid))))
os.rename(f"{out}/pids-{rank}.tmp", f"{out}/pids-{rank}")
time.sleep(300)
