#!/bin/bash
# Slurm Epilog (runs as root on each compute node after a job, however it ended): put back the
# power limits slurm-prolog-powercap.sh recorded for this job.
PATH=/usr/bin:/bin
SMI=${NVIDIA_SMI:-/usr/bin/nvidia-smi}
record="${SLURM_POWERCAP_STATE:-/var/spool/slurm-powercap}/${SLURM_JOB_ID:-none}"
[ -f "$record" ] || exit 0
while read -r gpu old; do
    "$SMI" -i "$gpu" -pl "$old" >/dev/null 2>&1 ||
        logger -t slurm-powercap "job $SLURM_JOB_ID: could not restore GPU $gpu to $old W"
done < "$record"
rm -f "$record"
exit 0
