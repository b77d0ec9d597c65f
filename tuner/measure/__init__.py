"""Measuring candidates: build them (builder, cuda_build), check and time them on this host
(runner, worker, cuda_worker), on a Dask cluster (cluster), or replay a log's costs (replay); the
Runner protocol and make_runner (runners). This file imports nothing, so a measurement process
started as `python -m tuner.measure.worker` loads only what it uses."""
