"""Before launch: the model's shape, the KV and memory budget on a GPU, and whether it fits."""
