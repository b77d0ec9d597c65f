"""The native toolchain: the C compiler and its private cache (cc), nvcc (nvcc), loading what it built
(library), and worker processes (process). It knows nothing of kernels, schedules or models."""
