"""`seqrec tune`: an Optuna search over a retriever config, on validation only.

    space.py   the declared search space of each backbone family
    study.py   the study (TPE, pruning, sqlite storage), one trial = one training run, the final test
    report.py  what a search writes: best.yaml, the trials table (md + csv), the history plot
"""
