"""Small helpers every stage may use; they import no other part of energysweep. Its modules:
docs/architecture.md.
"""
