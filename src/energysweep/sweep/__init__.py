"""Config -> a validated grid of jobs, with every config check. Runs when the workflow loads (no
torch is imported). Its modules: docs/architecture.md.
"""
