"""The worker-side contract: the only launcher code trainers (and users' scripts) import."""
