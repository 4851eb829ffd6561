"""The stages (reader, local shuffle, map, batch, map-and-batch into shared memory) and the worker pool."""
