"""Ports of a job's sockets: concurrent jobs on one node must never share one.

A multi-node rendezvous, vLLM's ``VLLM_PORT`` and a serving job's server port are derived from
the Slurm job id (distinct jobs running together have nearby ids, hence distinct ports), or are a
free port outside Slurm.
"""

from __future__ import annotations

PORT_BASE = 15000
PORT_SPAN = 15000  # [15000, 30000): below the Linux ephemeral range (32768+)
# vLLM's own sockets start at VLLM_PORT and step upwards past busy ports, so each job gets a
# block of this many ports in [5000, 15000), apart from the rendezvous range above.
VLLM_PORT_BASE = 5000
VLLM_PORT_BLOCK = 10
VLLM_PORT_SLOTS = 1000
# A serving job's OpenAI-compatible server listens in [30000, 32768): apart from both ranges
# above and below the ephemeral range.
SERVER_PORT_BASE = 30000
SERVER_PORT_SPAN = 2768


def rendezvous_port(job_id: str | int) -> int:
    """A port for this job's rendezvous, derived from the (Slurm) job id."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def vllm_port(job_id: str | int) -> int:
    """``VLLM_PORT`` of a Slurm job: its own block of ports, derived from the job id."""
    return VLLM_PORT_BASE + (int(job_id) % VLLM_PORT_SLOTS) * VLLM_PORT_BLOCK


def server_port(job_id: str | int) -> int:
    """The port of a Slurm job's serving server (127.0.0.1), derived from the job id."""
    return SERVER_PORT_BASE + int(job_id) % SERVER_PORT_SPAN


def free_port() -> int:
    """A port that was free a moment ago (outside Slurm, where there is no job id)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
