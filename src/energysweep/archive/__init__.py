"""A sweep as a citable, re-runnable archive, and its figures in public units.

- :mod:`~energysweep.archive.contents`: what a crate holds (:data:`~.contents.REQUIRED`);
- :mod:`~energysweep.archive.methods`: its derived files (methods, validity, jobs, code version);
- :mod:`~energysweep.archive.crate`: writes the Workflow Run RO-Crate with ro-crate-py and
  reads it back (:func:`~.crate.archive`, the `archive` rule's step);
- :mod:`~energysweep.archive.readback`: reads it back and refuses a bad one, naming what is
  missing, and checks the Workflow Run Crate profile's required entities;
- :mod:`~energysweep.archive.reproduce` and :mod:`~energysweep.archive.compare`: re-run a crate's
  sweep beside ``results/`` and put both side by side;
- :mod:`~energysweep.archive.exports`: ML.ENERGY, AI Energy Score and MLCommons tables.
"""
