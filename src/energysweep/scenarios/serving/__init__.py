"""The ``serving`` scenario: energy per request of an OpenAI-compatible server under load.

:mod:`.scenario` runs a job's load levels against its server; :mod:`.load` is one load run
(arrivals, the steady-state window, the drain), :mod:`.edges` what the window reads at its two
edges (off the load's event loop), :mod:`.client` vLLM's load generator and the client's
safeguards, :mod:`.probes` what a window reads besides the energy counters (the server's CPU
time, queue and own request count), :mod:`.stats` and :mod:`.rows` a window's figures and rows.
"""
