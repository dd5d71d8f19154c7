"""The lab: the one package that joins the stages (data, tokens, model, train, ledger,
scaling) into runs, resumes, continued pretraining, sweeps, exports and scaling fits.

Components never import it; the CLI calls it.
"""
