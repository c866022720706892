"""Integration fixtures: the real local Slurm cluster (see cluster/slurm-local.sh)."""

from slurm_fixtures import slurm_cluster  # noqa: F401  (a session fixture)
