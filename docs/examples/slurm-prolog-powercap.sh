#!/bin/bash
# Slurm Prolog (runs as root on each compute node before a job): set the GPU power limit a job
# asks for with --constraint=powercap_<W>w (energysweep: gpu.power_limit_method slurm-prolog),
# remembering each GPU's previous limit for the Epilog (slurm-epilog-powercap.sh).
#
# Install: Prolog=/etc/slurm/prolog.d/energysweep-powercap.sh in slurm.conf, and one node
# Feature per limit you allow (Feature=powercap_300w,powercap_400w,...). Slurm gives the Prolog
# SLURM_JOB_ID, SLURM_JOB_CONSTRAINTS and SLURM_JOB_GPUS (the node's GPU indices, NVML order when
# gres.conf lists /dev/nvidiaN in order).
#
# Exit 0 even when a limit cannot be set: a failing Prolog drains the node and requeues the job.
# The job reads the enforced limit back and flags its points (cap_not_applied) instead.
PATH=/usr/bin:/bin
SMI=${NVIDIA_SMI:-/usr/bin/nvidia-smi}
STATE=${SLURM_POWERCAP_STATE:-/var/spool/slurm-powercap}
watts=$(printf '%s' "${SLURM_JOB_CONSTRAINTS:-}" | grep -oE 'powercap_[0-9]+w' | head -n1 | tr -dc '0-9')
[ -n "$watts" ] && [ -n "${SLURM_JOB_GPUS:-}" ] || exit 0
mkdir -p "$STATE" && chmod 700 "$STATE"
record="$STATE/$SLURM_JOB_ID"
[ -e "$record" ] && exit 0 # already set for this job (a second Prolog run must not overwrite)
for gpu in ${SLURM_JOB_GPUS//,/ }; do
    old=$("$SMI" -i "$gpu" --query-gpu=power.limit --format=csv,noheader,nounits) || continue
    # Remember first, then set: the Epilog restores whatever was recorded.
    printf '%s %s\n' "$gpu" "${old%.*}" >> "$record"
    "$SMI" -i "$gpu" -pl "$watts" >/dev/null 2>&1 ||
        logger -t slurm-powercap "job $SLURM_JOB_ID: could not set GPU $gpu to $watts W"
done
exit 0
