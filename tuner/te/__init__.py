"""Tensor expressions and the operator library."""
