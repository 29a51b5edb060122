"""The two things we take from submitit that it offers no public API for (read from 1.5.4's source), in one place.

- expand_nodelist: SLURM's hostlist syntax. submitit's only public route to its parser is
  `SlurmJobEnvironment().hostnames`, which reads os.environ's SLURM_JOB_NODELIST (and answers this host's
  name when it is unset); we parse the value of the mapping we are handed and never write os.environ.
  (`scontrol show hostnames` is SLURM's own, but costs a subprocess per task, and is absent where units run.)
- sbatch_script: the sbatch text an executor would submit. submitit renders it only inside submit()
  (PicklingExecutor._submit_command writes it and runs sbatch at once); --dry-run shows that text unsubmitted.

tests/test_submitit_private.py pins both (node-list forms, the script's lines) and that no other module
touches submitit's private names, so a submitit release that changes them fails there, not in a user's job;
setup.cfg keeps submitit below 1.6 for the same reason.
"""

from __future__ import annotations

from typing import Any, List


def expand_nodelist(text: str) -> List[str]:
    """'rack[1-2]-node[01-02],gpu7' -> rack1-node01, rack1-node02, rack2-node01, rack2-node02, gpu7.

    ValueError for text that is not a SLURM host list.
    """
    # Imported here: submitit costs 0.4 s of start-up, and only a task inside a SLURM job parses a node list.
    from submitit.slurm.slurm import SlurmParseException, _parse_node_list

    try:
        return [host for host in _parse_node_list(text) if host]
    except SlurmParseException as e:
        raise ValueError(str(e.args[0]) if e.args else str(e)) from e


def sbatch_script(executor: Any) -> str:
    """The sbatch script `executor` (a submitit.SlurmExecutor) would submit now; nothing is written or run."""
    return str(executor._make_submission_file_text(executor._submitit_command_str, uid="dry-run"))
