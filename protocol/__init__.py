"""The contract between the HTTP world, the gateway and the workers.

Imports neither `gateway` nor `workers`; both of them import this.
"""
