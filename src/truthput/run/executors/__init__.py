"""Where a run's server starts execute: on this machine (local) or on a Ray cluster (ray).

The plan, the trial pipeline and the results model are the same either way; an executor only
places each server start and brings its writes back to the one results store.
"""
