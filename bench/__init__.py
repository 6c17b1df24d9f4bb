"""Deadman's benchmarks, side by side with pgqueuer and procrastinate (``make bench``)."""
