"""The on-disk contract: keys, msgpack records, metadata, shards, checksums, the stored JPEG's restart index."""
