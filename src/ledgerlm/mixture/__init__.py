"""Data mixtures: how much of each domain a run sees.

``plan`` the expected tokens and exposure (epochs) of each domain for a budget;
``schedule`` the weights in force at each point of a run (stages); ``dirichlet`` the
Dirichlet draws of mixtures around a center (proxy trials, candidates) and their
concentration; ``table`` a CSV table of proxy runs (weights and results); ``regress``
the regression from mixture weights to a loss; ``recommend`` the mixture it
recommends, and when that is weak evidence; ``doremi`` the DoReMi reweighting.
"""
