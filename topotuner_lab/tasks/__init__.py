"""Tasks: how a data set's rows become prompts and targets, and where the data is read from."""
