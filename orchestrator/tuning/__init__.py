"""Ray Tune sweeps of a compatibility method's hyperparameters (``orchestrator tune FILE``).

config.py (the tune file), space.py (search space, searcher, scheduler), objective.py (the scalar
Tune optimises, constraints, Pareto front), trial.py (one trial: train + evaluate per epoch),
results.py (table, plot, best generation block, lineage), saved_state.py (whether an interrupted
sweep's saved state is whole) and sweep.py (the whole sweep).
"""
