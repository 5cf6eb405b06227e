"""Paged KV block manager: plain ints (ids, ref counts, hashes), no tensors."""
