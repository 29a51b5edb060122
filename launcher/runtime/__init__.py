"""The worker-side contract and the run records' formats (schema.py): the only launcher code trainers (and users'
scripts) import."""
