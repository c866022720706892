"""Small helpers every stage may use: the test fault hook (:mod:`.faults`), JSON objects from
text (:mod:`.jsonobj`), the OOM test (:mod:`.oom`) and the Snakemake steps' log (:mod:`.steplog`).
They import no other part of energysweep.
"""
