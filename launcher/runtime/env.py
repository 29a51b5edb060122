"""Every LAUNCHER_* environment variable, named once: what the launcher tells a worker, and the
test hooks a worker reads. Nothing else of the project spells these names.
"""

# Set for every worker while the hang watchdog is on (watchdog.timeout_s > 0; docs/torchrun.md,
# Differences from torchrun): where the heartbeat files go, and the timeout a heartbeat must beat.
RUN_DIR = "LAUNCHER_RUN_DIR"
WATCHDOG_TIMEOUT_S = "LAUNCHER_WATCHDOG_TIMEOUT_S"
# When the user's command started (seconds since the epoch): the built-in trainer's time to first
# step. The agent's own bookkeeping: a script never sees it.
START_TIME = "LAUNCHER_START_TIME"
# This attempt's number as the launcher counts attempts (launcher.agent.elastic): every start of the
# workers, a failure's restart or an elastic membership change alike. Names the attempt's rank logs and
# the built-in trainer's records; scripts never see it (they get torch's TORCHELASTIC_RESTART_COUNT).
ATTEMPT = "LAUNCHER_ATTEMPT"
# Test hooks of the built-in trainer (trainers.faults.inject, trainers.faults.hang).
INJECT_FAULT = "LAUNCHER_INJECT_FAULT"
TEST_HANG_RANK = "LAUNCHER_TEST_HANG_RANK"
TEST_HANG_STEP = "LAUNCHER_TEST_HANG_STEP"
TEST_SAVE_DELAY_S = "LAUNCHER_TEST_SAVE_DELAY_S"
# The test hooks again, as one table: what --cluster ray forwards to its node agents through the job's Ray
# runtime_env (launcher.backends.ray.job), since Ray gives an actor its raylet's environment, not the submitter's.
TEST_HOOKS = (INJECT_FAULT, TEST_HANG_RANK, TEST_HANG_STEP, TEST_SAVE_DELAY_S)
# The job's rendezvous secret (docs/security.md): the node agents sign what they share through the
# rendezvous store with it. Read by the agent (launcher.config.rdzv_secret) and never passed to a worker.
RDZV_SECRET = "LAUNCHER_RDZV_SECRET"
# Set by launcher.launch() for the child launcher of a local job: a file (in the call's own folder) the launcher
# creates once the job completed, summary.json written and its last line printed; launch() returns then, while
# the launcher ends the job's W&B run and exits. Never passed to a worker.
RELEASE = "LAUNCHER_RELEASE"
