"""The capacity search: the most load of a workload that meets an objective, bracketed by the prediction."""
