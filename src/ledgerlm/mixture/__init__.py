"""Data mixtures: how much of each domain a run sees.

``plan`` the expected tokens and exposure (epochs) of each domain for a budget;
``schedule`` the weights in force at each point of a run (stages); ``regress`` the
regression from mixture weights to a loss and the mixture it recommends; ``search``
the proxy-trial designs (Dirichlet draws around the natural mixture, DoReMi).
"""
