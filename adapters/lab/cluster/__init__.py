"""Many replicas behind one KV-aware router: cluster indexes, load, policies, faults.

N simulated engine replicas (each the arrival-time replica of :mod:`..sim` with its own
index and capacity) publish KV events with sequence numbers; a router keeps a cluster
index of which worker holds which block, tracks load with reservations, and routes
each request with a policy. Runs in-process in virtual time (deterministic) or with
one Ray actor per replica.
"""
