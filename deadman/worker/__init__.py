"""The worker: producer (claims), executor (runs), completer (batches results),
heartbeat (renews leases), process (wires one worker process), fleet (supervises N).
"""
