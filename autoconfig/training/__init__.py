"""Training prediction: the plan space, activation and memory model, step time,
software stacks, and the search that prunes and ranks plans."""
