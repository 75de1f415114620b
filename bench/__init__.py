"""Benchmarks, each printing ratios against a peer measured in the same run."""
